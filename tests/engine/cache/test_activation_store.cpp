
#include "support/catch.h"
#include <atomic>
#include <filesystem>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "cache/activation_store.h"
#include "cache_test_util.h"

using namespace infill;
using infill::test::make_entry;
using infill::test::make_key;
using infill::test::same_bits;
using infill::test::TempDir;

namespace {

constexpr ActivationLayout kLayout{2, 3, 16, 32};  // 12288 bytes
constexpr size_t kEntryBytes = 2 * 3 * 2 * 16 * 32 * 2;
constexpr size_t kBigBudget = size_t{1} << 30;

// Exact RAM accounting: the sum of bytes over keys the store reports as RAM-resident.
size_t resident_bytes(const ActivationStore& store, const std::map<int, size_t>& sizes) {
  size_t sum = 0;
  for (const auto& [id, bytes] : sizes) {
    if (store.tier_of(make_key(id)) == Tier::kRam) sum += bytes;
  }
  return sum;
}

ActivationStoreOptions ram_only(size_t budget) {
  ActivationStoreOptions options;
  options.ram_budget_bytes = budget;
  return options;
}

size_t files_bytes(const std::string& dir) {
  size_t sum = 0;
  for (const auto& de : std::filesystem::directory_iterator(dir)) sum += de.file_size();
  return sum;
}

}  // namespace

TEST_CASE("RAM budget holds and accounting is exact after every operation", "[store]") {
  const bool with_disk = GENERATE(false, true);
  INFO("disk tier: " << with_disk);
  TempDir dir;
  const size_t budget = 100000;
  auto store = ActivationStore::open({.ram_budget_bytes = budget,
                                      .disk_dir = with_disk ? dir.path() : "",
                                      .disk_budget_bytes = kBigBudget});
  REQUIRE(store.ok());
  std::mt19937 rng(99);
  std::uniform_int_distribution<int> id_of(0, 19), steps_of(1, 6), op(0, 9);
  std::map<int, size_t> sizes;                                  // id -> bytes of its last put
  std::map<int, std::shared_ptr<ActivationEntry>> contents;     // id -> its last entry
  for (int i = 0; i < 300; ++i) {
    const int id = id_of(rng);
    if (op(rng) < 6) {
      // Sizes from 4 KiB to 24 KiB; 0.. 7 entries fit.
      auto entry = make_entry({steps_of(rng), 2, 8, 32}, static_cast<uint64_t>(i));
      REQUIRE((*store)->put(make_key(id), entry).ok());
      sizes[id] = entry->bytes();
      contents[id] = entry;
      CHECK((*store)->tier_of(make_key(id)) == Tier::kRam);
    } else {
      auto got = (*store)->get(make_key(id));
      if (got.ok()) {
        REQUIRE(contents.count(id) == 1);
        CHECK(same_bits(**got, *contents[id]));
      } else {
        // Without a disk tier evicted entries are gone; with one, nothing is ever lost here.
        CHECK((!with_disk || contents.count(id) == 0));
      }
    }
    const ActivationStoreStats s = (*store)->stats();
    REQUIRE(s.ram_bytes <= budget);
    REQUIRE(s.ram_bytes == resident_bytes(**store, sizes));
    if (with_disk) REQUIRE(s.disk_bytes == files_bytes(dir.path()));
  }
  const ActivationStoreStats s = (*store)->stats();
  CHECK(s.hits_ram + s.hits_disk + s.misses > 0);
  if (with_disk) {
    CHECK(s.evictions_to_disk > 0);
    CHECK(s.evictions_dropped == 0);
  } else {
    CHECK(s.evictions_dropped > 0);
    CHECK(s.evictions_to_disk == 0);
  }
}

TEST_CASE("eviction follows least-recent use and promotion brings entries back", "[store]") {
  TempDir dir;
  auto store = ActivationStore::open({.ram_budget_bytes = 3 * kEntryBytes, .disk_dir = dir.path(),
                                      .disk_budget_bytes = kBigBudget});
  REQUIRE(store.ok());
  ActivationStore& s = **store;
  std::vector<std::shared_ptr<ActivationEntry>> e;
  for (int i = 0; i < 5; ++i) e.push_back(make_entry(kLayout, 500 + i));
  const auto A = make_key(0), B = make_key(1), C = make_key(2), D = make_key(3), E = make_key(4);
  REQUIRE(s.put(A, e[0]).ok());
  REQUIRE(s.put(B, e[1]).ok());
  REQUIRE(s.put(C, e[2]).ok());
  REQUIRE(s.get(A).ok());  // recency now A, C, B
  REQUIRE(s.put(D, e[3]).ok());  // evicts B
  CHECK(s.tier_of(B) == Tier::kDisk);
  CHECK(s.tier_of(A) == Tier::kRam);
  CHECK(s.tier_of(C) == Tier::kRam);
  CHECK(s.tier_of(D) == Tier::kRam);
  REQUIRE(s.put(E, e[4]).ok());  // recency D, A, C -> evicts C
  CHECK(s.tier_of(C) == Tier::kDisk);
  CHECK(s.stats().evictions_to_disk == 2);
  CHECK(s.stats().ram_bytes == 3 * kEntryBytes);

  auto b = s.get(B);  // disk hit, promoted; recency B, E, D, A -> evicts A
  REQUIRE(b.ok());
  CHECK(same_bits(**b, *e[1]));
  CHECK(s.tier_of(B) == Tier::kRam);
  CHECK(s.tier_of(A) == Tier::kDisk);
  const ActivationStoreStats st = s.stats();
  CHECK(st.hits_disk == 1);
  CHECK(st.promotions == 1);
  CHECK(st.evictions_to_disk == 3);
  CHECK(st.ram_entries == 3);
  CHECK(st.disk_entries == 3);  // A, B (kept: the disk tier is inclusive), C

  // Promoted entries keep their files, so evicting them again writes nothing new: after
  // two more promotions (each evicting a never-written entry) exactly 5 files exist.
  const size_t file_bytes = s.stats().disk_bytes / 3;
  REQUIRE(s.get(C).ok());  // recency C, B, E, D -> evicts D (written)
  REQUIRE(s.get(A).ok());  // recency A, C, B, E -> evicts E (written)
  CHECK(s.stats().disk_entries == 5);
  CHECK(s.stats().disk_bytes == 5 * file_bytes);
  REQUIRE(s.get(D).ok());  // recency D, A, C, B -> evicts B, whose file exists
  CHECK(s.stats().disk_entries == 5);
  CHECK(s.stats().evictions_to_disk == 6);

  s.erase(B);
  CHECK_FALSE(s.contains(B));
  CHECK(s.get(B).status().code() == ErrorCode::kNotFound);
}

TEST_CASE("without a disk tier evicted entries are dropped", "[store]") {
  auto store = ActivationStore::open(ram_only(2 * kEntryBytes));
  REQUIRE(store.ok());
  ActivationStore& s = **store;
  REQUIRE(s.put(make_key(0), make_entry(kLayout, 1)).ok());
  REQUIRE(s.put(make_key(1), make_entry(kLayout, 2)).ok());
  REQUIRE(s.put(make_key(2), make_entry(kLayout, 3)).ok());
  CHECK_FALSE(s.contains(make_key(0)));
  CHECK(s.get(make_key(0)).status().code() == ErrorCode::kNotFound);
  CHECK(s.stats().evictions_dropped == 1);
  CHECK(s.stats().misses == 1);
  CHECK(s.stats().ram_entries == 2);
  CHECK(s.flush().ok());
}

TEST_CASE("erase_if removes the keys it matches from RAM and disk and nothing else", "[store]") {
  TempDir dir;
  const ActivationStoreOptions options{.ram_budget_bytes = 2 * kEntryBytes, .disk_dir = dir.path(),
                                       .disk_budget_bytes = 10 * (kEntryBytes + 4096)};
  // Keys recorded with adapter sets, as FLUX.2 records them; ids shortened.
  const std::vector<std::string> sets = {"aa*1", "bb*0.5+aa*-1", "bb*1", "", "aa*1e+09"};
  std::vector<ActivationKey> keys;
  {
    auto store = ActivationStore::open(options);
    REQUIRE(store.ok());
    ActivationStore& s = **store;
    for (size_t i = 0; i < sets.size(); ++i) {
      keys.push_back(make_key(static_cast<int>(i)));
      keys.back().adapters = sets[i];
      keys.back().references = i == 4 ? "ref1,ref2" : "";
      REQUIRE(s.put(keys.back(), make_entry(kLayout, 40 + i)).ok());
    }
    // The first three were spilled to disk, the last two are in RAM.
    REQUIRE(s.tier_of(keys[0]) == Tier::kDisk);
    REQUIRE(s.tier_of(keys[4]) == Tier::kRam);
    const size_t erased = s.erase_if([](std::string_view canonical) {
      return canonical_key_field(canonical, "adapters").find("aa*") != std::string_view::npos;
    });
    CHECK(erased == 3);
    CHECK_FALSE(s.contains(keys[0]));  // on disk
    CHECK_FALSE(s.contains(keys[1]));
    CHECK_FALSE(s.contains(keys[4]));  // in RAM
    CHECK(s.get(keys[0]).status().code() == ErrorCode::kNotFound);
    for (size_t i : {size_t{2}, size_t{3}}) {
      auto kept = s.get(keys[i]);
      REQUIRE(kept.ok());
      CHECK(same_bits(**kept, *make_entry(kLayout, 40 + i)));
    }
    CHECK(s.erase_if([](std::string_view) { return false; }) == 0);
    REQUIRE(s.flush().ok());
  }
  // Their files are gone: a store opened on the folder again finds only the others.
  auto reopened = ActivationStore::open(options);
  REQUIRE(reopened.ok());
  CHECK((*reopened)->stats().disk_entries == 2);
  CHECK_FALSE((*reopened)->contains(keys[1]));
  CHECK((*reopened)->contains(keys[2]));
  CHECK((*reopened)->contains(keys[3]));
}

TEST_CASE("canonical_key_field reads a field of a canonical key and nothing else", "[store]") {
  ActivationKey key = make_key(7);
  key.conditioning = "c0ffee";
  key.adapters = "aa*0.5+bb*1";
  key.references = "r1,r2";
  const std::string canonical = key.canonical();
  CHECK(canonical_key_field(canonical, "adapters") == "aa*0.5+bb*1");
  CHECK(canonical_key_field(canonical, "refs") == "r1,r2");
  CHECK(canonical_key_field(canonical, "cond") == "c0ffee");
  CHECK(canonical_key_field(canonical, "seed") == "7");
  CHECK(canonical_key_field(make_key(7).canonical(), "adapters").empty());
  CHECK(canonical_key_field(canonical, "dapters").empty());
}

TEST_CASE("entries larger than the RAM budget go to disk or are refused", "[store]") {
  auto entry = make_entry(kLayout, 7);
  SECTION("no disk tier: resource_exhausted") {
    auto store = ActivationStore::open(ram_only(kEntryBytes - 1));
    REQUIRE(store.ok());
    CHECK((*store)->put(make_key(0), entry).code() == ErrorCode::kResourceExhausted);
    CHECK((*store)->stats().ram_bytes == 0);
    CHECK_FALSE((*store)->contains(make_key(0)));
  }
  SECTION("with a disk tier: stored on disk, served without promotion") {
    TempDir dir;
    auto store = ActivationStore::open({.ram_budget_bytes = kEntryBytes - 1,
                                        .disk_dir = dir.path(), .disk_budget_bytes = kBigBudget});
    REQUIRE(store.ok());
    REQUIRE((*store)->put(make_key(0), entry).ok());
    CHECK((*store)->tier_of(make_key(0)) == Tier::kDisk);
    auto got = (*store)->get(make_key(0));
    REQUIRE(got.ok());
    CHECK(same_bits(**got, *entry));
    CHECK((*store)->stats().ram_bytes == 0);
    CHECK((*store)->stats().promotions == 0);
    CHECK((*store)->tier_of(make_key(0)) == Tier::kDisk);
  }
}

TEST_CASE("put validates its input and the newest put wins", "[store]") {
  TempDir dir;
  auto store = ActivationStore::open({.ram_budget_bytes = kBigBudget, .disk_dir = dir.path(),
                                      .disk_budget_bytes = kBigBudget, .write_through = true});
  REQUIRE(store.ok());
  CHECK((*store)->put(make_key(0), nullptr).code() == ErrorCode::kInvalidArgument);
  CHECK((*store)->put(make_key(0), make_entry({0, 1, 1, 1}, 1)).code() ==
        ErrorCode::kInvalidArgument);
  auto first = make_entry(kLayout, 1), second = make_entry(kLayout, 2);
  REQUIRE((*store)->put(make_key(0), first).ok());
  REQUIRE((*store)->put(make_key(0), second).ok());
  CHECK((*store)->stats().ram_bytes == kEntryBytes);
  CHECK((*store)->stats().ram_entries == 1);
  // The disk copy (write-through) is the second too, as a restart shows.
  store->reset();
  auto reopened = ActivationStore::open({.ram_budget_bytes = kBigBudget, .disk_dir = dir.path(),
                                         .disk_budget_bytes = kBigBudget});
  REQUIRE(reopened.ok());
  auto got = (*reopened)->get(make_key(0));
  REQUIRE(got.ok());
  CHECK(same_bits(**got, *second));
}

TEST_CASE("concurrent get, put, read_slab and erase keep the store consistent", "[store]") {
  TempDir dir;
  const size_t budget = 4 * kEntryBytes;
  auto store = ActivationStore::open({.ram_budget_bytes = budget, .disk_dir = dir.path(),
                                      .disk_budget_bytes = 10 * (kEntryBytes + 4096)});
  REQUIRE(store.ok());
  ActivationStore& s = **store;
  constexpr int kKeys = 16;
  // Content is a function of the key, so any entry served can be checked.
  std::vector<std::shared_ptr<ActivationEntry>> reference;
  for (int i = 0; i < kKeys; ++i) reference.push_back(make_entry(kLayout, 9000 + i));

  std::atomic<int> wrong{0}, errors{0}, budget_violations{0};
  auto worker = [&](int thread) {
    std::mt19937 rng(thread);
    std::uniform_int_distribution<int> id_of(0, kKeys - 1), op(0, 19);
    const size_t n = kLayout.slab_elements();
    std::vector<uint16_t> k(n), v(n);
    for (int i = 0; i < 400; ++i) {
      const int id = id_of(rng);
      const ActivationKey key = make_key(id);
      const int o = op(rng);
      if (o < 7) {
        if (!s.put(key, reference[id]).ok()) ++errors;
      } else if (o < 15) {
        auto got = s.get(key);
        if (got.ok() && !same_bits(**got, *reference[id])) ++wrong;
        if (!got.ok() && got.status().code() != ErrorCode::kNotFound) ++errors;
      } else if (o < 19) {
        const int step = static_cast<int>(rng() % 2), block = static_cast<int>(rng() % 3);
        const Status st = s.read_slab(key, step, block, k.data(), v.data());
        if (st.ok() && (std::memcmp(k.data(), reference[id]->k(step, block), n * 2) != 0 ||
                        std::memcmp(v.data(), reference[id]->v(step, block), n * 2) != 0)) {
          ++wrong;
        }
        if (!st.ok() && st.code() != ErrorCode::kNotFound) ++errors;
      } else {
        s.erase(key);
      }
      if (s.stats().ram_bytes > budget) ++budget_violations;
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back(worker, t);
  for (auto& t : threads) t.join();

  CHECK(wrong == 0);
  CHECK(errors == 0);
  CHECK(budget_violations == 0);
  const ActivationStoreStats st = s.stats();
  std::map<int, size_t> sizes;
  for (int i = 0; i < kKeys; ++i) sizes[i] = kEntryBytes;
  CHECK(st.ram_bytes == resident_bytes(s, sizes));
  CHECK(st.ram_bytes == st.ram_entries * kEntryBytes);
  CHECK(st.ram_bytes <= budget);
  CHECK(st.disk_bytes == files_bytes(dir.path()));
  CHECK(st.disk_bytes <= 10 * (kEntryBytes + 4096));
  CHECK(st.corrupt_dropped == 0);
}
