#include "server/model_registry.h"

#include <algorithm>
#include <optional>

#include "cache/activation_store.h"
#include "model/compute_device.h"
#include "model/device_memory.h"
#include "model/model.h"
#include "pipeline/edit_model.h"
#include "pipeline/load_edit_model.h"
#include "pipeline/pinned_host_memory.h"
#include "serving/cost_calibration.h"
#include "serving/device_fault.h"
#include "serving/device_list.h"
#include "serving/serving_runtime.h"
#include "server/service_metrics.h"

namespace infill {

struct ModelRegistry::Slot {
  std::shared_ptr<const EditModel> model;  // any family
};

std::string calibration_path_for(const std::string& path, size_t index) {
  if (path.empty() || index == 0) return path;
  const size_t slash = path.find_last_of('/');
  const size_t dot = path.find_last_of('.');
  const size_t cut = dot != std::string::npos && (slash == std::string::npos || dot > slash) ? dot : path.size();
  return path.substr(0, cut) + "." + std::to_string(index) + path.substr(cut);
}

Result<std::unique_ptr<ModelRegistry>> ModelRegistry::load(const ModelRegistryOptions& options) {
  const std::vector<std::string>& paths = options.paths;
  if (paths.empty()) return invalid_argument("no model folder given");
  INFILL_ASSIGN_OR_RETURN(const std::vector<EngineDevice> devices, resolve_device_list(options.device));
  const bool several = devices.size() > 1;
  std::unique_ptr<ModelRegistry> registry(new ModelRegistry());
  // Per device kept: its models. CPU devices share the first CPU device's copy.
  std::vector<std::vector<LoadedEditModel>> loaded;
  std::vector<size_t> kept;  // indices into `devices`
  std::optional<size_t> cpu_copy;  // index into `loaded`
  std::vector<std::string> left_out;
  for (size_t d = 0; d < devices.size(); ++d) {
    const EngineDevice& device = devices[d];
    registry->devices_.push_back({device.label, false, "", {}});
    std::vector<LoadedEditModel> models;
    Status failed;
    for (size_t i = 0; i < paths.size() && failed.ok(); ++i) {
      Status seam = options.before_load ? options.before_load(device.label, paths[i]) : Status();
      if (!seam.ok()) {
        failed = seam;
      } else if (!device.device.cuda && cpu_copy) {
        models.push_back(loaded[*cpu_copy][i]);
        continue;
      } else {
        auto model = load_edit_model(paths[i], device.device, {options.step_graph_bytes, options.float8_weights, options.fused_norms, options.device_cache_bytes});
        if (!model.ok()) {
          failed = model.status();
        } else {
          models.push_back(std::move(*model));
          continue;
        }
      }
      if (paths.size() > 1) failed = Status(failed.code(), paths[i] + ": " + failed.message());
    }
    if (!failed.ok()) {
      // Out of memory there (or a device fault): the device is left out and the others serve.
      // The model's own errors would fail on every device: the start fails.
      const bool device_fault = failed.code() == ErrorCode::kResourceExhausted ||
                                classify_device_fault(failed.message()) != DeviceFault::kNone;
      if (!several) return failed;
      const std::string why = device.label + ": " + failed.message();
      if (!device_fault) return Status(failed.code(), why);
      registry->devices_.back().fault = why;
      left_out.push_back(why);
      continue;
    }
    if (!device.device.cuda && !cpu_copy) cpu_copy = loaded.size();
    loaded.push_back(std::move(models));
    kept.push_back(d);
    registry->devices_.back().loaded = true;
  }
  if (kept.empty()) {
    std::string why;
    for (const std::string& w : left_out) why += (why.empty() ? "" : "; ") + w;
    return Status(ErrorCode::kResourceExhausted, "no device could hold the models (" + why + ")");
  }
  const std::vector<LoadedEditModel>& models = loaded.front();
  for (size_t i = 0; i < models.size(); ++i) {
    const std::string& id = models[i].model->info().id;
    for (size_t j = 0; j < i; ++j) {
      if (models[j].model->info().id == id)
        return invalid_argument("models " + paths[j] + " and " + paths[i] + " are the same model (" + id +
                                "); give each model once");
    }
  }
  ActivationStoreOptions store_options;
  store_options.ram_budget_bytes = options.ram_cache_bytes;
  store_options.disk_dir = options.cache_dir;
  // Entries read back from disk for a GPU worker land in pinned memory, as its prepare runs'.
  ComputeDevice allocator_device;
  for (size_t d : kept)
    if (devices[d].device.cuda) allocator_device = devices[d].device;
  store_options.entry_allocator = entry_allocator_for(allocator_device.torch_device());
  auto store = ActivationStore::open(store_options);
  if (!store.ok()) return store.status();
  registry->store_ = std::shared_ptr<ActivationStore>(std::move(*store));
  // The cost model of each model on each device. The calibration runs the DiT family's
  // forward, which computes on the CPU only, with the same threads on every CPU device: once
  // per model. Other families start from the plausible coefficients (their scheduler deadlines
  // are then estimates); each worker refits its own from its steps.
  std::vector<std::shared_ptr<const StepCostModel>> calibrated(models.size());
  std::vector<RuntimeDevice> runtime_devices;
  for (size_t k = 0; k < kept.size(); ++k) {
    RuntimeDevice rd;
    rd.label = devices[kept[k]].label;
    for (size_t i = 0; i < loaded[k].size(); ++i) {
      std::shared_ptr<const StepCostModel> cost;
      if (options.calibrate && loaded[k][i].dit) {
        if (!calibrated[i]) {
          CalibrationOptions co;
          co.threads = options.threads_per_worker;
          co.cache_path = calibration_path_for(options.calibration_path, i);
          auto cal = load_or_calibrate(*loaded[k][i].dit, co);
          if (!cal.ok()) return cal.status();
          calibrated[i] = std::make_shared<const StepCostModel>(cal->model);
        }
        cost = calibrated[i];
      } else {
        cost = std::make_shared<const StepCostModel>(StepCostModel::plausible());
      }
      rd.models.push_back({loaded[k][i].model, std::move(cost)});
    }
    runtime_devices.push_back(std::move(rd));
  }
  for (const LoadedEditModel& m : models) registry->slots_.push_back({m.model});
  for (const std::vector<LoadedEditModel>& on_device : loaded)
    for (const LoadedEditModel& m : on_device)
      if (std::find(registry->on_devices_.begin(), registry->on_devices_.end(), m.model) == registry->on_devices_.end())
        registry->on_devices_.push_back(m.model);
  // One runtime for the devices: each device's workers serve every model, so two models share
  // one step loop (per worker) instead of competing for the same cores or GPU from two.
  RuntimeOptions ro;
  ro.workers = options.workers;
  ro.threads_per_worker = options.threads_per_worker;
  ro.pool_threads = std::max(1, options.pool_threads);
  ro.sequence_parallel = options.sequence_parallel;
  ro.team_timeout_ms = options.team_timeout_ms;
  ro.team_planning.round_ms = options.team_round_ms;
  if (options.team_link) {
    // The elements an all-to-all moves: bf16 on GPUs, float32 on CPUs.
    const bool gpus = !kept.empty() && devices[kept.front()].device.cuda;
    ro.team_link = TeamLink{options.team_link->latency_ms, options.team_link->gbytes_per_s * 1e6, gpus ? 2.0 : 4.0};
  }
  ro.worker.team_masked_share = options.team_masked_share;
  ro.worker.before_step = options.before_step;
  ro.worker.may_step = options.may_step;
  auto runtime = ServingRuntime::create(std::move(runtime_devices), registry->store_, ro);
  if (!runtime.ok()) return runtime.status();
  registry->runtime_ = std::move(*runtime);
  for (size_t w = 0; w < static_cast<size_t>(ro.workers) * kept.size(); ++w)
    registry->devices_[kept[registry->runtime_->device_of_worker(w)]].workers.push_back(static_cast<int>(w));
  return registry;
}

ModelRegistry::~ModelRegistry() = default;

size_t ModelRegistry::size() const { return slots_.size(); }
const EditModel& ModelRegistry::model(size_t slot) const { return *slots_.at(slot).model; }
const std::string& ModelRegistry::id(size_t slot) const { return slots_.at(slot).model->info().id; }
std::shared_ptr<const EditModel> ModelRegistry::shared_model(size_t slot) const { return slots_.at(slot).model; }
ServingRuntime& ModelRegistry::runtime() const { return *runtime_; }

void ModelRegistry::release_unused() const {
  for (const auto& m : on_devices_) m->release_unused();
}
ActivationStore& ModelRegistry::store() const { return *store_; }

int ModelRegistry::find(const std::string& id) const {
  for (size_t i = 0; i < slots_.size(); ++i)
    if (slots_[i].model->info().id == id) return static_cast<int>(i);
  return -1;
}

std::string ModelRegistry::ids_text() const {
  std::string ids;
  for (const Slot& s : slots_) ids += (ids.empty() ? "" : ", ") + s.model->info().id;
  return ids;
}

nlohmann::json ModelRegistry::models_json(int64_t max_image_pixels) const {
  nlohmann::json list = nlohmann::json::array();
  for (size_t i = 0; i < slots_.size(); ++i) {
    const EditModel& model = *slots_[i].model;
    const EditModelInfo& m = model.info();
    list.push_back({{"id", m.id},
                    {"name", m.name},
                    {"description", m.description},
                    {"family", m.family},
                    {"default", i == 0},
                    {"max_image_pixels", std::min<int64_t>(m.max_image_pixels, max_image_pixels)},
                    {"default_steps", m.default_steps},
                    {"default_sampler", m.default_sampler},
                    {"default_guidance", m.default_guidance},
                    {"prompt", m.free_text ? "free_text" : "vocabulary"},
                    {"vocabulary", m.vocabulary},
                    {"grid_pixels", model.token_pixels()}});
  }
  return list;
}

std::vector<ServiceDevice> ModelRegistry::device_states(const std::vector<WorkerMetrics>& workers) const {
  std::vector<ServiceDevice> out;
  for (const RegistryDevice& d : devices_) {
    ServiceDevice s;
    s.device = d.device;
    s.fault = d.fault;
    s.workers = d.workers;
    for (int w : d.workers) {
      if (static_cast<size_t>(w) >= workers.size()) continue;
      const WorkerMetrics& m = workers[static_cast<size_t>(w)];
      s.in_service = s.in_service || m.in_service;
      if (!m.in_service && s.fault.empty()) s.fault = m.fault;
    }
    if (s.in_service) s.fault.clear();
    out.push_back(std::move(s));
  }
  return out;
}

void ModelRegistry::collect(ServiceMetrics& m) const {
  if (runtime_) {
    std::vector<std::string> ids;
    for (const Slot& slot : slots_) ids.push_back(slot.model->info().id);
    const std::vector<WorkerLoad> loads = runtime_->loads();
    std::vector<WorkerMetrics> workers = runtime_->worker_metrics();
    m.devices = device_states(workers);
    // A GPU's memory, read from libtorch's caching allocator and the driver (a CPU device's is
    // the process's resident set, which the service adds). Labels of GPUs are "cuda:N".
    for (ServiceDevice& d : m.devices) {
      const auto device = parse_compute_device(d.device);
      if (d.workers.empty() || !device.ok() || !device->cuda) continue;
      auto memory = cuda_device_memory(device->index);
      if (memory.ok()) d.memory = *memory;
    }
    for (WorkerMetrics& w : workers) {
      m.loads.push_back({w.device, w.index, loads.at(static_cast<size_t>(w.index))});
      m.workers.push_back({ids, std::move(w)});
    }
    m.recent_requests = runtime_->request_metrics();
    m.team = runtime_->team_metrics();
  }
  m.cache = store_->stats();
}

bool ModelRegistry::drain(double budget_ms) const { return !runtime_ || runtime_->drain(std::max(0.0, budget_ms)); }

void ModelRegistry::stop() { runtime_.reset(); }

}  // namespace infill
