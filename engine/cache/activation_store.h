#pragma once
/// The activation store: prepared templates' per-step, per-block K/V (ActivationEntry), keyed
/// by content (ActivationKey), in a RAM tier with a byte budget and LRU eviction that spills to
/// an optional disk tier (DiskTier) and promotes back on a hit.
///
/// Tiers:
/// - RAM: `ram_bytes` is the exact sum of ActivationEntry::bytes() over RAM-resident entries
///   and never exceeds `ram_budget_bytes` once a call returns. Memory actually held can be
///   higher for a while: callers may keep entries alive through their shared_ptr, and an
///   evicted entry stays readable (and allocated) until its disk write finishes.
/// - Disk: inclusive. An entry promoted to RAM keeps its file, so evicting it again costs no
///   write; the disk tier has its own budget and LRU. Without a disk tier, evicted entries are
///   dropped.
/// A key determines its content; put() of a key replaces the entry in RAM and discards any
/// older disk copy.
///
/// Threading: every method is thread-safe. One mutex guards the RAM maps and counters; it is
/// never held during disk I/O or while copying entry data. Eviction writes happen on the
/// calling thread after the lock is released, so put() and get() may block on disk; callers
/// on the step loop should use read_slab() on prefetch threads or pre-promoted entries.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "cache/activation_entry.h"
#include "cache/disk_tier.h"
#include "common/status.h"

namespace infill {

enum class Tier : uint8_t {
  kRam = 1,
  kDisk = 2,
};

/// "ram" / "disk".
const char* tier_name(Tier tier);

struct ActivationStoreOptions {
  size_t ram_budget_bytes = size_t{2} << 30;
  std::string disk_dir;  ///< empty = no disk tier; see default_cache_dir()
  size_t disk_budget_bytes = size_t{20} << 30;
  /// put() also writes the entry to disk at once, so it survives a restart without waiting
  /// for eviction or flush(). Off by default: the write then happens only when needed.
  bool write_through = false;
  /// The memory of entries read back from disk (plain host memory when empty). A store that
  /// feeds a GPU worker allocates pinned memory (pipeline/pinned_host_memory.h), as the
  /// prepare runs on that GPU do for the entries they record.
  HostAllocator entry_allocator = nullptr;
};

struct ActivationStoreStats {
  size_t ram_bytes = 0;
  size_t ram_entries = 0;
  size_t disk_bytes = 0;  ///< file sizes, headers included
  size_t disk_entries = 0;
  uint64_t hits_ram = 0;
  uint64_t hits_disk = 0;
  uint64_t misses = 0;             ///< get() found nothing usable (absent, corrupt or unreadable)
  uint64_t evictions_to_disk = 0;  ///< RAM victims now on disk (written, or already there)
  uint64_t evictions_dropped = 0;  ///< RAM victims lost: no disk tier, or the write failed
  uint64_t promotions = 0;         ///< disk hits copied into RAM
  uint64_t corrupt_dropped = 0;    ///< disk files found damaged and deleted
  uint64_t disk_evictions = 0;     ///< files deleted to respect the disk budget
};

class ActivationStore {
 public:
  /// Opens the disk tier (creating and indexing `options.disk_dir`) if one is configured.
  static Result<std::unique_ptr<ActivationStore>> open(ActivationStoreOptions options);

  /// Stores `entry` under `key` (most recently used). Entries larger than the RAM budget go
  /// straight to disk, or fail with resource_exhausted without a disk tier. Evicts least
  /// recently used entries until the RAM tier fits its budget. invalid_argument for a null
  /// entry or an empty layout.
  Status put(const ActivationKey& key, std::shared_ptr<const ActivationEntry> entry);

  /// RAM hit: the entry, made most recently used. Disk hit: read, verified and promoted to
  /// RAM when it fits the budget (possibly evicting others). Otherwise not_found, or
  /// corrupt_data if a damaged file was found (and deleted); never damaged data.
  Result<std::shared_ptr<const ActivationEntry>> get(const ActivationKey& key);

  /// Copies one (step, block) slab, K and V each [tokens, hidden] fp16, from RAM if resident,
  /// else straight from its disk file (verified, without promoting the entry).
  Status read_slab(const ActivationKey& key, int step, int block, uint16_t* k_out,
                   uint16_t* v_out);

  bool contains(const ActivationKey& key) const;
  std::optional<Tier> tier_of(const ActivationKey& key) const;
  std::optional<ActivationLayout> layout_of(const ActivationKey& key) const;
  /// Removes the entry from every tier.
  void erase(const ActivationKey& key);
  /// Removes from every tier each entry whose key's canonical form (ActivationKey::canonical)
  /// satisfies `match`: the entries recorded with an adapter the user deleted, say. Returns how
  /// many distinct keys it removed.
  size_t erase_if(const std::function<bool(std::string_view canonical)>& match);
  /// Writes every RAM-resident entry that has no disk copy (e.g. before shutdown).
  /// Returns the first error; no-op without a disk tier.
  Status flush();

  ActivationStoreStats stats() const;
  const ActivationStoreOptions& options() const { return options_; }
  /// The disk tier, or nullptr. For tools and tests.
  DiskTier* disk_tier() const { return disk_.get(); }

 private:
  struct RamNode {
    ActivationKey key;
    std::shared_ptr<const ActivationEntry> entry;
    std::list<std::string>::iterator lru;  // into lru_
  };
  // An entry evicted from RAM whose disk write has not finished; still served by get().
  struct Spilling {
    std::shared_ptr<const ActivationEntry> entry;
    bool erased = false;  // erase() ran meanwhile: delete the file once written
  };
  struct Victim {
    std::string canonical;
    ActivationKey key;
    std::shared_ptr<const ActivationEntry> entry;
  };

  explicit ActivationStore(ActivationStoreOptions options) : options_(std::move(options)) {}
  // Inserts or replaces under mu_, then pops LRU victims until the budget holds.
  std::vector<Victim> insert_locked(const std::string& canonical, const ActivationKey& key,
                                    std::shared_ptr<const ActivationEntry> entry);
  void remove_ram_locked(const std::string& canonical);
  // Writes victims to disk (or drops them) without holding mu_.
  void spill(std::vector<Victim> victims);

  const ActivationStoreOptions options_;
  std::unique_ptr<DiskTier> disk_;

  mutable std::mutex mu_;
  std::unordered_map<std::string, RamNode> ram_;  // by canonical key
  std::list<std::string> lru_;                    // canonical keys, most recent first
  std::unordered_map<std::string, Spilling> spilling_;
  size_t ram_bytes_ = 0;
  // Bumped by every erase(): a disk read that started before an erase must not promote
  // (resurrect) what it read.
  uint64_t erase_epoch_ = 0;
  uint64_t hits_ram_ = 0;
  uint64_t hits_disk_ = 0;
  uint64_t misses_ = 0;
  uint64_t evictions_to_disk_ = 0;
  uint64_t evictions_dropped_ = 0;
  uint64_t promotions_ = 0;
};

}  // namespace infill
