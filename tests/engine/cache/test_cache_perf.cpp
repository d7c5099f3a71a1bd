
#include "support/catch.h"
#include <chrono>
#include <cstdio>
#include <vector>

#include "cache/activation_store.h"
#include "cache/disk_tier.h"
#include "cache_test_util.h"
#include "common/hash.h"

using namespace infill;
using infill::test::make_entry;
using infill::test::make_key;
using infill::test::TempDir;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

// Hidden (run with "[perf]"): prints throughput; asserts only correctness.
TEST_CASE("disk tier throughput", "[.][perf]") {
  TempDir dir;
  // 4 steps x 8 blocks x 1024 tokens x 512 hidden: 64 MiB, 2 MiB per slab.
  const ActivationLayout layout{4, 8, 1024, 512};
  auto entry = make_entry(layout, 1);
  const double mib = static_cast<double>(entry->bytes()) / (1 << 20);

  auto t0 = std::chrono::steady_clock::now();
  const uint64_t sum = xxh64(std::span<const std::byte>(
      reinterpret_cast<const std::byte*>(entry->data()), entry->bytes()));
  const double hash_s = seconds_since(t0);
  CHECK(sum != 0);

  auto tier = DiskTier::open(dir.path(), size_t{1} << 30);
  REQUIRE(tier.ok());
  t0 = std::chrono::steady_clock::now();
  REQUIRE((*tier)->write(make_key(1), *entry).ok());
  const double write_s = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  auto back = (*tier)->read(make_key(1));
  const double read_s = seconds_since(t0);
  REQUIRE(back.ok());
  std::vector<uint16_t> k(layout.slab_elements()), v(layout.slab_elements());
  t0 = std::chrono::steady_clock::now();
  for (int b = 0; b < layout.blocks; ++b) REQUIRE((*tier)->read_slab(make_key(1), 2, b, k.data(), v.data()).ok());
  const double slab_s = seconds_since(t0) / layout.blocks;
  std::printf("{\"entry_mib\": %.0f, \"xxh64_gib_s\": %.2f, \"write_mib_s\": %.0f, "
              "\"read_verify_mib_s\": %.0f, \"read_slab_ms\": %.2f, \"slab_mib\": %.1f}\n",
              mib, mib / 1024 / hash_s, mib / write_s, mib / read_s, slab_s * 1e3,
              static_cast<double>(layout.slab_elements()) * 4 / (1 << 20));
}
