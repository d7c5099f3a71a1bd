#pragma once
/// An edit's adapters while their files are read: Katz's bounded asynchronous loading. The
/// set's ids and strengths are known at once, so its cache keys need no file; the adapters
/// arrive when the service's pool has read them. An edit carrying a load runs the steps of its
/// schedule before EditParams::adapters_from_step (Katz's K) without adapters, as every edit
/// with that K does, and the worker leaves it out of rounds from step K until the load is done
/// (its prepare run likewise), so a cold adapter holds up neither the step loop nor the other
/// requests: only, beyond K steps of lead, its own.
/// Threading: every method is safe from any thread.

#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "model/lora_adapter.h"

namespace infill {

class AdapterLoad {
 public:
  /// The set being read: (adapter id, strength) in order.
  explicit AdapterLoad(std::vector<std::pair<std::string, double>> uses);

  /// adapter_set_key of the set once read (the same text).
  const std::string& key() const { return key_; }
  /// Called once, by whoever read the files.
  void finish(Result<AdapterSet> set);
  bool ready() const;
  /// The set, or the reading's error; unavailable while not ready().
  Result<AdapterSet> result() const;
  /// The reading's error once it failed; ok while reading and once read (no copy of the set).
  Status failure() const;

 private:
  const std::string key_;
  mutable std::mutex mu_;
  std::optional<Result<AdapterSet>> result_;
};

/// Whether an edit at schedule step `step` applies its adapters (steps before `from_step` do not).
inline bool adapters_apply_at(int step, int from_step) { return step >= from_step; }

}  // namespace infill
