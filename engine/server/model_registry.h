#pragma once
/// The models an engine serves, the serving runtime of its devices (one step loop per
/// worker, every worker serving every model as loaded on its device) and the activation store
/// they share (its keys include the model id). Slot 0 is the default model; an edit names
/// another by id.
///
/// Several devices (`device` a list, serving/device_list.h): every model is loaded on each GPU
/// (CPU devices share one copy). A device that cannot hold the models (the load fails with out
/// of memory or another device fault: ErrorCode::kResourceExhausted, or a text that
/// classify_device_fault knows) is left out: the engine serves on the others and devices()
/// names it with its fault (/health says `degraded`). With no device left, or any other
/// error (the model's own), the load fails naming the device.
///
/// Torch-free header. Threading: built once by load(); afterwards read-only (the runtimes'
/// own methods are thread-safe) until stop().

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "server/server_config.h"

namespace infill {

class ActivationStore;
class EditModel;
class ServingRuntime;
struct ServiceDevice;
struct ServiceMetrics;
struct WorkerMetrics;

struct ModelRegistryOptions {
  /// Model folders; the first is the default model.
  std::vector<std::string> paths;
  /// Where the models compute: "cpu", "cuda" (every visible GPU), "cuda:N", or a
  /// comma-separated list of those ("cuda:0,cuda:1", "cpu,cpu"); errors name the device.
  std::string device = "cpu";
  /// Workers per device.
  int workers = 1;
  int threads_per_worker = 1;
  int pool_threads = 1;
  /// RuntimeOptions::sequence_parallel and team_timeout_ms: the device team of two or more
  /// devices, and the longest one of its collectives may take.
  bool sequence_parallel = true;
  double team_timeout_ms = 60000;
  /// The team's planning round (TeamPlannerOptions::round_ms), the link its predictions
  /// assume (unset: RuntimeOptions::team_link's default for the devices) and the share of the
  /// image a mask must cover for its steps to ask it (WorkerOptions::team_masked_share).
  double team_round_ms = 50;
  std::optional<DeviceTeamLink> team_link;
  double team_masked_share = 0.25;
  /// Each FLUX.2 model's budget for CUDA graphs of masked rounds on a GPU (0: none).
  int64_t step_graph_bytes = 0;
  /// FLUX.2 transformers on a GPU in FP8 (GpuModelOptions::float8_weights).
  bool float8_weights = false;
  /// Their row norms as the project's fused CUDA kernels (GpuModelOptions::fused_norms).
  bool fused_norms = false;
  /// Their device tiers' budget of cached K/V (GpuModelOptions::device_cache_bytes).
  int64_t device_cache_bytes = int64_t{8} << 30;
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
  /// Test seam: called before each model is loaded on each device (the device's label, the
  /// model folder), also for CPU devices that share one copy; an error is taken as that
  /// load's result (a CUDA out-of-memory text, to leave the device out).
  std::function<Status(const std::string& device, const std::string& path)> before_load;
};

/// One device of the engine: its label, whether it serves, and its workers.
struct RegistryDevice {
  std::string device;       ///< its label (device_list.h): "cuda:1", "cpu:0"
  bool loaded = false;      ///< false: left out at load (`fault` says why), no workers
  std::string fault;        ///< the load's error, or "" (its workers report their own faults)
  std::vector<int> workers; ///< indices of its workers in the runtime
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
  /// Every device the engine was given, in order, including those left out at load.
  const std::vector<RegistryDevice>& devices() const { return devices_; }
  /// The same with whether each serves now: loaded and a worker of it in service (`workers`:
  /// the runtime's worker_metrics()).
  std::vector<ServiceDevice> device_states(const std::vector<WorkerMetrics>& workers) const;
  /// Adds the devices, the workers, their loads and recent requests, and the store's statistics.
  void collect(ServiceMetrics& m) const;
  /// Every model on every device lets go of device memory only it still holds
  /// (EditModel::release_unused): after an adapter is deleted.
  void release_unused() const;
  /// Waits up to `budget_ms` for all edits to end.
  bool drain(double budget_ms) const;
  /// Stops the runtime (its callbacks stop before this returns); the models stay.
  void stop();

 private:
  ModelRegistry() = default;
  struct Slot;
  std::vector<Slot> slots_;
  std::vector<std::shared_ptr<const EditModel>> on_devices_;  // every model on every device, once
  std::vector<RegistryDevice> devices_;
  std::shared_ptr<ActivationStore> store_;
  std::unique_ptr<ServingRuntime> runtime_;
};

}  // namespace infill
