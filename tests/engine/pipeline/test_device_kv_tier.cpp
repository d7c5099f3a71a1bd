// The device tier's bookkeeping on the CPU "device" (DeviceKvEntry::upload copies there as it
// would to a GPU): LRU within a byte budget, hits by entry identity, and out of device
// memory (an injected upload failure) evicting instead of failing. The GPU path itself is in
// the [cuda] tests.
#include "support/catch.h"

#include <cstring>
#include <memory>

#include <ATen/ATen.h>

#include "cache/activation_entry.h"
#include "pipeline/device_kv_tier.h"

using namespace infill;

namespace {

std::shared_ptr<ActivationEntry> entry_of(int tokens, uint16_t fill) {
  auto e = std::make_shared<ActivationEntry>(ActivationLayout{2, 3, tokens, 8});
  for (int step = 0; step < 2; ++step) {
    for (int block = 0; block < 3; ++block) {
      uint16_t* k = e->k(step, block);
      uint16_t* v = e->v(step, block);
      for (int i = 0; i < tokens * 8; ++i) {
        k[i] = static_cast<uint16_t>(fill + step * 100 + block * 10 + (i % 7));
        v[i] = static_cast<uint16_t>(fill + 1);
      }
    }
  }
  return e;
}

}  // namespace

TEST_CASE("the device tier keeps recently used entries within its budget", "[cache][device-tier]") {
  auto a = entry_of(16, 1000), b = entry_of(16, 2000), big = entry_of(64, 3000);
  const int64_t one = static_cast<int64_t>(a->bytes());
  DeviceKvTier tier(ComputeDevice{}, one + one / 2);  // room for one small entry

  auto ra = tier.get(a);
  REQUIRE(ra);
  // The copy holds the entry's bits.
  CHECK(std::memcmp(ra->k(1, 2).contiguous().data_ptr(), a->k(1, 2), a->layout().slab_elements() * 2) == 0);
  CHECK(std::memcmp(ra->v(0, 1).contiguous().data_ptr(), a->v(0, 1), a->layout().slab_elements() * 2) == 0);
  CHECK(tier.get(a) == ra);  // a hit: no second copy
  CHECK(tier.stats().hits == 1);
  CHECK(tier.stats().uploads == 1);

  auto rb = tier.get(b);  // evicts a
  REQUIRE(rb);
  CHECK(tier.stats().entries == 1);
  CHECK(tier.stats().evictions == 1);
  CHECK(tier.stats().bytes == one);
  CHECK(tier.get(a) != ra);  // uploaded again
  CHECK(tier.stats().uploads == 3);

  CHECK(tier.get(big) == nullptr);  // larger than the budget: the edit reads the host entry
  CHECK(tier.get(nullptr) == nullptr);

  // An entry the store dropped is dropped from the tier at the next upload.
  DeviceKvTier roomy(ComputeDevice{}, 10 * one);
  auto c = entry_of(16, 4000);
  REQUIRE(roomy.get(c));
  c.reset();
  REQUIRE(roomy.get(b));
  CHECK(roomy.stats().entries == 1);
  CHECK(roomy.stats().bytes == one);
  // Or at once, through drop_orphans (an adapter's entries erased on its delete); a device
  // copy a session still reads lives on with it.
  auto d = entry_of(16, 5000);
  std::shared_ptr<const DeviceKvEntry> in_use = roomy.get(d);
  REQUIRE(in_use);
  const std::weak_ptr<const DeviceKvEntry> copy = in_use;
  CHECK(roomy.drop_orphans() == 0);  // b and d are both held
  d.reset();
  CHECK(roomy.drop_orphans() == 1);
  CHECK(roomy.stats().entries == 1);
  CHECK(roomy.stats().bytes == one);
  CHECK_FALSE(copy.expired());
  in_use.reset();
  CHECK(copy.expired());  // freed
  CHECK(roomy.get(b));    // b's copy stayed
  CHECK(roomy.stats().uploads == 3);
}

TEST_CASE("out of device memory in the tier evicts and retries, and never fails the edit", "[cache][device-tier]") {
  auto a = entry_of(16, 1), b = entry_of(16, 2), c = entry_of(16, 3);
  const int64_t one = static_cast<int64_t>(a->bytes());
  int calls = 0;
  bool device_full = false;  // the next upload fails once, as cudaMalloc does when memory is short
  DeviceKvTier tier(ComputeDevice{}, 10 * one, at::kHalf,
                    [&](const ActivationEntry& e, const ComputeDevice& d, at::ScalarType t) -> Result<std::shared_ptr<const DeviceKvEntry>> {
                      ++calls;
                      if (device_full) {
                        device_full = false;
                        return Status(ErrorCode::kResourceExhausted, "cuda:0: CUDA out of memory (injected)");
                      }
                      return DeviceKvEntry::upload(e, d, t);
                    });
  REQUIRE(tier.get(a));
  REQUIRE(tier.get(b));
  device_full = true;
  CHECK(tier.get(c) != nullptr);  // evicted a and b, then fit
  CHECK(calls == 4);
  CHECK(tier.stats().entries == 1);
  CHECK(tier.stats().evictions == 2);

  DeviceKvTier hopeless(ComputeDevice{}, 10 * one, at::kHalf,
                        [](const ActivationEntry&, const ComputeDevice&, at::ScalarType) -> Result<std::shared_ptr<const DeviceKvEntry>> {
                          return Status(ErrorCode::kResourceExhausted, "cuda:0: CUDA out of memory (injected)");
                        });
  CHECK(hopeless.get(a) == nullptr);  // the edit goes on reading the host entry
  CHECK(hopeless.stats().failed_uploads == 1);
  CHECK(hopeless.stats().entries == 0);
}

TEST_CASE("the device tier holds entries in the dtype it is given and budgets their bytes in it",
          "[cache][device-tier]") {
  auto a = entry_of(16, 1000), b = entry_of(16, 2000);
  const int64_t one = static_cast<int64_t>(a->bytes());
  const auto slab = [&](const uint16_t* data) {
    return at::from_blob(const_cast<uint16_t*>(data), {16, 8}, at::kHalf);
  };
  // bf16: the size of fp16, each value as libtorch converts it (what a bf16 forward read
  // from an fp16 copy before).
  DeviceKvTier bf16(ComputeDevice{}, one + one / 2, at::kBFloat16);
  CHECK(bf16.dtype() == at::kBFloat16);
  auto ra = bf16.get(a);
  REQUIRE(ra);
  CHECK(ra->dtype() == at::kBFloat16);
  CHECK(ra->kv(1, 2).sizes() == at::IntArrayRef({16, 16}));  // K | V side by side
  CHECK(at::equal(ra->k(1, 2), slab(a->k(1, 2)).to(at::kBFloat16)));
  CHECK(at::equal(ra->v(0, 1), slab(a->v(0, 1)).to(at::kBFloat16)));
  CHECK(ra->bytes() == one);
  CHECK(bf16.stats().bytes == one);
  // float32 (a GPU model kept in float32): twice the bytes, so one entry fills a budget of 3.
  DeviceKvTier f32(ComputeDevice{}, 3 * one, at::kFloat);
  auto fa = f32.get(a);
  REQUIRE(fa);
  CHECK(fa->bytes() == 2 * one);
  CHECK(at::equal(fa->k(0, 0), slab(a->k(0, 0)).to(at::kFloat)));
  REQUIRE(f32.get(b));
  CHECK(f32.stats().evictions == 1);
  CHECK(f32.stats().bytes == 2 * one);
  // Not a floating dtype: refused, naming it.
  auto refused = DeviceKvEntry::upload(*a, ComputeDevice{}, at::kLong);
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(refused.status().message(), Catch::Contains("Long"));
}
