#pragma once
/// The models an engine serves, the serving runtime of their device (one step loop per
/// worker, every worker serving every model) and the activation store they share (its keys
/// include the model id). Slot 0 is the default model; an edit names another by id.
///
/// Torch-free header. Threading: built once by load(); afterwards read-only (the runtimes'
/// own methods are thread-safe) until stop().

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace infill {

class ActivationStore;
class EditModel;
class ServingRuntime;
struct ServiceMetrics;

struct ModelRegistryOptions {
  /// Model folders; the first is the default model.
  std::vector<std::string> paths;
  /// "cpu", "cuda" or "cuda:N": where every model computes; errors name the device.
  std::string device = "cpu";
  int workers = 1;
  int threads_per_worker = 1;
  int pool_threads = 1;
  std::string cache_dir;  ///< the store's disk tier; "" = RAM only
  uint64_t ram_cache_bytes = uint64_t{1} << 30;
  /// Time each DiT-family model's step cost at load (cached per model, see
  /// calibration_path_for); false = fixed plausible coefficients.
  bool calibrate = false;
  std::string calibration_path;
  /// Test seam handed to every worker (WorkerOptions::before_step).
  std::function<void(std::span<const uint64_t> ids)> before_step;
  /// Test seam handed to every worker (WorkerOptions::may_step).
  std::function<bool(size_t ready)> may_step;
};

/// The calibration cache of the model at `index`: `path` for the default model,
/// "<stem>.<index><ext>" for the others (each file holds one model's timings).
std::string calibration_path_for(const std::string& path, size_t index);

class ModelRegistry {
 public:
  /// Loads every model, opens the store, builds each model's cost model on the device and
  /// starts the workers. Two folders holding the same model (same id) are an error naming both.
  static Result<std::unique_ptr<ModelRegistry>> load(const ModelRegistryOptions& options);
  ~ModelRegistry();
  ModelRegistry(const ModelRegistry&) = delete;
  ModelRegistry& operator=(const ModelRegistry&) = delete;

  size_t size() const;
  const EditModel& model(size_t slot) const;
  /// The same, to hand to a request (ServingRequest::model).
  std::shared_ptr<const EditModel> shared_model(size_t slot) const;
  const std::string& id(size_t slot) const;
  /// Runs the edits of every model; null after stop().
  ServingRuntime& runtime() const;
  ActivationStore& store() const;
  /// The slot of the model with `id`, or -1.
  int find(const std::string& id) const;
  /// "a, b": the loaded ids, for messages.
  std::string ids_text() const;
  /// `GET /v1/models`'s list; `max_image_pixels` is the server's own upload limit.
  nlohmann::json models_json(int64_t max_image_pixels) const;
  /// Adds the workers, their loads and recent requests, and the store's statistics.
  void collect(ServiceMetrics& m) const;
  /// Waits up to `budget_ms` for all edits to end.
  bool drain(double budget_ms) const;
  /// Stops the runtime (its callbacks stop before this returns); the models stay.
  void stop();

 private:
  ModelRegistry() = default;
  struct Slot;
  std::vector<Slot> slots_;
  std::shared_ptr<ActivationStore> store_;
  std::unique_ptr<ServingRuntime> runtime_;
};

}  // namespace infill
