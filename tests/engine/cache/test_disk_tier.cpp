
#include "support/catch.h"
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cache/activation_store.h"
#include "cache/disk_tier.h"
#include "cache_test_util.h"

using namespace infill;
using infill::test::make_entry;
using infill::test::make_key;
using infill::test::same_bits;
using infill::test::TempDir;

namespace {

constexpr ActivationLayout kLayout{2, 3, 5, 8};  // 6 slabs of 2 x 80 bytes
constexpr size_t kBigBudget = size_t{1} << 30;

std::vector<char> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

void write_file(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Header size of the v1 format for this key and layout (see disk_tier.h).
size_t header_bytes(const ActivationKey& key, const ActivationLayout& layout) {
  const size_t raw = 64 + key.canonical().size() + 16 * layout.steps * layout.blocks + 8;
  return (raw + 63) / 64 * 64;
}

}  // namespace

TEST_CASE("default_cache_dir follows XDG_CACHE_HOME, then HOME", "[disk_tier]") {
  const char* old_xdg = std::getenv("XDG_CACHE_HOME");
  const std::string saved_xdg = old_xdg ? old_xdg : "";
  ::setenv("XDG_CACHE_HOME", "/var/tmp/xdg", 1);
  CHECK(default_cache_dir() == "/var/tmp/xdg/infill/activations");
  ::setenv("XDG_CACHE_HOME", "relative/is/ignored", 1);
  const char* home = std::getenv("HOME");
  if (home != nullptr) CHECK(default_cache_dir() == std::string(home) + "/.cache/infill/activations");
  if (old_xdg) ::setenv("XDG_CACHE_HOME", saved_xdg.c_str(), 1); else ::unsetenv("XDG_CACHE_HOME");
}

TEST_CASE("disk tier round trip is bit-exact and the file has the documented size", "[disk_tier]") {
  TempDir dir;
  auto tier = DiskTier::open(dir.path(), kBigBudget);
  REQUIRE(tier.ok());
  const ActivationKey key = make_key(1);
  auto entry = make_entry(kLayout, 11);
  REQUIRE((*tier)->write(key, *entry).ok());
  CHECK((*tier)->contains(key));
  CHECK_FALSE((*tier)->contains(make_key(2)));
  REQUIRE((*tier)->layout_of(key).has_value());
  CHECK(*(*tier)->layout_of(key) == kLayout);

  const std::string path = (*tier)->path_of(key);
  CHECK(path == dir.path() + "/" + key.digest() + ".iact");
  const size_t expected_file = header_bytes(key, kLayout) + entry->bytes();
  CHECK(std::filesystem::file_size(path) == expected_file);
  CHECK((*tier)->stats().bytes == expected_file);
  CHECK((*tier)->stats().entries == 1);
  // No temporary file is left behind.
  size_t files = 0;
  for (const auto& de : std::filesystem::directory_iterator(dir.path())) (void)de, ++files;
  CHECK(files == 1);

  auto back = (*tier)->read(key);
  REQUIRE(back.ok());
  CHECK(same_bits(**back, *entry));
  CHECK((*tier)->read(make_key(2)).status().code() == ErrorCode::kNotFound);
}

TEST_CASE("read_slab equals the in-memory slab for every (step, block)", "[disk_tier]") {
  TempDir dir;
  auto store = ActivationStore::open({.ram_budget_bytes = kBigBudget, .disk_dir = dir.path(),
                                      .disk_budget_bytes = kBigBudget});
  REQUIRE(store.ok());
  const ActivationKey key = make_key(3);
  auto entry = make_entry(kLayout, 33);
  REQUIRE((*store)->put(key, entry).ok());
  REQUIRE((*store)->flush().ok());
  DiskTier* disk = (*store)->disk_tier();
  const size_t n = kLayout.slab_elements();
  std::vector<uint16_t> k(n), v(n);
  for (int s = 0; s < kLayout.steps; ++s) {
    for (int b = 0; b < kLayout.blocks; ++b) {
      INFO("step " << s << " block " << b);
      std::fill(k.begin(), k.end(), 0);
      std::fill(v.begin(), v.end(), 0);
      REQUIRE(disk->read_slab(key, s, b, k.data(), v.data()).ok());
      CHECK(std::memcmp(k.data(), entry->k(s, b), n * 2) == 0);
      CHECK(std::memcmp(v.data(), entry->v(s, b), n * 2) == 0);
      // The store serves the same bytes from RAM.
      std::vector<uint16_t> k2(n), v2(n);
      REQUIRE((*store)->read_slab(key, s, b, k2.data(), v2.data()).ok());
      CHECK(k2 == k);
      CHECK(v2 == v);
    }
  }
  CHECK(disk->read_slab(key, kLayout.steps, 0, k.data(), v.data()).code() == ErrorCode::kOutOfRange);
  CHECK(disk->read_slab(key, 0, -1, k.data(), v.data()).code() == ErrorCode::kOutOfRange);
  CHECK(disk->read_slab(make_key(99), 0, 0, k.data(), v.data()).code() == ErrorCode::kNotFound);
}

TEST_CASE("a new store over the same directory finds entries written before", "[disk_tier]") {
  TempDir dir;
  const ActivationKey key = make_key(4);
  auto entry = make_entry(kLayout, 44);
  const ActivationStoreOptions options{.ram_budget_bytes = kBigBudget, .disk_dir = dir.path(),
                                       .disk_budget_bytes = kBigBudget, .write_through = true};
  {
    auto store = ActivationStore::open(options);
    REQUIRE(store.ok());
    REQUIRE((*store)->put(key, entry).ok());
  }
  auto store = ActivationStore::open(options);
  REQUIRE(store.ok());
  CHECK((*store)->tier_of(key) == Tier::kDisk);
  CHECK_FALSE((*store)->contains(make_key(5)));  // same model and template, other seed
  auto back = (*store)->get(key);
  REQUIRE(back.ok());
  CHECK(same_bits(**back, *entry));
  CHECK((*store)->tier_of(key) == Tier::kRam);
  CHECK((*store)->stats().hits_disk == 1);
  CHECK((*store)->stats().promotions == 1);
}

TEST_CASE("disk budget deletes least recently used files", "[disk_tier]") {
  TempDir dir;
  const size_t file_bytes = header_bytes(make_key(0), kLayout) + kLayout.total_bytes();
  auto tier = DiskTier::open(dir.path(), 2 * file_bytes);
  REQUIRE(tier.ok());
  auto e = make_entry(kLayout, 1);
  REQUIRE((*tier)->write(make_key(0), *e).ok());
  REQUIRE((*tier)->write(make_key(1), *e).ok());
  REQUIRE((*tier)->read(make_key(0)).ok());  // 0 becomes most recent
  REQUIRE((*tier)->write(make_key(2), *e).ok());
  CHECK((*tier)->contains(make_key(0)));
  CHECK_FALSE((*tier)->contains(make_key(1)));
  CHECK((*tier)->contains(make_key(2)));
  CHECK_FALSE(std::filesystem::exists((*tier)->path_of(make_key(1))));
  CHECK((*tier)->stats().bytes == 2 * file_bytes);
  CHECK((*tier)->stats().evictions == 1);

  // A file larger than the whole budget is refused and leaves nothing behind.
  auto big = make_entry({8, 3, 5, 8}, 2);  // 640-byte header + 3840 > 2560
  CHECK((*tier)->write(make_key(7), *big).code() == ErrorCode::kResourceExhausted);
  CHECK_FALSE(std::filesystem::exists((*tier)->path_of(make_key(7))));

  // Restarting with a smaller budget trims to it, keeping the most recently modified file
  // (modification times set apart explicitly: writes within one clock tick tie).
  const auto now = std::filesystem::file_time_type::clock::now();
  std::filesystem::last_write_time((*tier)->path_of(make_key(0)), now - std::chrono::seconds(60));
  std::filesystem::last_write_time((*tier)->path_of(make_key(2)), now - std::chrono::seconds(30));
  tier->reset();
  auto small = DiskTier::open(dir.path(), file_bytes);
  REQUIRE(small.ok());
  CHECK((*small)->stats().entries == 1);
  CHECK((*small)->stats().bytes == file_bytes);
  CHECK((*small)->contains(make_key(2)));
  CHECK_FALSE(std::filesystem::exists((*small)->path_of(make_key(0))));
}

// Each damage is applied after the store has indexed the file, then detected on read.
TEST_CASE("every kind of damage to a disk entry is detected, dropped and never returned",
          "[disk_tier]") {
  const ActivationKey key = make_key(6);
  const size_t header = header_bytes(key, kLayout);
  const size_t key_bytes = key.canonical().size();
  const size_t slab_half = kLayout.slab_elements() * 2;
  const size_t file_bytes = header + kLayout.total_bytes();

  struct Damage {
    const char* name;
    long flip_at;       // byte offset to flip, or -1
    long truncate_to;   // new size, or -1
    bool append = false;
    int bad_step = -1, bad_block = -1;  // slab whose read_slab must fail, if the damage is local
  };
  const std::vector<Damage> damages = {
      {"magic", 0, -1},
      {"layout field (blocks)", 20, -1},
      {"key text", 64 + 5, -1},
      {"slab checksum table", static_cast<long>(64 + key_bytes + 8 * 3), -1},
      {"header padding", static_cast<long>(header - 9), -1},
      {"header checksum", static_cast<long>(header - 3), -1},
      // Slab (step 1, block 1) is slab index 4: K at header + 4 * 2 * half.
      {"K of slab (1,1)", static_cast<long>(header + 8 * slab_half + 17), -1, false, 1, 1},
      {"V of slab (1,1)", static_cast<long>(header + 9 * slab_half + 3), -1, false, 1, 1},
      {"last data byte", static_cast<long>(file_bytes - 1), -1, false, 1, 2},
      {"truncated by one byte", -1, static_cast<long>(file_bytes - 1)},
      {"truncated to the header", -1, static_cast<long>(header)},
      {"truncated inside the header", -1, 40},
      {"empty file", -1, 0},
      {"extended by one byte", -1, -1, true},
  };
  REQUIRE(header - 9 > 64 + key_bytes + 16 * 6);  // the padding case really hits padding

  for (const Damage& d : damages) {
    DYNAMIC_SECTION(d.name) {
      TempDir dir;
      auto store = ActivationStore::open({.ram_budget_bytes = kBigBudget, .disk_dir = dir.path(),
                                          .disk_budget_bytes = kBigBudget});
      REQUIRE(store.ok());
      auto entry = make_entry(kLayout, 66);
      // Straight to disk: an entry above the RAM budget would do the same; flush is simpler.
      REQUIRE((*store)->put(key, entry).ok());
      REQUIRE((*store)->flush().ok());
      (*store)->erase(make_key(1000));  // no-op on an absent key
      const std::string path = (*store)->disk_tier()->path_of(key);
      std::vector<char> bytes = read_file(path);
      REQUIRE(bytes.size() == file_bytes);
      if (d.flip_at >= 0) bytes[static_cast<size_t>(d.flip_at)] ^= 0x40;
      if (d.truncate_to >= 0) bytes.resize(static_cast<size_t>(d.truncate_to));
      if (d.append) bytes.push_back('x');
      write_file(path, bytes);

      // Evict the RAM copy so that reads must go to disk.
      store->reset();
      store = ActivationStore::open({.ram_budget_bytes = kBigBudget, .disk_dir = dir.path(),
                                     .disk_budget_bytes = kBigBudget});
      REQUIRE(store.ok());
      const bool header_damage = d.bad_step < 0;
      if (header_damage) {
        // Header damage is caught when the directory is indexed.
        CHECK((*store)->stats().corrupt_dropped == 1);
        CHECK_FALSE((*store)->contains(key));
        CHECK((*store)->get(key).status().code() == ErrorCode::kNotFound);
      } else {
        // Slab damage: other slabs stay readable on their own; the damaged one is refused.
        const size_t n = kLayout.slab_elements();
        std::vector<uint16_t> k(n), v(n);
        REQUIRE((*store)->read_slab(key, 0, 0, k.data(), v.data()).ok());
        CHECK(std::memcmp(k.data(), entry->k(0, 0), n * 2) == 0);
        const Status slab = (*store)->read_slab(key, d.bad_step, d.bad_block, k.data(), v.data());
        CHECK(slab.code() == ErrorCode::kCorruptData);
        CHECK((*store)->stats().corrupt_dropped == 1);
        CHECK_FALSE((*store)->contains(key));
      }
      CHECK_FALSE(std::filesystem::exists(path));
      CHECK((*store)->stats().disk_bytes == 0);
      CHECK_FALSE((*store)->get(key).ok());
    }
  }
}

TEST_CASE("damage found by a whole-entry get is dropped and counted", "[disk_tier]") {
  const ActivationKey key = make_key(8);
  TempDir dir;
  const ActivationStoreOptions options{.ram_budget_bytes = 1, .disk_dir = dir.path(),
                                       .disk_budget_bytes = kBigBudget};
  auto store = ActivationStore::open(options);
  REQUIRE(store.ok());
  auto entry = make_entry(kLayout, 88);
  REQUIRE((*store)->put(key, entry).ok());  // above the 1-byte RAM budget: straight to disk
  CHECK((*store)->tier_of(key) == Tier::kDisk);
  const std::string path = (*store)->disk_tier()->path_of(key);
  std::vector<char> bytes = read_file(path);
  bytes[bytes.size() / 2] ^= 1;
  write_file(path, bytes);
  auto got = (*store)->get(key);
  CHECK(got.status().code() == ErrorCode::kCorruptData);
  CHECK((*store)->stats().corrupt_dropped == 1);
  CHECK((*store)->stats().misses == 1);
  CHECK_FALSE(std::filesystem::exists(path));
  CHECK((*store)->get(key).status().code() == ErrorCode::kNotFound);
}

TEST_CASE("a file holding another key is never served for this key", "[disk_tier]") {
  TempDir dir;
  const ActivationKey a = make_key(10), b = make_key(11);
  auto tier = DiskTier::open(dir.path(), kBigBudget);
  REQUIRE(tier.ok());
  auto ea = make_entry(kLayout, 100), eb = make_entry(kLayout, 101);
  REQUIRE((*tier)->write(a, *ea).ok());
  REQUIRE((*tier)->write(b, *eb).ok());
  const std::string path_a = (*tier)->path_of(a), path_b = (*tier)->path_of(b);

  SECTION("replaced behind the index's back: the key check catches it on read") {
    std::filesystem::copy_file(path_a, path_b, std::filesystem::copy_options::overwrite_existing);
    auto got = (*tier)->read(b);
    CHECK(got.status().code() == ErrorCode::kCorruptData);
    CHECK((*tier)->stats().corrupt_dropped == 1);
    CHECK_FALSE((*tier)->contains(b));
    REQUIRE((*tier)->read(a).ok());
  }
  SECTION("renamed before a restart: indexed under its name, matched only by its own key") {
    tier->reset();
    std::filesystem::rename(path_a, path_b);
    auto reopened = DiskTier::open(dir.path(), kBigBudget);
    REQUIRE(reopened.ok());
    CHECK_FALSE((*reopened)->contains(b));
    CHECK_FALSE((*reopened)->contains(a));
    CHECK((*reopened)->read(b).status().code() == ErrorCode::kNotFound);
    CHECK((*reopened)->read(a).status().code() == ErrorCode::kNotFound);
  }
}

TEST_CASE("an entry deleted by hand is forgotten, not an error", "[disk_tier]") {
  TempDir dir;
  auto tier = DiskTier::open(dir.path(), kBigBudget);
  REQUIRE(tier.ok());
  const ActivationKey key = make_key(12);
  REQUIRE((*tier)->write(key, *make_entry(kLayout, 5)).ok());
  std::filesystem::remove((*tier)->path_of(key));
  CHECK((*tier)->read(key).status().code() == ErrorCode::kNotFound);
  CHECK_FALSE((*tier)->contains(key));
  CHECK((*tier)->stats().bytes == 0);
  CHECK((*tier)->stats().corrupt_dropped == 0);
}
