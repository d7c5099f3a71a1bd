// FLUX.2 on a GPU with a template-keyed entry in host memory that the device tier cannot hold:
// every step copies its blocks over the bus, and the worker's load plan weighs each block's
// copy (the bus speed measured when the model was made) against its recompute on every token.
// The result equals the edit forced to the same plan; an entry the tier holds is read there,
// whatever the plan. On the CPU nothing is copied and no plan is made.
#include "support/catch.h"

#include <memory>

#include "flux2_serving_fixture.h"
#include "support/cuda_device.h"

using namespace infill;
using infill::test::Flux2Serving;

namespace {

RequestResult edit_on(const Flux2Serving& f, const EditParams& params) {
  auto rt = f.runtime();
  return test::submit(*rt, 1, f.tmpl, params).get();
}

}  // namespace

TEST_CASE("FLUX.2 on the CPU: entries are read in place, no copy plan", "[flux2-serving][cache]") {
  Flux2Serving f;
  CHECK(f.model->host_to_device_bytes_per_ms() == 0.0);
  const EditParams params = f.params("a dark blue patch", 5);
  REQUIRE(edit_on(f, params).state == RequestState::kDone);  // prepares the entry
  const RequestResult r = edit_on(f, params);
  REQUIRE(r.state == RequestState::kDone);
  CHECK(r.output.cache_mode == "template_keyed");
  CHECK_FALSE(r.metrics.copied_to_device);
  CHECK_FALSE(r.output.copied_to_device);
  CHECK(r.metrics.blocks_loaded == 0);
  CHECK(r.metrics.blocks_recomputed == 0);
}

TEST_CASE("FLUX.2 on CUDA: an entry the device tier cannot hold is copied per block under the load plan",
          "[cuda][flux2-serving]") {
  const ComputeDevice cuda = test::require_cuda_or_skip();
  // tier_bytes 0: the tier takes nothing; bus 0: measured when the model is made.
  auto run = [&](int64_t tier_bytes, double bus) {
    Flux2Serving f(cuda, at::kBFloat16, [&](Flux2EditModelParts& p) {
      p.device_cache_bytes = tier_bytes;
      p.host_to_device_bytes_per_ms = bus;
    });
    const EditParams params = f.params("a dark blue patch", 5);
    REQUIRE(edit_on(f, params).state == RequestState::kDone);  // prepares the entry
    auto entry = f.store->get(f.model->cache_key(*f.tmpl, params));
    REQUIRE(entry.ok());
    const RequestResult r = edit_on(f, params);
    INFO(r.status.to_string());
    REQUIRE(r.state == RequestState::kDone);
    CHECK(r.output.cache_mode == "template_keyed");
    auto same_plan = f.edit_forced(params, *entry, r.metrics.blocks_recomputed);
    REQUIRE(same_plan.ok());
    CHECK((r.output.image.data == same_plan->image.data));
    return std::make_pair(r.metrics, f.model->host_to_device_bytes_per_ms());
  };
  const int blocks = test::tiny_flux2_config(96).depth();

  SECTION("the measured bus") {
    const auto [m, bus] = run(0, 0.0);
    WARN("host to " << cuda.name() << ": " << bus / 1e6 << " GB/s; plan: " << m.blocks_loaded << " blocks copied, "
                    << m.blocks_recomputed << " recomputed");
    CHECK(bus > 1e6);  // more than 1 GB/s on any PCIe or NVLink bus
    CHECK(m.copied_to_device);
    CHECK(m.blocks_loaded + m.blocks_recomputed == blocks);
  }
  SECTION("a crawling bus: every block recomputed") {
    const auto [m, bus] = run(0, 1.0);  // one byte per millisecond
    CHECK(bus == 1.0);
    CHECK(m.copied_to_device);
    CHECK(m.blocks_recomputed == blocks);
    CHECK(m.blocks_loaded == 0);
  }
  SECTION("an entry the tier holds is read there, whatever the bus") {
    const auto [m, bus] = run(int64_t{1} << 30, 1.0);
    CHECK_FALSE(m.copied_to_device);
    CHECK(m.blocks_recomputed == 0);
  }
}
