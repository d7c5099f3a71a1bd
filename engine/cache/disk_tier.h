#pragma once
/// Disk tier of the activation cache: one file per entry in a directory, with its own byte
/// budget and LRU deletion; survives restarts; every byte it returns has been checksummed.
///
/// File format (version 1, little-endian), named `<key.digest()>.iact`:
///
///   offset 0   char[8]  magic "INFLACT\x1a"
///          8   u32      format version (1)
///         12   u32      key_bytes: length of the canonical key
///         16   i32 x4   steps, blocks, tokens, hidden
///         32   u64      header_bytes (H): size of the whole header, a multiple of 64
///         40   u64      slab_bytes: one (step, block) slab = K then V, 2 * tokens * hidden * 2
///         48   u64      file_bytes = H + steps * blocks * slab_bytes
///         56   u64      reserved (0)
///         64   char[key_bytes]          ActivationKey::canonical()
///              u64[steps * blocks * 2]  XXH64 of each K and each V, in (step, block, kv) order
///              zero padding
///      H - 8   u64      XXH64 of bytes [0, H - 8): covers every header byte above
///          H   slabs, (step, block) row-major, exactly ActivationEntry's memory layout
///
/// A reader trusts nothing it has not verified: a short file, bad magic or version, a key that
/// differs from the one asked for, or any checksum mismatch makes the entry corrupt. A corrupt
/// entry's file is deleted and counted; its data is never returned.
/// Files are written to a unique temporary name and renamed into place, so a concurrent reader
/// sees either the old or the new complete file. Durability is not forced (no fsync): after a
/// crash a damaged file is caught by the checks above.
///
/// Threading: all methods are thread-safe. One mutex guards the index; bulk reads and writes
/// never hold it. Renames and unlinks (metadata only) do, so the index and the directory never
/// disagree about which file is current.

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

#include "cache/activation_entry.h"
#include "common/status.h"

namespace infill {

/// $XDG_CACHE_HOME/infill/activations, else $HOME/.cache/infill/activations; empty when
/// neither variable is set (no disk tier).
std::string default_cache_dir();

struct DiskTierStats {
  size_t bytes = 0;            ///< sum of file sizes of indexed entries (headers included)
  size_t entries = 0;
  uint64_t evictions = 0;      ///< files deleted to respect the budget
  uint64_t corrupt_dropped = 0;
};

class DiskTier {
 public:
  /// Creates `dir` if needed and indexes the valid `*.iact` files in it (least recently
  /// modified first in LRU order), deleting files whose header is damaged and, if the total
  /// exceeds `budget_bytes`, the least recently used ones. Leftover temporary files older than
  /// an hour are removed. Fails with io_error if the directory cannot be created or listed.
  static Result<std::unique_ptr<DiskTier>> open(const std::string& dir, size_t budget_bytes);

  /// Writes `entry` under `key`, replacing any previous file of that key, then deletes least
  /// recently used files until the tier fits its budget. resource_exhausted if the file alone
  /// exceeds the budget; io_error if writing fails (nothing is left behind).
  Status write(const ActivationKey& key, const ActivationEntry& entry);

  /// Reads and verifies the whole entry. not_found if absent; corrupt_data (and the file is
  /// deleted) if any check fails. A hit makes the entry most recently used. The entry's memory
  /// comes from `allocate` (plain host memory when empty).
  Result<std::shared_ptr<ActivationEntry>> read(const ActivationKey& key, const HostAllocator& allocate = {});

  /// Reads one (step, block) slab without reading the rest of the file; verifies the header
  /// and that slab's checksum. k_out and v_out each receive tokens * hidden fp16 values.
  /// Errors as read(); out_of_range for a step or block outside the entry's layout.
  Status read_slab(const ActivationKey& key, int step, int block, uint16_t* k_out,
                   uint16_t* v_out);

  bool contains(const ActivationKey& key) const;
  /// Layout of the entry stored under `key`, if any.
  std::optional<ActivationLayout> layout_of(const ActivationKey& key) const;
  /// Deletes the entry's file if present.
  void erase(const ActivationKey& key);
  /// Deletes every file whose key's canonical form satisfies `match`; returns how many.
  size_t erase_if(const std::function<bool(std::string_view canonical)>& match);
  DiskTierStats stats() const;
  size_t budget_bytes() const { return budget_bytes_; }
  const std::string& dir() const { return dir_; }
  /// Path of the file that holds (or would hold) `key`'s entry. For tests and tools.
  std::string path_of(const ActivationKey& key) const;

 private:
  // The index is keyed by file stem (the key's digest), so that a file whose digest collides
  // with another key's is simply replaced; the canonical key inside decides every match.
  struct IndexEntry {
    std::string canonical;
    ActivationLayout layout;
    size_t file_bytes = 0;
    std::list<std::string>::iterator lru;  // into lru_, most recent at the front
  };

  DiskTier(std::string dir, size_t budget_bytes) : dir_(std::move(dir)), budget_bytes_(budget_bytes) {}
  Status scan();
  // Deletes the file at `path` iff it is still the inode `ino` that was found corrupt, and
  // drops it from the index; counts it.
  void drop_corrupt(const std::string& stem, uint64_t dev, uint64_t ino);
  // Forgets an index entry whose file vanished behind our back (deleted by hand).
  void forget_missing(const std::string& stem);
  void evict_over_budget_locked();
  void remove_locked(const std::string& stem, bool unlink_file);
  std::string path_of_stem(const std::string& stem) const;

  const std::string dir_;
  const size_t budget_bytes_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, IndexEntry> index_;  // by file stem
  std::list<std::string> lru_;                         // file stems
  size_t bytes_ = 0;
  uint64_t evictions_ = 0;
  uint64_t corrupt_dropped_ = 0;
};

}  // namespace infill
