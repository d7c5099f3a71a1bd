#include "cache/activation_store.h"

#include <cstring>
#include <set>
#include <utility>

namespace infill {

const char* tier_name(Tier tier) {
  switch (tier) {
    case Tier::kRam: return "ram";
    case Tier::kDisk: return "disk";
  }
  return "unknown";
}

Result<std::unique_ptr<ActivationStore>> ActivationStore::open(ActivationStoreOptions options) {
  std::unique_ptr<ActivationStore> store(new ActivationStore(std::move(options)));
  if (!store->options_.disk_dir.empty()) {
    INFILL_ASSIGN_OR_RETURN(store->disk_, DiskTier::open(store->options_.disk_dir,
                                                         store->options_.disk_budget_bytes));
  }
  return store;
}

void ActivationStore::remove_ram_locked(const std::string& canonical) {
  auto it = ram_.find(canonical);
  if (it == ram_.end()) return;
  ram_bytes_ -= it->second.entry->bytes();
  lru_.erase(it->second.lru);
  ram_.erase(it);
}

std::vector<ActivationStore::Victim> ActivationStore::insert_locked(
    const std::string& canonical, const ActivationKey& key,
    std::shared_ptr<const ActivationEntry> entry) {
  remove_ram_locked(canonical);
  lru_.push_front(canonical);
  ram_bytes_ += entry->bytes();
  ram_.emplace(canonical, RamNode{key, std::move(entry), lru_.begin()});

  // The new entry fits the budget on its own and sits at the front, so it is never a victim.
  std::vector<Victim> victims;
  while (ram_bytes_ > options_.ram_budget_bytes) {
    const std::string oldest = lru_.back();
    auto it = ram_.find(oldest);
    Victim victim{oldest, std::move(it->second.key), std::move(it->second.entry)};
    ram_bytes_ -= victim.entry->bytes();
    lru_.pop_back();
    ram_.erase(it);
    if (disk_ != nullptr) spilling_[oldest] = Spilling{victim.entry, false};
    victims.push_back(std::move(victim));
  }
  return victims;
}

void ActivationStore::spill(std::vector<Victim> victims) {
  for (Victim& victim : victims) {
    bool on_disk = false;
    if (disk_ != nullptr) {
      on_disk = disk_->contains(victim.key) || disk_->write(victim.key, *victim.entry).ok();
    }
    bool erased = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      (on_disk ? evictions_to_disk_ : evictions_dropped_)++;
      auto it = spilling_.find(victim.canonical);
      if (it != spilling_.end() && it->second.entry == victim.entry) {
        erased = it->second.erased;
        spilling_.erase(it);
      }
    }
    if (erased && on_disk) disk_->erase(victim.key);
  }
}

Status ActivationStore::put(const ActivationKey& key,
                            std::shared_ptr<const ActivationEntry> entry) {
  const std::string canonical = key.canonical();
  if (entry == nullptr) return invalid_argument("put(" + canonical + "): entry is null");
  const ActivationLayout& layout = entry->layout();
  if (layout.steps <= 0 || layout.blocks <= 0 || layout.tokens <= 0 || layout.hidden <= 0) {
    return invalid_argument("put(" + canonical + "): layout " + std::to_string(layout.steps) +
                            "x" + std::to_string(layout.blocks) + "x" +
                            std::to_string(layout.tokens) + "x" + std::to_string(layout.hidden) +
                            "; expected positive steps, blocks, tokens and hidden");
  }

  // The newest put wins: an older disk copy of this key must not outlive it.
  if (disk_ != nullptr) disk_->erase(key);

  if (entry->bytes() > options_.ram_budget_bytes) {
    if (disk_ == nullptr) {
      return Status(ErrorCode::kResourceExhausted,
                    "put(" + canonical + "): entry is " + std::to_string(entry->bytes()) +
                        " bytes, above the RAM budget of " +
                        std::to_string(options_.ram_budget_bytes) + " and there is no disk tier");
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      remove_ram_locked(canonical);
    }
    return disk_->write(key, *entry);
  }

  std::vector<Victim> victims;
  {
    std::lock_guard<std::mutex> lock(mu_);
    victims = insert_locked(canonical, key, entry);
  }
  spill(std::move(victims));
  if (options_.write_through && disk_ != nullptr) return disk_->write(key, *entry);
  return Status::success();
}

Result<std::shared_ptr<const ActivationEntry>> ActivationStore::get(const ActivationKey& key) {
  const std::string canonical = key.canonical();
  uint64_t epoch = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    epoch = erase_epoch_;
    if (auto it = ram_.find(canonical); it != ram_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second.lru);
      ++hits_ram_;
      return it->second.entry;
    }
    if (auto it = spilling_.find(canonical); it != spilling_.end() && !it->second.erased) {
      ++hits_ram_;
      return it->second.entry;
    }
    if (disk_ == nullptr) {
      ++misses_;
      return not_found("no cached activations for " + canonical);
    }
  }

  auto read = disk_->read(key, options_.entry_allocator);
  if (!read.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    ++misses_;
    return read.status();
  }
  std::shared_ptr<const ActivationEntry> entry = std::move(read).value();

  std::vector<Victim> victims;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++hits_disk_;
    if (auto it = ram_.find(canonical); it != ram_.end()) {
      // A concurrent get or put got there first; share its copy.
      lru_.splice(lru_.begin(), lru_, it->second.lru);
      return it->second.entry;
    }
    if (entry->bytes() <= options_.ram_budget_bytes && epoch == erase_epoch_) {
      ++promotions_;
      victims = insert_locked(canonical, key, entry);
    }
  }
  spill(std::move(victims));
  return entry;
}

Status ActivationStore::read_slab(const ActivationKey& key, int step, int block,
                                  uint16_t* k_out, uint16_t* v_out) {
  const std::string canonical = key.canonical();
  std::shared_ptr<const ActivationEntry> entry;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = ram_.find(canonical); it != ram_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second.lru);
      entry = it->second.entry;
    } else if (auto sit = spilling_.find(canonical);
               sit != spilling_.end() && !sit->second.erased) {
      entry = sit->second.entry;
    }
  }
  if (entry == nullptr) {
    if (disk_ == nullptr) return not_found("no cached activations for " + canonical);
    return disk_->read_slab(key, step, block, k_out, v_out);
  }
  const ActivationLayout& layout = entry->layout();
  if (step < 0 || step >= layout.steps || block < 0 || block >= layout.blocks) {
    return out_of_range("slab (step " + std::to_string(step) + ", block " +
                        std::to_string(block) + ") is outside the cached layout of " +
                        std::to_string(layout.steps) + " steps x " +
                        std::to_string(layout.blocks) + " blocks");
  }
  const size_t bytes = layout.slab_elements() * sizeof(uint16_t);
  std::memcpy(k_out, entry->k(step, block), bytes);
  std::memcpy(v_out, entry->v(step, block), bytes);
  return Status::success();
}

bool ActivationStore::contains(const ActivationKey& key) const { return tier_of(key).has_value(); }

std::optional<Tier> ActivationStore::tier_of(const ActivationKey& key) const {
  const std::string canonical = key.canonical();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (ram_.count(canonical) != 0) return Tier::kRam;
    // On its way to disk; get() still serves it from memory.
    if (auto it = spilling_.find(canonical); it != spilling_.end() && !it->second.erased) {
      return Tier::kDisk;
    }
  }
  if (disk_ != nullptr && disk_->contains(key)) return Tier::kDisk;
  return std::nullopt;
}

std::optional<ActivationLayout> ActivationStore::layout_of(const ActivationKey& key) const {
  const std::string canonical = key.canonical();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = ram_.find(canonical); it != ram_.end()) return it->second.entry->layout();
    if (auto it = spilling_.find(canonical); it != spilling_.end() && !it->second.erased) {
      return it->second.entry->layout();
    }
  }
  if (disk_ != nullptr) return disk_->layout_of(key);
  return std::nullopt;
}

void ActivationStore::erase(const ActivationKey& key) {
  const std::string canonical = key.canonical();
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++erase_epoch_;
    remove_ram_locked(canonical);
    if (auto it = spilling_.find(canonical); it != spilling_.end()) it->second.erased = true;
  }
  if (disk_ != nullptr) disk_->erase(key);
}

size_t ActivationStore::erase_if(const std::function<bool(std::string_view canonical)>& match) {
  std::set<std::string> erased;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++erase_epoch_;  // a disk read in flight does not bring one back into RAM
    std::vector<std::string> resident;
    for (const auto& [canonical, node] : ram_)
      if (match(canonical)) resident.push_back(canonical);
    for (const std::string& canonical : resident) remove_ram_locked(canonical);
    erased.insert(resident.begin(), resident.end());
    // Being written to disk: the file goes once written (spill()).
    for (auto& [canonical, spilling] : spilling_) {
      if (match(canonical)) {
        spilling.erased = true;
        erased.insert(canonical);
      }
    }
  }
  if (disk_ != nullptr) {
    disk_->erase_if([&](std::string_view canonical) {
      if (!match(canonical)) return false;
      erased.insert(std::string(canonical));
      return true;
    });
  }
  return erased.size();
}

Status ActivationStore::flush() {
  if (disk_ == nullptr) return Status::success();
  std::vector<std::pair<ActivationKey, std::shared_ptr<const ActivationEntry>>> resident;
  {
    std::lock_guard<std::mutex> lock(mu_);
    resident.reserve(ram_.size());
    for (const auto& [canonical, node] : ram_) resident.emplace_back(node.key, node.entry);
  }
  Status first;
  for (const auto& [key, entry] : resident) {
    if (disk_->contains(key)) continue;
    Status status = disk_->write(key, *entry);
    if (!status.ok() && first.ok()) first = std::move(status);
  }
  return first;
}

ActivationStoreStats ActivationStore::stats() const {
  ActivationStoreStats s;
  if (disk_ != nullptr) {
    const DiskTierStats d = disk_->stats();
    s.disk_bytes = d.bytes;
    s.disk_entries = d.entries;
    s.corrupt_dropped = d.corrupt_dropped;
    s.disk_evictions = d.evictions;
  }
  std::lock_guard<std::mutex> lock(mu_);
  s.ram_bytes = ram_bytes_;
  s.ram_entries = ram_.size();
  s.hits_ram = hits_ram_;
  s.hits_disk = hits_disk_;
  s.misses = misses_;
  s.evictions_to_disk = evictions_to_disk_;
  s.evictions_dropped = evictions_dropped_;
  s.promotions = promotions_;
  return s;
}

}  // namespace infill
