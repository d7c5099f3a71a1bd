// Through the worker: a template whose entry is only in the disk tier streams it under the
// load plan. The result's metrics say how many blocks loaded and how many were recomputed;
// loading every block gives the RAM-resident edit bit for bit, recomputing some gives the
// resident edit forced to the same plan; reading the entry whole (no streaming) gives the
// resident edit too; a damaged file fails the edit with the read error and the worker goes on.
#include "support/catch.h"

#include <map>
#include <mutex>

#include "request_collector.h"
#include "support/damage_files.h"
#include "serving_fixture.h"

using namespace infill;
using infill::test::ServingFixture;
using Collector = infill::test::RequestCollector;

namespace {


// One edit through a one-worker runtime on `store`; the runtime is gone when this returns.
RequestResult edit_through_worker(const ServingFixture& f, std::shared_ptr<ActivationStore> store, const EditParams& params,
                                  WorkerOptions worker = {}) {
  Collector c;
  RuntimeOptions o;
  o.worker = std::move(worker);
  auto rt = ServingRuntime::create(f.model, std::move(store), f.cost, o);
  REQUIRE(rt.ok());
  ServingRequest r;
  r.id = 1;
  r.client_id = 1;
  r.tmpl = f.templates[0];
  r.params = params;
  r.encode_result = false;
  r.on_complete = c.callback();
  REQUIRE((*rt)->submit(std::move(r)).ok());
  REQUIRE((*rt)->drain(60000));
  return c.only(1);
}


bool same_pixels(const PixelImage& a, const PixelImage& b) {
  return a.width == b.width && a.height == b.height && a.channels == b.channels && a.data == b.data;
}

// The resident entry read under a fixed plan, on the calling thread (no worker).
Result<EditOutput> resident_forced(const ServingFixture& f, const EditParams& params,
                                   std::shared_ptr<const ActivationEntry> entry, int recompute_blocks) {
  auto session = EditSession::create(f.model, f.templates[0], params, CacheSource{std::move(entry), nullptr, recompute_blocks});
  if (!session.ok()) return session.status();
  while (!(*session)->done()) INFILL_RETURN_IF_ERROR((*session)->apply(f.model->dit.forward((*session)->segments())));
  return (*session)->finish();
}

}  // namespace

TEST_CASE("an entry only on disk streams through the worker under the load plan", "[serving][worker][cache]") {
  ServingFixture f;
  test::TempDir cache_dir("infill-worker-stream");
  const EditParams params = f.params(ServingFixture::rect_mask(8, 8, 20, 16), 5);
  const int depth = f.model->manifest.dit.depth;
  REQUIRE(depth >= 2);
  EditPipeline pipeline(f.model, nullptr);
  auto entry = pipeline.prepare(*f.templates[0], params.schedule);
  REQUIRE(entry.ok());
  const ActivationKey key = make_cache_key(*f.model, *f.templates[0], params.schedule);
  {
    auto writer = test::ServingFixture::open_disk_store(cache_dir.path(), 1);  // too small for RAM: straight to disk
    REQUIRE(writer->put(key, *entry).ok());
  }
  // A store opened on the folder holds the entry on disk only, as after a restart.
  auto disk_only = [&] {
    auto store = test::ServingFixture::open_disk_store(cache_dir.path(), 64 << 20);
    REQUIRE(store->tier_of(key) == Tier::kDisk);
    return store;
  };
  auto resident_store = ServingFixture::new_store();
  REQUIRE(resident_store->put(key, *entry).ok());
  const RequestResult resident = edit_through_worker(f, resident_store, params);
  REQUIRE(resident.state == RequestState::kDone);
  CHECK_FALSE(resident.metrics.streamed);
  CHECK_FALSE(resident.output.streamed_cache);

  SECTION("every block loaded: the resident edit bit for bit") {
    WorkerOptions w;
    w.force_recompute_blocks = [](int) { return 0; };
    auto store = disk_only();
    const RequestResult r = edit_through_worker(f, store, params, w);
    INFO(r.status.to_string());
    REQUIRE(r.state == RequestState::kDone);
    CHECK(r.metrics.streamed);
    CHECK(r.output.streamed_cache);
    CHECK(r.metrics.blocks_loaded == depth);
    CHECK(r.metrics.blocks_recomputed == 0);
    CHECK(same_pixels(r.output.image, resident.output.image));
    // Promoted after the result, for the template's next edits.
    CHECK(store->tier_of(key) == Tier::kRam);
  }
  SECTION("leading blocks recomputed: the resident edit forced to the same plan, bit for bit") {
    WorkerOptions w;
    w.force_recompute_blocks = [](int blocks) { return blocks - 1; };
    const RequestResult r = edit_through_worker(f, disk_only(), params, w);
    INFO(r.status.to_string());
    REQUIRE(r.state == RequestState::kDone);
    CHECK(r.metrics.streamed);
    CHECK(r.metrics.blocks_loaded == 1);
    CHECK(r.metrics.blocks_recomputed == depth - 1);
    auto forced = resident_forced(f, params, *entry, depth - 1);
    REQUIRE(forced.ok());
    CHECK(same_pixels(r.output.image, forced->image));
  }
  SECTION("the plan decides: it is consulted and recorded") {
    const RequestResult r = edit_through_worker(f, disk_only(), params);
    INFO(r.status.to_string());
    REQUIRE(r.state == RequestState::kDone);
    CHECK(r.metrics.streamed);
    CHECK(r.metrics.blocks_loaded + r.metrics.blocks_recomputed == depth);
    CHECK(r.output.recomputed_blocks == r.metrics.blocks_recomputed);
    auto forced = resident_forced(f, params, *entry, r.metrics.blocks_recomputed);
    REQUIRE(forced.ok());
    CHECK(same_pixels(r.output.image, forced->image));
  }
  SECTION("streaming off: the entry is read whole, then the resident edit") {
    WorkerOptions w;
    w.stream_from_disk = false;
    const RequestResult r = edit_through_worker(f, disk_only(), params, w);
    REQUIRE(r.state == RequestState::kDone);
    CHECK_FALSE(r.metrics.streamed);
    CHECK(same_pixels(r.output.image, resident.output.image));
  }
  SECTION("a damaged file fails the edit with the read error; the next edit computes afresh") {
    auto store = disk_only();
    const int damaged = test::flip_byte_near_end_of_files(cache_dir.path());
    REQUIRE(damaged == 1);
    WorkerOptions w;
    w.force_recompute_blocks = [](int) { return 0; };
    const RequestResult broken = edit_through_worker(f, store, params, w);
    CHECK(broken.state == RequestState::kFailed);
    INFO(broken.status.to_string());
    // The error names the file and the slab.
    CHECK(broken.status.code() == ErrorCode::kCorruptData);
    CHECK(broken.status.message().find(".iact: checksum mismatch in slab") != std::string::npos);
    CHECK(broken.metrics.streamed);
    // Nothing damaged is used again: the next edit of the template prepares it afresh.
    const RequestResult again = edit_through_worker(f, store, params, w);
    INFO(again.status.to_string());
    REQUIRE(again.state == RequestState::kDone);
    CHECK_FALSE(again.metrics.streamed);
    CHECK(same_pixels(again.output.image, resident.output.image));
  }
}
