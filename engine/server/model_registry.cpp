#include "server/model_registry.h"

#include <algorithm>

#include "cache/activation_store.h"
#include "model/model.h"
#include "pipeline/edit_model.h"
#include "pipeline/load_edit_model.h"
#include "pipeline/pinned_host_memory.h"
#include "serving/cost_calibration.h"
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
  INFILL_ASSIGN_OR_RETURN(const ComputeDevice device, parse_compute_device(options.device));
  INFILL_RETURN_IF_ERROR(check_compute_device(device));
  std::vector<LoadedEditModel> models;
  for (size_t i = 0; i < paths.size(); ++i) {
    auto model = load_edit_model(paths[i], device);
    if (!model.ok())
      return paths.size() == 1 ? model.status() : Status(model.status().code(), paths[i] + ": " + model.status().message());
    const std::string& id = model->model->info().id;
    for (size_t j = 0; j < models.size(); ++j) {
      if (models[j].model->info().id == id)
        return invalid_argument("models " + paths[j] + " and " + paths[i] + " are the same model (" + id +
                                "); give each model once");
    }
    models.push_back(std::move(*model));
  }
  ActivationStoreOptions store_options;
  store_options.ram_budget_bytes = options.ram_cache_bytes;
  store_options.disk_dir = options.cache_dir;
  // Entries read back from disk for a GPU worker land in pinned memory, as its prepare runs'.
  store_options.entry_allocator = entry_allocator_for(device.torch_device());
  auto store = ActivationStore::open(store_options);
  if (!store.ok()) return store.status();
  std::unique_ptr<ModelRegistry> registry(new ModelRegistry());
  registry->store_ = std::shared_ptr<ActivationStore>(std::move(*store));
  std::vector<ServedModel> served;
  for (size_t i = 0; i < models.size(); ++i) {
    std::shared_ptr<const StepCostModel> cost;
    // The calibration runs the DiT family's forward; other families start from the plausible
    // coefficients (their scheduler deadlines are then estimates).
    if (options.calibrate && models[i].dit) {
      CalibrationOptions co;
      co.threads = options.threads_per_worker;
      co.cache_path = calibration_path_for(options.calibration_path, i);
      auto cal = load_or_calibrate(*models[i].dit, co);
      if (!cal.ok()) return cal.status();
      cost = std::make_shared<const StepCostModel>(cal->model);
    } else {
      cost = std::make_shared<const StepCostModel>(StepCostModel::plausible());
    }
    served.push_back({models[i].model, std::move(cost)});
    registry->slots_.push_back({models[i].model});
  }
  // One runtime for the device: its workers serve every model, so two models share one step
  // loop (per worker) instead of competing for the same cores or GPU from two.
  RuntimeOptions ro;
  ro.workers = options.workers;
  ro.threads_per_worker = options.threads_per_worker;
  ro.pool_threads = std::max(1, options.pool_threads);
  ro.worker.before_step = options.before_step;
  ro.worker.may_step = options.may_step;
  auto runtime = ServingRuntime::create(std::move(served), registry->store_, ro);
  if (!runtime.ok()) return runtime.status();
  registry->runtime_ = std::move(*runtime);
  return registry;
}

ModelRegistry::~ModelRegistry() = default;

size_t ModelRegistry::size() const { return slots_.size(); }
const EditModel& ModelRegistry::model(size_t slot) const { return *slots_.at(slot).model; }
const std::string& ModelRegistry::id(size_t slot) const { return slots_.at(slot).model->info().id; }
std::shared_ptr<const EditModel> ModelRegistry::shared_model(size_t slot) const { return slots_.at(slot).model; }
ServingRuntime& ModelRegistry::runtime() const { return *runtime_; }
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

void ModelRegistry::collect(ServiceMetrics& m) const {
  if (runtime_) {
    std::vector<std::string> ids;
    for (const Slot& slot : slots_) ids.push_back(slot.model->info().id);
    const std::vector<WorkerLoad> loads = runtime_->loads();
    for (WorkerMetrics& w : runtime_->worker_metrics()) {
      m.loads.push_back({w.device, w.index, loads.at(static_cast<size_t>(w.index))});
      m.workers.push_back({ids, std::move(w)});
    }
    m.recent_requests = runtime_->request_metrics();
  }
  m.cache = store_->stats();
}

bool ModelRegistry::drain(double budget_ms) const { return !runtime_ || runtime_->drain(std::max(0.0, budget_ms)); }

void ModelRegistry::stop() { runtime_.reset(); }

}  // namespace infill
