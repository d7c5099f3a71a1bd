#include "serving/serving_runtime.h"

#include <algorithm>
#include <cmath>

#include <ATen/ATen.h>

#include "pipeline/dit_edit_model.h"

namespace infill {

Result<std::unique_ptr<ServingRuntime>> ServingRuntime::create(std::shared_ptr<const Model> model,
                                                               std::shared_ptr<ActivationStore> store,
                                                               std::shared_ptr<const StepCostModel> cost,
                                                               RuntimeOptions options) {
  if (!model) return invalid_argument("serving runtime needs a model, a store and a cost model");
  return create(std::make_shared<const DitEditModel>(std::move(model)), std::move(store), std::move(cost),
                std::move(options));
}

Result<std::unique_ptr<ServingRuntime>> ServingRuntime::create(std::shared_ptr<const EditModel> model,
                                                               std::shared_ptr<ActivationStore> store,
                                                               std::shared_ptr<const StepCostModel> cost,
                                                               RuntimeOptions options) {
  return create(std::vector<ServedModel>{{std::move(model), std::move(cost)}}, std::move(store), std::move(options));
}

Result<std::unique_ptr<ServingRuntime>> ServingRuntime::create(std::vector<ServedModel> models,
                                                               std::shared_ptr<ActivationStore> store,
                                                               RuntimeOptions options) {
  if (models.empty() || !store) return invalid_argument("serving runtime needs a model, a store and a cost model");
  for (size_t i = 0; i < models.size(); ++i) {
    if (!models[i].model || !models[i].cost)
      return invalid_argument("serving runtime: model " + std::to_string(i) + " has no model or no cost model");
    for (size_t j = 0; j < i; ++j) {
      if (models[j].model->info().id == models[i].model->info().id)
        return invalid_argument("serving runtime: model " + models[i].model->info().id + " is given twice");
    }
    // One runtime is one device: its workers' step loops own that device's compute.
    if (!(models[i].model->device() == models.front().model->device()))
      return invalid_argument("serving runtime: model " + models[i].model->name() + " computes on " +
                              models[i].model->device().name() + ", model " + models.front().model->name() + " on " +
                              models.front().model->device().name() + "; expected one device");
  }
  if (options.workers < 1 || options.threads_per_worker < 1 || options.pool_threads < 1) {
    return invalid_argument("serving runtime options: workers " + std::to_string(options.workers) +
                            ", threads_per_worker " + std::to_string(options.threads_per_worker) +
                            ", pool_threads " + std::to_string(options.pool_threads) + ", expected each >= 1");
  }
  std::unique_ptr<ServingRuntime> rt(new ServingRuntime());
  rt->models_ = models;
  rt->options_ = options;
  rt->epoch_ = std::chrono::steady_clock::now();
  rt->pool_ = std::make_unique<TaskPool>(options.pool_threads, 1);
  rt->router_ = std::make_unique<Router>(options.routing);
  for (int i = 0; i < options.workers; ++i) {
    WorkerOptions w = options.worker;
    w.index = i;
    w.compute_threads = options.threads_per_worker;
    w.epoch = rt->epoch_;
    rt->workers_.push_back(std::make_unique<Worker>(models, store, *rt->pool_, std::move(w)));
  }
  return rt;
}

ServingRuntime::~ServingRuntime() {
  workers_.clear();  // each cancels its live requests and waits for its pool tasks
  pool_.reset();
}

double ServingRuntime::now_ms() const {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - epoch_).count();
}

Status ServingRuntime::submit(ServingRequest request) {
  const uint64_t id = request.id;
  if (id == 0) return invalid_argument("request id 0 is reserved, expected a non-zero id");
  const ServedModel* served = request.model ? nullptr : &models_.front();
  for (const ServedModel& m : models_)
    if (m.model == request.model) served = &m;
  if (served == nullptr) {
    std::string ids;
    for (const ServedModel& m : models_) ids += (ids.empty() ? "" : ", ") + m.model->info().id;
    return invalid_argument("request " + std::to_string(id) + " names model " + request.model->info().id +
                            ", expected one this runtime serves (" + ids + ")");
  }
  if (!request.model) request.model = served->model;
  // The request's own work, for the mask-aware router: tokens estimated from the mask area.
  double work_ms = 0;
  if (request.tmpl && request.params.mask.defined() && request.params.mask.numel() > 0) {
    const EditModel& model = *served->model;
    const int p = model.token_pixels();
    const int64_t total = int64_t{request.tmpl->model_width / p} * (request.tmpl->model_height / p);
    const double ratio = (request.params.mask > 0).to(at::kFloat).mean().item<double>();
    const int steps = model.resolved_steps(request.params);
    work_ms = request_work_ms(*served->cost, static_cast<int64_t>(std::ceil(ratio * double(total))), total, steps);
  }
  std::vector<WorkerLoad> loads;
  for (const auto& w : workers_) loads.push_back(w->load());
  if (std::none_of(loads.begin(), loads.end(), [](const WorkerLoad& l) { return l.in_service; })) {
    std::string why;
    for (const auto& w : workers_) {
      const WorkerMetrics m = w->metrics();
      why += (why.empty() ? "" : "; ") + std::string("worker ") + std::to_string(m.index) + ": " + m.fault;
    }
    return Status(ErrorCode::kUnavailable, "request " + std::to_string(id) +
                                               " not accepted: every worker is out of service (" + why +
                                               "); restart the engine to use the device again");
  }
  size_t target = 0;
  uint64_t superseded = 0;
  {
    std::lock_guard lock(mu_);
    if (live_.contains(id)) return invalid_argument("request id " + std::to_string(id) + " is already live");
    if (request.supersedes != 0) {
      auto old = live_.find(request.supersedes);
      if (old != live_.end()) {
        if (old->second.client_id != request.client_id) {
          return invalid_argument("request " + std::to_string(id) + " of client " + std::to_string(request.client_id) +
                                  " supersedes request " + std::to_string(request.supersedes) + " of client " +
                                  std::to_string(old->second.client_id) + ", expected the same client");
        }
        superseded = request.supersedes;
      }
    }
    target = router_->choose(loads, work_ms);
    live_[id] = {request.client_id, target};
  }
  if (superseded != 0) {
    std::lock_guard lock(mu_);
    auto old = live_.find(superseded);
    if (old != live_.end()) {
      workers_[old->second.worker]->cancel(
          superseded, Status(ErrorCode::kCancelled, "request " + std::to_string(superseded) +
                                                        " superseded by request " + std::to_string(id)));
    }
  }
  auto user_cb = std::move(request.on_complete);
  request.on_complete = [this, id, cb = std::move(user_cb)](const RequestResult& result) {
    // Forget the id before the caller hears about it, so it may be reused at once.
    {
      std::lock_guard lock(mu_);
      live_.erase(id);
      if (live_.empty()) idle_cv_.notify_all();
    }
    if (cb) cb(result);
  };
  workers_[target]->submit(std::move(request), now_ms());
  return {};
}

bool ServingRuntime::cancel(uint64_t id) {
  size_t worker = 0;
  {
    std::lock_guard lock(mu_);
    auto it = live_.find(id);
    if (it == live_.end()) return false;
    worker = it->second.worker;
  }
  return workers_[worker]->cancel(id, Status(ErrorCode::kCancelled, "request " + std::to_string(id) + " cancelled by the client"));
}

bool ServingRuntime::drain(double timeout_ms) {
  std::unique_lock lock(mu_);
  const bool idle = idle_cv_.wait_for(lock, std::chrono::duration<double, std::milli>(timeout_ms), [&] { return live_.empty(); });
  lock.unlock();
  if (idle) pool_->wait_idle();  // the last callbacks have returned
  return idle;
}

size_t ServingRuntime::live_requests() const {
  std::lock_guard lock(mu_);
  return live_.size();
}

std::vector<WorkerMetrics> ServingRuntime::worker_metrics() const {
  std::vector<WorkerMetrics> out;
  for (const auto& w : workers_) out.push_back(w->metrics());
  return out;
}

std::vector<RequestMetrics> ServingRuntime::request_metrics() const {
  std::vector<RequestMetrics> out;
  for (const auto& w : workers_) {
    auto m = w->recent_requests();
    out.insert(out.end(), m.begin(), m.end());
  }
  return out;
}

std::vector<WorkerLoad> ServingRuntime::loads() const {
  std::vector<WorkerLoad> out;
  for (const auto& w : workers_) out.push_back(w->load());
  return out;
}

}  // namespace infill
