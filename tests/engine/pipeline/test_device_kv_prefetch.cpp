// Cached K/V read from host memory by a forward on a GPU: DeviceKvPrefetch copies each block
// on a copy stream one block ahead (and the next step's first block at a step's end), from
// pinned and from pageable memory. The result must equal reading the same entry resident on
// the device, bit for bit, over several steps, with two segments reading one source (the two
// halves of a guided step) and with a source reading the second half of a two-sequence entry.
// Skipped (exit 4) without a CUDA device; the CPU cases check the allocator and the bounds.
#include "support/catch.h"
#include "support/cuda_device.h"
#include "support/flux2_requests.h"

#include <cstring>
#include <memory>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "cache/activation_entry.h"
#include "pipeline/cached_kv.h"
#include "pipeline/device_kv_entry.h"
#include "pipeline/device_kv_prefetch.h"
#include "pipeline/pinned_host_memory.h"

using namespace infill::test;

TEST_CASE("an entry's memory comes from the allocator it is given, zero-filled", "[cache][prefetch]") {
  std::vector<size_t> asked;
  const infill::HostAllocator counting = [&](size_t bytes) {
    asked.push_back(bytes);
    infill::HostBuffer buffer = infill::allocate_plain_host(bytes);
    std::memset(buffer.get(), 0xab, bytes);  // the entry must clear it
    return buffer;
  };
  const infill::ActivationLayout layout{2, 3, 5, 8};
  infill::ActivationEntry entry(layout, counting);
  REQUIRE(asked == std::vector<size_t>{layout.total_bytes()});
  for (size_t i = 0; i < layout.total_elements(); ++i) REQUIRE(entry.data()[i] == 0);
  // The CPU worker's entries stay in plain memory: no allocator.
  CHECK_FALSE(static_cast<bool>(infill::entry_allocator_for(c10::Device(c10::kCPU))));
}

TEST_CASE("an entry source refuses blocks outside its entry", "[cache][prefetch]") {
  auto entry = std::make_shared<infill::ActivationEntry>(infill::ActivationLayout{1, 4, 3, 8});
  CHECK_NOTHROW(infill::EntryKvSource(entry, 0, nullptr, 2, 2));
  CHECK_THROWS(infill::EntryKvSource(entry, 0, nullptr, 3, 2));
  CHECK_THROWS(infill::EntryKvSource(entry, 0, nullptr, 4));
  // On the CPU a source never claims device tensors: the forward reads its slabs.
  infill::EntryKvSource source(entry, 0);
  at::Tensor k, v;
  CHECK_FALSE(source.device_tensors(0, at::Device(at::kCPU), &k, &v));
  CHECK(source.prefetch() == nullptr);
}

TEST_CASE("K/V prefetched to the GPU from pinned and pageable memory equal the resident entry's", "[cuda][prefetch]") {
  const infill::ComputeDevice cuda = require_cuda_or_skip();
  const Flux2Config cfg = small_config();
  Flux2Transformer model = Flux2Transformer::random(cfg, 33, at::kFloat);
  REQUIRE(model.to_device(cuda, at::kBFloat16).ok());
  c10::InferenceMode guard;
  const Request r = make_request(cfg, 5, 4, 4, /*reference=*/true, 9);
  const int steps = 3, depth = cfg.depth();
  const std::vector<double> times = {0.9, 0.6, 0.3};

  // A three-step entry holding two sequences (blocks [0, depth) and [depth, 2 depth)), as a
  // guided prompt-keyed entry does, recorded by the GPU's own full forwards.
  const infill::ActivationLayout layout{steps, 2 * depth, static_cast<int>(r.length()), cfg.hidden_size};
  auto pageable = std::make_shared<infill::ActivationEntry>(layout);
  for (int step = 0; step < steps; ++step) {
    for (int half = 0; half < 2; ++half) {
      infill::EntryKvSink sink(*pageable, step, half * depth);
      Flux2Segment full = full_segment(r, times[step] + 0.05 * half);
      full.sink = &sink;
      forward_one(model, full);
    }
  }
  auto pinned = std::make_shared<infill::ActivationEntry>(layout, infill::entry_allocator_for(cuda.torch_device()));
  std::memcpy(pinned->data(), pageable->data(), layout.total_bytes());
  CHECK(infill::pinned_fallbacks() == 0);
  CHECK(at::from_blob(pinned->data(), {1}, at::kHalf).is_pinned());
  auto resident = infill::DeviceKvEntry::upload(*pageable, cuda);
  REQUIRE(resident.ok());

  const at::Tensor rows = at::tensor(std::vector<int64_t>{1, 6, 17, 30});
  const at::Tensor none = at::empty({0}, at::kLong);
  // Two segments per forward, as a guided step: each reads `first` and `second` at `step`.
  auto forward_two = [&](infill::KvSource* first, infill::KvSource* second, int step) {
    Flux2Segment segments[2] = {masked_segment(r, none, rows, times[step], first),
                                masked_segment(r, none, rows, times[step], second)};
    return model.forward(std::span<Flux2Segment>(segments, 2));
  };
  for (const bool use_pinned : {true, false}) {
    INFO((use_pinned ? "pinned host memory" : "pageable host memory"));
    const auto& host = use_pinned ? pinned : pageable;
    // The prompted half, read by both segments through one source: one copy per block.
    infill::EntryKvSource shared(host, 0, nullptr, 0, depth);
    infill::EntryKvSource expected_shared(host, 0, *resident, 0, depth);
    // The null half of the entry, through a source of its own.
    infill::EntryKvSource second_half(host, 0, nullptr, depth, depth);
    infill::EntryKvSource expected_second(host, 0, *resident, depth, depth);
    for (int step = 0; step < steps; ++step) {
      INFO("step " << step);
      for (auto* s : {&shared, &expected_shared, &second_half, &expected_second}) s->set_step(step);
      const at::Tensor got = forward_two(&shared, &second_half, step);
      const at::Tensor want = forward_two(&expected_shared, &expected_second, step);
      // The prediction comes back to the host (float32); the K/V went through the copy stream.
      REQUIRE(shared.prefetch() != nullptr);
      CHECK(at::equal(got, want));
    }
    // Every block after the first was on its way before the forward asked for it, and each
    // block crossed the bus once although two segments read the shared source.
    const int64_t slab_bytes = 2 * r.length() * cfg.hidden_size * static_cast<int64_t>(sizeof(uint16_t));
    for (const auto* s : {&shared, &second_half}) {
      REQUIRE(s->prefetch() != nullptr);
      CHECK(s->prefetch()->copied_on_demand() == 1);
      CHECK(s->prefetch()->prefetched() == steps * depth - 1);
      CHECK(s->prefetch()->bytes_copied() == steps * depth * slab_bytes);
    }
    // A skipped step (an edit at strength < 1 starts later; a guess that missed) is copied
    // when asked for, and still right.
    infill::EntryKvSource skipping(host, 0, nullptr, 0, depth);
    for (const int step : {0, 2}) {
      skipping.set_step(step);
      expected_shared.set_step(step);
      CHECK(at::equal(forward_two(&skipping, &skipping, step), forward_two(&expected_shared, &expected_shared, step)));
    }
    CHECK(skipping.prefetch()->copied_on_demand() == 2);
  }
  // The host entry is never written by a prefetched forward.
  CHECK(std::memcmp(pinned->data(), pageable->data(), layout.total_bytes()) == 0);
}
