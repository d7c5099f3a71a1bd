// The adapter store's tiers (pipeline/adapter_store.h) with the bundled infill-tiny 2, a FLUX.2
// model: files on disk by id, the host tier (LRU within its byte budget: a file is read again
// only after eviction), the device tier of a GPU model (copies from the host tier, never a
// second file read). CPU models read the host form itself and have no device tier.
#include "support/catch.h"
#include "support/cuda_device.h"
#include "support/data_dirs.h"
#include "support/file_bytes.h"
#include "support/temp_dir.h"
#include "support/tiny_flux2.h"

#include <filesystem>
#include <fstream>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "model/flux2_transformer.h"
#include "pipeline/adapter_store.h"
#include "pipeline/flux2_edit_model.h"
#include "pipeline/load_edit_model.h"

using namespace infill;

namespace {

const std::string kModel = infill::test::source_path("resources/models/infill-tiny-2");

std::shared_ptr<const EditModel> bundled(const ComputeDevice& device = {}) {
  auto loaded = load_edit_model(kModel, device);
  REQUIRE(loaded.ok());
  return loaded->model;
}

const Flux2Config& config_of(const EditModel& model) {
  return static_cast<const Flux2EditModel&>(model).parts().transformer->config();
}

// Uploads a random LoRA of `rank` for `model`; its id.
std::string upload(AdapterStore& store, const EditModel& model, const test::TempDir& dir, uint64_t seed, int64_t rank = 4) {
  const std::string path = dir.file("lora-" + std::to_string(seed) + ".safetensors");
  test::write_random_lora(path, config_of(model), seed, rank);
  bool created = false;
  const std::vector<std::byte> bytes = test::file_bytes(path);
  auto added = store.add(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), "lora " + std::to_string(seed), model, created);
  REQUIRE(added.ok());
  CHECK(created);
  return added->id;
}

}  // namespace

TEST_CASE("The adapter store's host tier reads a file again only after its budget evicted it", "[pipeline][adapters]") {
  c10::InferenceMode guard;
  const auto model = bundled();
  test::TempDir dir;
  // One rank-4 adapter of this model, to size the budget: room for one, not two.
  int64_t one = 0;
  {
    auto probe = AdapterStore::open(dir.file("probe"), {int64_t{1} << 30, 0});
    REQUIRE(probe.ok());
    const std::string id = upload(**probe, *model, dir, 1);
    auto got = (*probe)->get(id, *model);
    REQUIRE(got.ok());
    one = (*got)->bytes();
  }
  REQUIRE(one > 0);
  auto opened = AdapterStore::open(dir.file("store"), {one + one / 2, 0});
  REQUIRE(opened.ok());
  AdapterStore& store = **opened;
  const std::string a = upload(store, *model, dir, 1);
  CHECK(store.ready(a, *model));  // the upload's reading is kept
  const std::string b = upload(store, *model, dir, 2);
  CHECK(store.ready(b, *model));
  CHECK_FALSE(store.ready(a, *model));  // b took its room
  AdapterStoreStats s = store.stats();
  CHECK(s.files == 2);
  CHECK(s.host.adapters == 1);
  CHECK(s.host.bytes == one);
  CHECK(s.host.evictions == 1);

  auto got_b = store.get(b, *model);
  REQUIRE(got_b.ok());
  CHECK(store.stats().host.hits == 1);
  CHECK(store.stats().host.misses == 0);
  auto got_a = store.get(a, *model);  // read from its file again
  REQUIRE(got_a.ok());
  CHECK((*got_a)->id == a);
  s = store.stats();
  CHECK(s.host.misses == 1);
  CHECK(s.host.evictions == 2);
  CHECK(store.ready(a, *model));
  auto again = store.get(a, *model);
  REQUIRE(again.ok());
  CHECK(again->get() == got_a->get());  // the same reading, not another
  CHECK(store.stats().host.hits == 2);

  SECTION("a CPU model reads the host form itself: no device tier") {
    CHECK((*again)->layers.begin()->second.down.device().is_cpu());
    CHECK(store.stats().device.bytes == 0);
    CHECK(store.stats().device.misses == 0);
  }
  SECTION("an adapter larger than the budget is returned, not kept") {
    const std::string big = upload(store, *model, dir, 3, /*rank=*/16);
    CHECK_FALSE(store.ready(big, *model));
    auto got = store.get(big, *model);
    REQUIRE(got.ok());
    CHECK((*got)->max_rank() == 16);
    CHECK_FALSE(store.ready(big, *model));
    CHECK(store.stats().host.bytes <= one + one / 2);
  }
  SECTION("removing an adapter drops it from every tier and its file") {
    REQUIRE(store.remove(a).ok());
    CHECK_FALSE(store.ready(a, *model));
    CHECK(store.stats().host.bytes == 0);
    auto gone = store.get(a, *model);
    REQUIRE_FALSE(gone.ok());
    CHECK(gone.status().code() == ErrorCode::kNotFound);
    CHECK_THAT(gone.status().message(), Catch::Contains(a));
    CHECK_FALSE(std::filesystem::exists(store.dir() + "/" + a + ".safetensors"));
  }
  SECTION("a file damaged on disk after its reading was evicted fails its own lookups, naming it") {
    std::filesystem::resize_file(store.dir() + "/" + b + ".safetensors", 100);
    REQUIRE_FALSE(store.ready(b, *model));
    auto damaged = store.get(b, *model);
    REQUIRE_FALSE(damaged.ok());
    CHECK_THAT(damaged.status().message(), Catch::Contains(b) && Catch::Contains(model->name()));
    CHECK(store.get(a, *model).ok());  // the store goes on serving
  }
}

TEST_CASE("A reopened store lists the files it kept and reads them for a model on first use", "[pipeline][adapters]") {
  c10::InferenceMode guard;
  const auto model = bundled();
  test::TempDir dir;
  std::string id;
  {
    auto store = AdapterStore::open(dir.file("store"), {});
    REQUIRE(store.ok());
    id = upload(**store, *model, dir, 7);
  }
  auto store = AdapterStore::open(dir.file("store"), {});
  REQUIRE(store.ok());
  const auto found = (*store)->find(id);
  REQUIRE(found);
  CHECK(found->name == "lora 7");
  CHECK(found->format.empty());  // not read yet
  CHECK_FALSE((*store)->ready(id, *model));
  auto got = (*store)->get(id, *model);
  REQUIRE(got.ok());
  CHECK((*store)->find(id)->format == "upstream");
  CHECK((*store)->find(id)->max_rank == 4);
  CHECK((*store)->stats().host.misses == 1);
}

TEST_CASE("On a GPU the store keeps pinned readings in host memory and copies on the device, within each budget", "[pipeline][adapters][cuda]") {
  const ComputeDevice cuda = test::require_cuda_or_skip();
  c10::InferenceMode guard;
  const auto model = bundled(cuda);
  test::TempDir dir;
  int64_t one_host = 0;
  {
    auto probe = AdapterStore::open(dir.file("probe"), {int64_t{1} << 30, int64_t{1} << 30});
    REQUIRE(probe.ok());
    const std::string id = upload(**probe, *model, dir, 1);
    auto got = (*probe)->get(id, *model);
    REQUIRE(got.ok());
    one_host = (*probe)->stats().host.bytes;
  }
  // Room for both readings in host memory, for one copy on the device.
  auto opened = AdapterStore::open(dir.file("store"), {4 * one_host, one_host + one_host / 2});
  REQUIRE(opened.ok());
  AdapterStore& store = **opened;
  const std::string a = upload(store, *model, dir, 1);
  const std::string b = upload(store, *model, dir, 2);
  CHECK_FALSE(store.ready(a, *model));  // read, not yet copied
  auto got_a = store.get(a, *model);
  REQUIRE(got_a.ok());
  const LoraLayer& layer = (*got_a)->layers.begin()->second;
  CHECK(layer.down.is_cuda());
  CHECK(layer.down.scalar_type() == static_cast<const Flux2EditModel&>(*model).parts().transformer->compute_dtype());
  CHECK(store.ready(a, *model));
  REQUIRE(store.get(b, *model).ok());  // evicts a's copy, not its reading
  CHECK_FALSE(store.ready(a, *model));
  const AdapterStoreStats before = store.stats();
  CHECK(before.device.evictions == 1);
  CHECK(before.host.adapters == 2);
  auto again = store.get(a, *model);
  REQUIRE(again.ok());
  const AdapterStoreStats after = store.stats();
  CHECK(after.host.misses == before.host.misses);  // no file read
  CHECK(after.host.hits == before.host.hits + 1);
  CHECK(after.device.misses == before.device.misses + 1);
  // The copy holds what the file holds (bf16 rounding of the float32 reading).
  const std::string weight = (*again)->layers.begin()->first;
  auto read = load_lora(store.dir() + "/" + a + ".safetensors", config_of(*model), "model");
  REQUIRE(read.ok());
  const at::Tensor expected = (*read)->layers.at(weight).down;
  const at::Tensor copied = (*again)->layers.at(weight).down.to(at::kCPU, at::kFloat);
  CHECK(at::allclose(copied, expected, 1e-2, 1e-2));
}
