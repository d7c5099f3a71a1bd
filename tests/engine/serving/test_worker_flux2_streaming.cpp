// FLUX.2 through the worker with its template-keyed entry only in the disk tier: the entry
// streams block by block as each step reaches it (the I/O overlapping the blocks before), and
// every block loads (FLUX.2 recomputes none, whatever the plan or the test seam asks). The
// result equals the edit on the RAM-resident entry bit for bit, with and without guidance
// (whose null-prompt half reads the same streamed slabs).
#include "support/catch.h"

#include "flux2_serving_fixture.h"
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

}  // namespace

TEST_CASE("FLUX.2: an entry only on disk streams through the worker, every block loaded, equal to the resident edit",
          "[flux2-serving][cache]") {
  Flux2Serving f;
  test::TempDir cache_dir("infill-flux2-stream");
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
  {
    auto writer = test::ServingFixture::open_disk_store(cache_dir.path(), 1);  // too small for RAM: straight to disk
    REQUIRE(writer->put(key, *entry).ok());
  }
  auto disk_only = [&] {
    auto store = test::ServingFixture::open_disk_store(cache_dir.path(), 64 << 20);
    REQUIRE(store->tier_of(key) == Tier::kDisk);
    return store;
  };
  const int blocks = f.model->streamable_blocks();
  REQUIRE(blocks == f.model->parts().transformer->config().depth());
  CHECK(f.model->max_recompute_blocks() == 0);

  SECTION("the plan decides, capped at no recompute") {
    auto store = disk_only();
    const RequestResult r = edit_on(f, store, params);
    INFO(r.status.to_string());
    REQUIRE(r.state == RequestState::kDone);
    CHECK(r.metrics.streamed);
    CHECK(r.output.streamed_cache);
    CHECK(r.output.cache_mode == "template_keyed");
    CHECK(r.metrics.blocks_loaded == blocks);
    CHECK(r.metrics.blocks_recomputed == 0);
    CHECK((r.output.image.data == resident.output.image.data));
    CHECK(store->tier_of(key) == Tier::kRam);  // promoted after the result
  }
  SECTION("a recompute the model cannot do is not asked of it") {
    WorkerOptions w;
    w.force_recompute_blocks = [](int n) { return n - 1; };
    const RequestResult r = edit_on(f, disk_only(), params, w);
    INFO(r.status.to_string());
    REQUIRE(r.state == RequestState::kDone);
    CHECK(r.metrics.blocks_loaded == blocks);
    CHECK(r.metrics.blocks_recomputed == 0);
    CHECK((r.output.image.data == resident.output.image.data));
  }
  SECTION("the model refuses a recomputed prefix, naming it") {
    auto store = disk_only();
    auto layout = store->layout_of(key);
    REQUIRE(layout.has_value());
    auto streamed = std::make_shared<StreamedKvSource>(store, key, *layout);
    auto session = f.model->create_streamed_session(f.tmpl, params, streamed, 2);
    REQUIRE_FALSE(session.ok());
    CHECK(session.status().message().find("2 recomputed blocks") != std::string::npos);
  }
}
