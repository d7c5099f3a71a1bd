#pragma once
/// The engine's LoRA files (`POST /v1/adapters`): each kept on disk under its id (the SHA-256
/// of its bytes: `<dir>/<id>.safetensors`, with `<id>.json` holding the name it was uploaded
/// under), and, once read for a model (`EditModel::read_adapter`), in host memory: an LRU of
/// (adapter, model) within a byte budget, so the edits of a live session read the file once.
/// Files already in `dir` at open are listed (the store outlives the process).
///
/// An upload is read for the model it is meant for before it is kept: a file the model cannot
/// use (another format, another size, damaged) is refused with the error naming the upload and
/// the key, and nothing is written. The same bytes uploaded twice are one adapter.
///
/// An edit whose adapters are not all in memory has them read on the service's pool while it
/// is encoded and runs its first steps (pipeline/adapter_load.h). Not yet: a device tier of
/// its own (on a GPU, adapters are held there by the host tier's entries, read_adapter moving
/// them once) and copies on a separate copy stream.
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

struct AdapterStoreStats {
  size_t files = 0;
  int64_t host_bytes = 0;   ///< adapters read and held in memory
  int64_t host_budget = 0;
  uint64_t host_hits = 0;
  uint64_t host_misses = 0;  ///< reads of a file
  uint64_t host_evictions = 0;
};

class AdapterStore {
 public:
  /// Opens (creating it when missing) the folder `dir`; `host_bytes` bounds the adapters held
  /// in memory (one larger than the budget is still returned, not kept).
  static Result<std::shared_ptr<AdapterStore>> open(const std::string& dir, int64_t host_bytes);

  /// Reads `bytes` for `model` and keeps the file; `name` names the upload in errors.
  /// `created` is false when the same bytes were already there.
  Result<StoredAdapter> add(std::string_view bytes, const std::string& name, const EditModel& model, bool& created);
  /// Every file, by id.
  std::vector<StoredAdapter> list() const;
  std::optional<StoredAdapter> find(const std::string& id) const;
  /// Removes the file and what was read from it (edits holding the adapter keep it until they
  /// end); not_found naming an unknown id.
  Status remove(const std::string& id);
  /// The adapter `id` as `model` reads it: from memory, else from its file. not_found naming
  /// an unknown id; the model's error (naming the key) when the file does not fit it.
  Result<std::shared_ptr<const LoraAdapter>> get(const std::string& id, const EditModel& model);
  /// Whether `get(id, model)` would answer from memory (no file read).
  bool in_memory(const std::string& id, const EditModel& model) const;
  /// Each (id, strength) of `ids` read for `model`, in order.
  Result<AdapterSet> resolve(const std::vector<std::pair<std::string, double>>& ids, const EditModel& model);

  AdapterStoreStats stats() const;
  const std::string& dir() const { return dir_; }

 private:
  AdapterStore(std::string dir, int64_t host_bytes) : dir_(std::move(dir)), host_budget_(host_bytes) {}
  std::string file_of(const std::string& id) const;
  void hold_locked(const std::string& key, std::shared_ptr<const LoraAdapter> adapter);

  const std::string dir_;
  const int64_t host_budget_;
  mutable std::mutex mu_;  // guards what follows; never held while reading or writing a file
  std::map<std::string, StoredAdapter> files_;
  // (id + '\n' + model id) -> adapter, most recently used first.
  std::list<std::pair<std::string, std::shared_ptr<const LoraAdapter>>> held_;
  std::map<std::string, decltype(held_)::iterator> held_index_;
  int64_t host_bytes_ = 0;
  uint64_t hits_ = 0, misses_ = 0, evictions_ = 0;
};

}  // namespace infill
