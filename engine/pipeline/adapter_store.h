#pragma once
/// The engine's LoRA files (`POST /v1/adapters`) in three tiers, as Katz keeps its adapters:
/// - on disk under its id (the SHA-256 of its bytes: `<dir>/<id>.safetensors`, with `<id>.json`
///   holding the name it was uploaded under); files already in `dir` at open are listed (the
///   store outlives the process);
/// - in host memory, as a model reads it (`EditModel::read_adapter`: on a GPU in the compute
///   dtype and pinned): an LRU of (adapter, model) within a byte budget, so the edits of a live
///   session read the file once;
/// - on the model's device (`EditModel::adapter_on_device`, copied on a copy stream): an LRU of
///   (adapter, model, device) within a byte budget of its own. A model on the CPU reads the host
///   form itself: its adapters have no device tier.
///
/// An upload is read for the model it is meant for before it is kept: a file the model cannot
/// use (another format, another size, damaged) is refused with the error naming the upload and
/// the key, and nothing is written. The same bytes uploaded twice are one adapter.
///
/// An edit whose adapters are not all ready on its model's device has them read and copied on
/// the service's pool while it is encoded and runs its first steps (pipeline/adapter_load.h).
///
/// Threading: every method is safe from any thread; files are read and written outside the
/// store's mutex (on the caller's thread: the service pool, never the step loop).

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "model/lora_adapter.h"
#include "pipeline/adapter_store_stats.h"

namespace infill {

class EditModel;

/// What the store knows of a file.
struct StoredAdapter {
  std::string id;    ///< SHA-256 of the file's bytes
  std::string name;  ///< the name it was uploaded under ("" when none was given)
  int64_t file_bytes = 0;
  /// As read for the model that checked the upload (empty for files found at open until one
  /// is read): "upstream", "kohya" or "diffusers", the ranks and the layers adapted.
  std::string format;
  int64_t min_rank = 0;
  int64_t max_rank = 0;
  int64_t layers = 0;
};

/// The byte budgets of the memory tiers.
struct AdapterBudgets {
  int64_t host_bytes = int64_t{2} << 30;
  int64_t device_bytes = int64_t{1} << 30;
};

class AdapterStore {
 public:
  /// Opens (creating it when missing) the folder `dir`. An adapter larger than a tier's
  /// budget is still returned, not kept there.
  static Result<std::shared_ptr<AdapterStore>> open(const std::string& dir, AdapterBudgets budgets);

  /// Reads `bytes` for `model` and keeps the file (and the host form); `name` names the upload
  /// in errors. `created` is false when the same bytes were already there.
  Result<StoredAdapter> add(std::string_view bytes, const std::string& name, const EditModel& model, bool& created);
  /// Every file, by id.
  std::vector<StoredAdapter> list() const;
  std::optional<StoredAdapter> find(const std::string& id) const;
  /// Removes the file and what was read from it in every tier (edits holding the adapter keep
  /// it until they end); not_found naming an unknown id.
  Status remove(const std::string& id);
  /// The adapter `id` as `model`'s forward reads it: from the device tier, else copied there
  /// from the host tier, else read from its file first. not_found naming an unknown id; the
  /// model's error (naming the key) when the file does not fit it; resource_exhausted when the
  /// device has no room for it.
  Result<std::shared_ptr<const LoraAdapter>> get(const std::string& id, const EditModel& model);
  /// Whether `get(id, model)` would answer at once (neither a file read nor a copy).
  bool ready(const std::string& id, const EditModel& model) const;
  /// Each (id, strength) of `ids` for `model`, in order.
  Result<AdapterSet> resolve(const std::vector<std::pair<std::string, double>>& ids, const EditModel& model);

  AdapterStoreStats stats() const;
  const std::string& dir() const { return dir_; }

 private:
  // One memory tier: key -> adapter, most recently used first, within a byte budget.
  struct Tier {
    int64_t budget = 0;
    int64_t bytes = 0;
    std::list<std::pair<std::string, std::shared_ptr<const LoraAdapter>>> lru;
    std::map<std::string, decltype(lru)::iterator> index;
    AdapterTierStats counts;
    /// The adapter under `key`, made most recent; null when absent.
    std::shared_ptr<const LoraAdapter> find(const std::string& key);
    void hold(const std::string& key, std::shared_ptr<const LoraAdapter> adapter);
    void drop_id(const std::string& id);
    AdapterTierStats stats() const;
  };

  AdapterStore(std::string dir, AdapterBudgets budgets);
  std::string file_of(const std::string& id) const;

  const std::string dir_;
  mutable std::mutex mu_;  // guards what follows; never held while reading a file or copying
  std::map<std::string, StoredAdapter> files_;
  Tier host_;    // keys: id '\n' model id
  Tier device_;  // keys: id '\n' model id '\n' device
};

}  // namespace infill
