#pragma once
/// The device tier of the activation cache: entries of templates in active use copied to a
/// GPU within a byte budget, least recently used evicted first. Live painting edits one
/// template stroke after stroke; measured on an H200 (bench_flux2, klein 4B at 512x512), a
/// masked step reading its 786 MB of cached K/V from host memory took 107 ms against 10 ms
/// with the entry resident, and a full step 43 ms.
///
/// Out of device memory never fails an edit: the tier evicts every other entry and tries
/// once more, then gives up on that entry (the edit reads the host entry). An evicted entry's
/// device memory is freed when the last session reading it ends.
/// Threading: get() is called from the task pool (session set-up); one mutex, never held
/// while copying.

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>

#include "cache/activation_entry.h"
#include "common/status.h"
#include "model/compute_device.h"
#include "pipeline/device_kv_entry.h"

namespace infill {

struct DeviceKvTierStats {
  int64_t bytes = 0;      ///< held by the tier now
  int64_t entries = 0;
  int64_t hits = 0;
  int64_t uploads = 0;
  int64_t evictions = 0;
  int64_t failed_uploads = 0;  ///< out of device memory even after evicting everything
};

class DeviceKvTier {
 public:
  /// Copies an entry to the device in a dtype; DeviceKvEntry::upload by default (a test seam).
  using Uploader = std::function<Result<std::shared_ptr<const DeviceKvEntry>>(
      const ActivationEntry&, const ComputeDevice&, at::ScalarType)>;

  /// Entries are held in `dtype`: the compute dtype of the model reading them (a masked step
  /// then swaps its rows into them instead of converting a copy; DeviceKvEntry). The budget
  /// counts device bytes in that dtype.
  DeviceKvTier(ComputeDevice device, int64_t budget_bytes, at::ScalarType dtype = at::kHalf,
               Uploader uploader = DeviceKvEntry::upload);

  /// The device copy of `entry`, uploaded on first use; null when it is larger than the
  /// budget or the device has no room for it. Entries are told apart by identity (the store
  /// hands out one object per RAM-resident entry).
  std::shared_ptr<const DeviceKvEntry> get(const std::shared_ptr<const ActivationEntry>& entry);

  const ComputeDevice& device() const { return device_; }
  int64_t budget_bytes() const { return budget_bytes_; }
  at::ScalarType dtype() const { return dtype_; }
  DeviceKvTierStats stats() const;
  /// Frees the device copies of entries the activation store no longer holds (their host
  /// entries are gone: evicted, or erased with a deleted adapter's), which get() would never
  /// hand out again; otherwise they go only when the next upload needs room. Returns how many.
  int64_t drop_orphans();

 private:
  struct Slot {
    std::weak_ptr<const ActivationEntry> host;
    std::shared_ptr<const DeviceKvEntry> resident;
  };
  // Evicts least recently used slots until `needed` more bytes fit; drops slots whose host
  // entry is gone. Caller holds mu_.
  void make_room(int64_t needed);
  // drop_orphans() with mu_ held.
  int64_t drop_orphans_locked();

  const ComputeDevice device_;
  const int64_t budget_bytes_;
  const at::ScalarType dtype_;
  const Uploader upload_;
  mutable std::mutex mu_;
  std::list<Slot> lru_;  // most recently used first
  DeviceKvTierStats stats_;
};

}  // namespace infill
