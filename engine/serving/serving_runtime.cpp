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
  return create(std::vector<RuntimeDevice>{{std::move(models), ""}}, std::move(store), std::move(options));
}

Result<std::unique_ptr<ServingRuntime>> ServingRuntime::create(std::vector<RuntimeDevice> devices,
                                                               std::shared_ptr<ActivationStore> store,
                                                               RuntimeOptions options) {
  if (devices.empty() || !store) return invalid_argument("serving runtime needs a device, a store and a cost model");
  for (size_t d = 0; d < devices.size(); ++d) {
    const std::vector<ServedModel>& models = devices[d].models;
    const std::string where = devices.size() > 1 ? "device " + std::to_string(d) + ": " : "";
    if (models.empty()) return invalid_argument("serving runtime: " + where + "needs a model, a store and a cost model");
    for (size_t i = 0; i < models.size(); ++i) {
      if (!models[i].model || !models[i].cost)
        return invalid_argument("serving runtime: " + where + "model " + std::to_string(i) + " has no model or no cost model");
      for (size_t j = 0; j < i; ++j) {
        if (models[j].model->info().id == models[i].model->info().id)
          return invalid_argument("serving runtime: model " + models[i].model->info().id + " is given twice");
      }
      // A device's workers' step loops own that device's compute: its models compute there.
      if (!(models[i].model->device() == models.front().model->device()))
        return invalid_argument("serving runtime: " + where + "model " + models[i].model->name() + " computes on " +
                                models[i].model->device().name() + ", model " + models.front().model->name() + " on " +
                                models.front().model->device().name() + "; expected one device");
    }
    // A request names its model once for every device: each serves the same ones, in order.
    const std::vector<ServedModel>& first = devices.front().models;
    bool same = models.size() == first.size();
    for (size_t i = 0; same && i < models.size(); ++i) same = models[i].model->info().id == first[i].model->info().id;
    if (!same)
      return invalid_argument("serving runtime: " + where + "serves other models than device 0; expected the same on every device");
  }
  if (options.workers < 1 || options.threads_per_worker < 1 || options.pool_threads < 1) {
    return invalid_argument("serving runtime options: workers " + std::to_string(options.workers) +
                            ", threads_per_worker " + std::to_string(options.threads_per_worker) +
                            ", pool_threads " + std::to_string(options.pool_threads) + ", expected each >= 1");
  }
  std::unique_ptr<ServingRuntime> rt(new ServingRuntime());
  rt->devices_ = devices;
  rt->store_ = store;
  rt->options_ = options;
  rt->epoch_ = std::chrono::steady_clock::now();
  rt->pool_ = std::make_unique<TaskPool>(options.pool_threads, 1);
  rt->router_ = std::make_unique<Router>(options.routing);
  if (devices.size() < 2 || !options.sequence_parallel) {
    rt->team_status_ = Status(ErrorCode::kUnavailable, devices.size() < 2 ? "one device: no device team"
                                                                           : "sequence parallelism is switched off");
  } else {
    std::vector<ComputeDevice> compute;
    for (const RuntimeDevice& d : devices) compute.push_back(d.models.front().model->device());
    DeviceGroupOptions group;
    group.timeout = std::chrono::milliseconds(static_cast<int64_t>(options.team_timeout_ms));
    TeamPlannerOptions planning = options.team_planning;
    planning.link = options.team_link.value_or(compute.front().cuda ? TeamLink{} : TeamLink::loopback());
    auto team = DeviceTeam::create(compute, group, planning);
    if (team.ok()) {
      rt->team_ = *team;
    } else {
      rt->team_status_ = team.status();
    }
  }
  for (size_t d = 0; d < devices.size(); ++d) {
    for (int i = 0; i < options.workers; ++i) {
      WorkerOptions w = options.worker;
      if (rt->team_ && i == 0) {
        w.team = rt->team_;
        w.team_rank = static_cast<int>(d);
      }
      w.index = static_cast<int>(rt->workers_.size());
      w.device_label = devices[d].label;
      w.compute_threads = options.threads_per_worker;
      w.epoch = rt->epoch_;
      w.reroute = [runtime = rt.get()](ServingRequest request, double submitted_ms) {
        runtime->reroute(std::move(request), submitted_ms);
      };
      rt->workers_.push_back(std::make_unique<Worker>(devices[d].models, store, *rt->pool_, std::move(w)));
      rt->worker_device_.push_back(d);
      if (rt->team_ && i == 0) {
        Worker* worker = rt->workers_.back().get();
        std::vector<std::shared_ptr<const EditModel>> models;
        for (const ServedModel& m : devices[d].models) models.push_back(m.model);
        rt->team_->attach(
            static_cast<int>(d), [worker](std::function<void()> task) { worker->run_on_loop(std::move(task)); },
            [worker] { return worker->idle(); }, std::move(models), [worker] { worker->end_team_holds(); });
      }
    }
  }
  rt->routed_.resize(rt->workers_.size());
  return rt;
}

ServingRuntime::~ServingRuntime() {
  {
    std::lock_guard lock(reroute_mu_);
    stopping_ = true;  // a worker leaving service from now on fails what it holds
  }
  if (team_) {
    for (int r = 0; r < team_->size(); ++r) team_->detach(r);
  }
  workers_.clear();  // each cancels its live requests and waits for its pool tasks
  pool_.reset();
}

Status ServingRuntime::team_status() const { return team_ ? team_->health() : team_status_; }

std::optional<DeviceTeam::Metrics> ServingRuntime::team_metrics() const {
  if (!team_) return std::nullopt;
  DeviceTeam::Metrics m = team_->metrics();
  m.masked_share = options_.worker.team_masked_share;
  return m;
}

double ServingRuntime::now_ms() const {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - epoch_).count();
}

void ServingRuntime::entry_affinity(const ServingRequest& request, size_t slot, int64_t total_tokens, int steps,
                                    RouteQuery& query) const {
  const EditModel& model = *request.model;
  if (request.params.cache != CacheMode::kUse) return;
  try {
    const ActivationKey key = model.cache_key(*request.tmpl, request.params);
    query.entry_key = key.canonical();
    if (std::optional<ActivationLayout> layout = store_->layout_of(key)) {
      // Stored: a worker on another GPU copies it over the bus to its device tier; CPU
      // workers share the RAM tier, so it costs them nothing.
      const double bus = model.host_to_device_bytes_per_ms();
      query.entry_miss_ms = bus > 0 ? double(layout->total_elements()) * sizeof(uint16_t) / bus : 0.0;
    } else {
      // Not stored yet: its holder is preparing it; another worker would run the prepare
      // again (a full forward per step of the schedule).
      const StepCostModel& cost = *workers_.front()->cost(slot);
      query.entry_miss_ms = request_work_ms(cost, total_tokens, total_tokens, steps) + drain_ms(cost, 0.0, steps);
    }
  } catch (...) {
    // A key the model cannot make: the worker's pre-processing reports it; route by load.
    query.entry_key.clear();
    query.entry_miss_ms = 0;
  }
}

std::optional<size_t> ServingRuntime::slot_of(const std::shared_ptr<const EditModel>& model) const {
  if (!model) return 0;
  for (const RuntimeDevice& d : devices_)
    for (size_t i = 0; i < d.models.size(); ++i)
      if (d.models[i].model == model) return i;
  return std::nullopt;
}

RouteQuery ServingRuntime::route_query(const ServingRequest& request, size_t slot, std::vector<double>& work_ms) const {
  // The request's own work on each worker, for the mask-aware router: tokens estimated from
  // the mask area, on each worker's cost model of the model (its device's).
  RouteQuery query;
  work_ms.assign(workers_.size(), 0.0);
  if (request.tmpl && request.params.mask.defined() && request.params.mask.numel() > 0) {
    const EditModel& model = *request.model;
    const int p = model.token_pixels();
    const int64_t total = int64_t{request.tmpl->model_width / p} * (request.tmpl->model_height / p);
    const double ratio = (request.params.mask > 0).to(at::kFloat).mean().item<double>();
    const int steps = model.resolved_steps(request.params);
    const auto tokens = static_cast<int64_t>(std::ceil(ratio * double(total)));
    for (size_t w = 0; w < workers_.size(); ++w) work_ms[w] = request_work_ms(*workers_[w]->cost(slot), tokens, total, steps);
    if (workers_.size() > 1 && ratio > 0) entry_affinity(request, slot, total, steps, query);
  }
  query.request_ms = work_ms.front();
  query.request_ms_by_worker = work_ms;
  if (request.cls == RequestClass::kLive) query.live_client = request.client_id;
  return query;
}

size_t ServingRuntime::route_locked(std::span<const WorkerLoad> loads, const RouteQuery& query) {
  const RouteDecision decision = router_->route(loads, query);
  routed_[decision.worker].by_reason[route_reason_name(decision.reason)] += 1;
  if (decision.locality_missed_worker >= 0) routed_[static_cast<size_t>(decision.locality_missed_worker)].locality_missed += 1;
  return decision.worker;
}

Status ServingRuntime::bind_to_worker(ServingRequest& request, size_t slot, size_t target) {
  // The target device's instance of the model (the same one for CPU devices sharing it).
  const std::shared_ptr<const EditModel> named = request.model;
  request.model = devices_[worker_device_[target]].models[slot].model;
  if (request.model == named || !request.rebind) return {};
  Status bound;
  try {
    bound = request.rebind(request.params, request.model);
  } catch (const std::exception& e) {
    bound = Status(ErrorCode::kInternal, std::string("rebind threw: ") + e.what());
  }
  if (bound.ok()) return {};
  return Status(bound.code(), "request " + std::to_string(request.id) + " on " + workers_[target]->device() + ": " + bound.message());
}

Status ServingRuntime::submit(ServingRequest request) {
  const uint64_t id = request.id;
  if (id == 0) return invalid_argument("request id 0 is reserved, expected a non-zero id");
  // The model's slot, whichever device's instance the request names.
  const std::optional<size_t> slot = slot_of(request.model);
  if (!slot) {
    std::string ids;
    for (const ServedModel& m : devices_.front().models) ids += (ids.empty() ? "" : ", ") + m.model->info().id;
    return invalid_argument("request " + std::to_string(id) + " names model " + request.model->info().id +
                            ", expected one this runtime serves (" + ids + ")");
  }
  if (!request.model) request.model = devices_.front().models[*slot].model;
  std::vector<double> work_ms;
  const RouteQuery query = route_query(request, *slot, work_ms);
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
    target = route_locked(loads, query);
    live_[id] = {request.client_id, target};
  }
  if (Status bound = bind_to_worker(request, *slot, target); !bound.ok()) {
    std::lock_guard lock(mu_);
    live_.erase(id);
    if (live_.empty()) idle_cv_.notify_all();
    return bound;
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

void ServingRuntime::reroute(ServingRequest request, double submitted_ms) {
  // Held while the request reaches its new worker, so that the destructor never stops the
  // workers under this call.
  std::lock_guard rerouting(reroute_mu_);
  const uint64_t id = request.id;
  auto end = [&](RequestState state, Status why) {
    RequestResult result;
    result.id = id;
    result.state = state;
    result.status = std::move(why);
    result.metrics.id = id;
    pool_->post([cb = std::move(request.on_complete), result = std::move(result)] {
      if (cb) cb(result);
    });
  };
  if (stopping_) return end(RequestState::kCancelled, Status(ErrorCode::kCancelled, "worker stopped"));
  std::vector<WorkerLoad> loads;
  for (const auto& w : workers_) loads.push_back(w->load());
  if (std::none_of(loads.begin(), loads.end(), [](const WorkerLoad& l) { return l.in_service; })) {
    return end(RequestState::kFailed,
               Status(ErrorCode::kUnavailable, "request " + std::to_string(id) +
                                                   " not run: its worker left service and every worker is out of "
                                                   "service; restart the engine to use the devices again"));
  }
  const std::optional<size_t> slot = slot_of(request.model);
  std::vector<double> work_ms;
  const RouteQuery query = route_query(request, slot.value_or(0), work_ms);
  size_t target = 0;
  {
    std::lock_guard lock(mu_);
    target = route_locked(loads, query);
    auto live = live_.find(id);
    if (live != live_.end()) live->second.worker = target;
  }
  if (Status bound = bind_to_worker(request, slot.value_or(0), target); !bound.ok())
    return end(RequestState::kFailed, std::move(bound));
  workers_[target]->submit(std::move(request), submitted_ms);
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
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].routed = routed_[i].by_reason;
    out[i].locality_missed = routed_[i].locality_missed;
  }
  return out;
}

std::vector<std::string> ServingRuntime::device_labels() const {
  std::vector<std::string> out;
  for (size_t d = 0; d < devices_.size(); ++d) {
    // Its first worker's label: the device's own, or its models' device name.
    const auto first = std::find(worker_device_.begin(), worker_device_.end(), d);
    out.push_back(workers_[static_cast<size_t>(first - worker_device_.begin())]->device());
  }
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
