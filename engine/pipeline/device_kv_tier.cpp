#include "pipeline/device_kv_tier.h"

#include <utility>

namespace infill {

DeviceKvTier::DeviceKvTier(ComputeDevice device, int64_t budget_bytes, at::ScalarType dtype, Uploader uploader)
    : device_(device), budget_bytes_(budget_bytes), dtype_(dtype), upload_(std::move(uploader)) {}

DeviceKvTierStats DeviceKvTier::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

int64_t DeviceKvTier::drop_orphans() {
  std::lock_guard lock(mu_);
  return drop_orphans_locked();
}

int64_t DeviceKvTier::drop_orphans_locked() {
  int64_t dropped = 0;
  for (auto it = lru_.begin(); it != lru_.end();) {
    if (it->host.expired()) {
      stats_.bytes -= it->resident->bytes();
      --stats_.entries;
      ++stats_.evictions;
      ++dropped;
      it = lru_.erase(it);
    } else {
      ++it;
    }
  }
  return dropped;
}

void DeviceKvTier::make_room(int64_t needed) {
  drop_orphans_locked();
  while (!lru_.empty() && stats_.bytes + needed > budget_bytes_) {
    stats_.bytes -= lru_.back().resident->bytes();
    --stats_.entries;
    ++stats_.evictions;
    lru_.pop_back();
  }
}

std::shared_ptr<const DeviceKvEntry> DeviceKvTier::get(const std::shared_ptr<const ActivationEntry>& entry) {
  if (!entry) return nullptr;
  const int64_t bytes = device_kv_bytes(static_cast<int64_t>(entry->bytes()), dtype_);
  {
    std::lock_guard lock(mu_);
    for (auto it = lru_.begin(); it != lru_.end(); ++it) {
      if (it->host.lock() == entry) {
        lru_.splice(lru_.begin(), lru_, it);
        ++stats_.hits;
        return it->resident;
      }
    }
    if (bytes > budget_bytes_) return nullptr;
    make_room(bytes);
  }
  // Copied outside the lock: a 3 GB entry takes a while, and other templates' sessions may
  // be set up meanwhile (two of the same entry may both upload; the second is dropped).
  auto uploaded = upload_(*entry, device_, dtype_);
  if (!uploaded.ok()) {
    // Out of device memory (or another failure): make room for the entry alone, once.
    {
      std::lock_guard lock(mu_);
      make_room(budget_bytes_);
    }
    uploaded = upload_(*entry, device_, dtype_);
  }
  std::lock_guard lock(mu_);
  if (!uploaded.ok()) {
    ++stats_.failed_uploads;
    return nullptr;
  }
  for (const Slot& slot : lru_) {
    if (slot.host.lock() == entry) return slot.resident;  // uploaded meanwhile by another set-up
  }
  make_room(bytes);
  lru_.push_front(Slot{entry, *uploaded});
  stats_.bytes += bytes;
  ++stats_.entries;
  ++stats_.uploads;
  return *uploaded;
}

}  // namespace infill
