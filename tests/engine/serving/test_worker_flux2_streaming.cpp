// FLUX.2 through the worker with its template-keyed entry only in the disk tier: the entry
// streams block by block as each step reaches it (the I/O overlapping the blocks before), the
// load plan choosing how many leading blocks to recompute on every token instead. With every
// block loaded the result equals the edit on the RAM-resident entry bit for bit; with a
// recomputed prefix it equals the resident edit forced to the same plan. With and without
// guidance (whose null-prompt half reads the same streamed slabs).
#include "support/catch.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "flux2_serving_fixture.h"
#include "pipeline/pinned_host_memory.h"
#include "support/cuda_device.h"
#include "support/temp_dir.h"

using namespace infill;
using infill::test::Flux2Serving;

namespace {


RequestResult edit_on(const Flux2Serving& f, std::shared_ptr<ActivationStore> store, const EditParams& params,
                      WorkerOptions worker = {}) {
  RuntimeOptions o;
  o.worker = std::move(worker);
  auto rt = ServingRuntime::create(f.model, std::move(store), test::fixed_cost_model(), std::move(o));
  REQUIRE(rt.ok());
  return test::submit(**rt, 1, f.tmpl, params).get();
}

// `e` with the K and V of blocks [0, blocks) at every step set to fp16's largest value: an
// edit that read any of them would attend to nothing else.
std::shared_ptr<const ActivationEntry> poisoned(const ActivationEntry& e, int blocks) {
  const ActivationLayout& l = e.layout();
  auto copy = std::make_shared<ActivationEntry>(l);
  std::memcpy(copy->data(), e.data(), l.total_bytes());
  for (int step = 0; step < l.steps; ++step) {
    for (int b = 0; b < blocks; ++b) {
      std::fill_n(copy->k(step, b), l.slab_elements(), uint16_t{0x7BFF});
      std::fill_n(copy->v(step, b), l.slab_elements(), uint16_t{0x7BFF});
    }
  }
  return copy;
}

}  // namespace

TEST_CASE("FLUX.2: an entry only on disk streams through the worker under the load plan", "[flux2-serving][cache]") {
  Flux2Serving f;
  const bool guided = GENERATE(false, true);
  INFO("guidance " << (guided ? "on" : "off"));
  EditParams params = f.params("a dark blue patch", 5);
  if (guided) params.guidance_scale = 3.0;
  // The worker prepares the template-keyed entry into the fixture's RAM store on a first edit.
  const RequestResult first = edit_on(f, f.store, params);
  REQUIRE(first.state == RequestState::kDone);
  const ActivationKey key = f.model->cache_key(*f.tmpl, params);
  auto entry = f.store->get(key);
  REQUIRE(entry.ok());
  const RequestResult resident = edit_on(f, f.store, params);
  REQUIRE(resident.state == RequestState::kDone);
  CHECK(resident.output.cache_mode == "template_keyed");
  CHECK_FALSE(resident.metrics.streamed);
  const int blocks = f.model->streamable_blocks();
  REQUIRE(blocks == f.model->parts().transformer->config().depth());
  CHECK(f.model->max_recompute_blocks() == blocks);
  // A store on a fresh folder holding `e` on disk only, as after a restart.
  std::vector<std::unique_ptr<test::TempDir>> dirs;
  auto disk_only = [&](std::shared_ptr<const ActivationEntry> e) {
    dirs.push_back(std::make_unique<test::TempDir>("infill-flux2-stream"));
    {
      auto writer = test::ServingFixture::open_disk_store(dirs.back()->path(), 1);  // too small for RAM: straight to disk
      REQUIRE(writer->put(key, std::move(e)).ok());
    }
    auto store = test::ServingFixture::open_disk_store(dirs.back()->path(), 64 << 20);
    REQUIRE(store->tier_of(key) == Tier::kDisk);
    return store;
  };

  SECTION("every block loaded: the resident edit, bit for bit") {
    WorkerOptions w;
    w.force_recompute_blocks = [](int) { return 0; };
    auto store = disk_only(*entry);
    const RequestResult r = edit_on(f, store, params, w);
    INFO(r.status.to_string());
    REQUIRE(r.state == RequestState::kDone);
    CHECK(r.metrics.streamed);
    CHECK(r.output.streamed_cache);
    CHECK(r.output.cache_mode == "template_keyed");
    CHECK(r.metrics.blocks_loaded == blocks);
    CHECK(r.metrics.blocks_recomputed == 0);
    CHECK((r.output.image.data == resident.output.image.data));
    CHECK(store->tier_of(key) == Tier::kRam);  // promoted after the result
    // A loaded block whose K/V were wrong would show in the image (what the next section
    // relies on): the same edit on an entry with block 0 poisoned differs.
    const RequestResult wrong = edit_on(f, disk_only(poisoned(**entry, 1)), params, w);
    REQUIRE(wrong.state == RequestState::kDone);
    CHECK_FALSE((wrong.output.image.data == resident.output.image.data));
  }
  SECTION("leading blocks recomputed (in the double and the single blocks): never read, the resident edit forced to the same plan") {
    const int double_blocks = f.model->parts().transformer->config().double_blocks;
    for (const int recompute : {1, double_blocks + 1, blocks}) {
      INFO("recomputed blocks " << recompute);
      WorkerOptions w;
      w.force_recompute_blocks = [recompute](int) { return recompute; };
      // The recomputed blocks are poisoned on disk: reading any of them would change the image.
      const RequestResult r = edit_on(f, disk_only(poisoned(**entry, recompute)), params, w);
      INFO(r.status.to_string());
      REQUIRE(r.state == RequestState::kDone);
      CHECK(r.metrics.streamed);
      CHECK(r.metrics.blocks_recomputed == recompute);
      CHECK(r.metrics.blocks_loaded == blocks - recompute);
      auto forced = f.edit_forced(params, *entry, recompute);
      REQUIRE(forced.ok());
      CHECK((r.output.image.data == forced->image.data));
    }
  }
  SECTION("the plan decides; its choice is in the metrics and the result follows it") {
    const RequestResult r = edit_on(f, disk_only(*entry), params);
    INFO(r.status.to_string());
    REQUIRE(r.state == RequestState::kDone);
    CHECK(r.metrics.streamed);
    CHECK(r.metrics.blocks_loaded + r.metrics.blocks_recomputed == blocks);
    auto forced = f.edit_forced(params, *entry, r.metrics.blocks_recomputed);
    REQUIRE(forced.ok());
    CHECK((r.output.image.data == forced->image.data));
  }
  SECTION("a prefix longer than the model is refused, naming it") {
    auto store = disk_only(*entry);
    auto layout = store->layout_of(key);
    REQUIRE(layout.has_value());
    auto streamed = std::make_shared<StreamedKvSource>(store, key, *layout);
    auto session = f.model->create_streamed_session(f.tmpl, params, streamed, blocks + 1);
    REQUIRE_FALSE(session.ok());
    CHECK(session.status().message().find("recompute_blocks is " + std::to_string(blocks + 1)) != std::string::npos);
  }
}

TEST_CASE("FLUX.2 on CUDA: an entry only on disk streams to the GPU through pinned slabs, equal to the resident edit",
          "[cuda][flux2-serving]") {
  const ComputeDevice cuda = test::require_cuda_or_skip();
  Flux2Serving f(cuda, at::kBFloat16);
  test::TempDir cache_dir("infill-flux2-stream-cuda");
  const bool guided = GENERATE(false, true);
  INFO("guidance " << (guided ? "on" : "off"));
  EditParams params = f.params("a dark blue patch", 5);
  if (guided) params.guidance_scale = 3.0;
  REQUIRE(edit_on(f, f.store, params).state == RequestState::kDone);  // prepares the entry
  const ActivationKey key = f.model->cache_key(*f.tmpl, params);
  auto entry = f.store->get(key);
  REQUIRE(entry.ok());
  const RequestResult resident = edit_on(f, f.store, params);  // reads the device tier
  REQUIRE(resident.state == RequestState::kDone);
  {
    auto writer = test::ServingFixture::open_disk_store(cache_dir.path(), 1);
    REQUIRE(writer->put(key, *entry).ok());
  }
  const int blocks = f.model->streamable_blocks();
  for (const int recompute : {0, 2}) {
    INFO("recomputed blocks " << recompute);
    auto store = test::ServingFixture::open_disk_store(cache_dir.path(), 64 << 20);
    REQUIRE(store->tier_of(key) == Tier::kDisk);
    WorkerOptions w;
    w.force_recompute_blocks = [recompute](int) { return recompute; };
    const RequestResult r = edit_on(f, store, params, w);
    INFO(r.status.to_string());
    REQUIRE(r.state == RequestState::kDone);
    CHECK(r.metrics.streamed);
    CHECK(r.metrics.blocks_loaded == blocks - recompute);
    if (recompute == 0) {
      CHECK((r.output.image.data == resident.output.image.data));
    } else {
      auto forced = f.edit_forced(params, *entry, recompute);
      REQUIRE(forced.ok());
      CHECK((r.output.image.data == forced->image.data));
    }
  }
  // The slabs a GPU worker streams into are pinned: none fell back to pageable memory.
  CHECK(pinned_fallbacks() == 0);
}
