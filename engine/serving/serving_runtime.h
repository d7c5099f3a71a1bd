#pragma once
/// The serving runtime of an engine's devices: per device N workers (one step loop each; one
/// per GPU, a share of the cores each on the CPU), every worker serving every model as loaded
/// on its device, one task pool for pre/post-processing, and a router that spreads requests
/// over the workers of every device (router.h: template locality, live clients staying on one
/// worker, otherwise the least loaded). Handles ids, cancel and supersede, across models and
/// devices.
///
/// Threading: every public method is safe from any thread. Request callbacks run on the pool.

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <mutex>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "cache/activation_store.h"
#include "model/model.h"
#include "serving/cost_model.h"
#include "serving/router.h"
#include "serving/serving_request.h"
#include "serving/task_pool.h"
#include "serving/worker.h"

namespace infill {

/// One device of a runtime: every model as loaded there, with the cost model of its steps on
/// that device (each worker then refits its own, live_cost_model.h). Every device serves the
/// same models (ids) in the same order; CPU devices may share one instance of a model.
struct RuntimeDevice {
  std::vector<ServedModel> models;
  /// Its name in metrics and messages ("cuda:1", "cpu:0"); "" = the models' device name.
  std::string label;
};

/// The router's decisions for one worker (filled into WorkerMetrics::routed).
struct RouteCounts {
  std::map<std::string, uint64_t> by_reason;
  uint64_t locality_missed = 0;
};

struct RuntimeOptions {
  /// Workers per device. On a 2-core CPU, 2 workers of 1 compute thread or 1 worker of 2 are
  /// both valid set-ups.
  int workers = 1;
  int threads_per_worker = 1;
  int pool_threads = 1;
  RoutingPolicy routing = RoutingPolicy::kMaskAware;
  /// Applied to every worker (index and epoch are set by the runtime).
  WorkerOptions worker;
  /// With two or more devices: the first worker of each is a rank of a device team
  /// (device_team.h), so that a whole-sequence step runs in sequence parallel over the idle
  /// devices the team's planner (team_planner.h) gives it.
  /// A team that cannot be made (no process group backend in this build) is left out and said
  /// in team_status().
  bool sequence_parallel = true;
  /// The longest one collective of the team may take.
  double team_timeout_ms = 60000;
  /// The team's planner (serving/team_planner.h): its round length and whether measured
  /// steps correct its predictions (`ranks` is set by the runtime).
  TeamPlannerOptions team_planning;
  /// The team's link for the planner's all-to-all predictions; unset: NVLink's figures on
  /// GPUs, TeamLink::loopback() on CPUs.
  std::optional<TeamLink> team_link;
};

class ServingRuntime {
 public:
  /// Starts the workers, each serving every model of `models` (the first is the default of
  /// requests that name none). Errors: no model, a null model or cost model, two models with
  /// one id, models on different devices, workers or threads < 1, a null store.
  static Result<std::unique_ptr<ServingRuntime>> create(std::vector<ServedModel> models,
                                                        std::shared_ptr<ActivationStore> store,
                                                        RuntimeOptions options);
  /// Several devices, `options.workers` workers each (worker indices run device by device).
  /// Errors as above per device, and devices that serve different models (ids or order).
  static Result<std::unique_ptr<ServingRuntime>> create(std::vector<RuntimeDevice> devices,
                                                        std::shared_ptr<ActivationStore> store,
                                                        RuntimeOptions options);
  /// One model.
  static Result<std::unique_ptr<ServingRuntime>> create(std::shared_ptr<const EditModel> model,
                                                        std::shared_ptr<ActivationStore> store,
                                                        std::shared_ptr<const StepCostModel> cost,
                                                        RuntimeOptions options);
  /// The same for a model of the DiT family.
  static Result<std::unique_ptr<ServingRuntime>> create(std::shared_ptr<const Model> model,
                                                        std::shared_ptr<ActivationStore> store,
                                                        std::shared_ptr<const StepCostModel> cost,
                                                        RuntimeOptions options);
  /// Cancels what is still live and stops every worker.
  ~ServingRuntime();

  /// Routes and queues a request. `request.model` may be any device's instance of a model:
  /// the request runs on the instance of the device it is routed to (its `rebind` is called
  /// when that is another one). Errors (the request is then not queued and on_complete is
  /// not called): id 0 or already live, a model this runtime does not serve, supersedes naming
  /// a live request of another client, every worker out of service (unavailable, naming their
  /// device faults), a failed rebind. A request may supersede one of another model.
  /// A supersedes naming a finished or unknown request is accepted (nothing left to replace).
  Status submit(ServingRequest request);
  /// Cancels a live request at its next step boundary; false when the id is not live.
  bool cancel(uint64_t id);

  /// Blocks until nothing is live or `timeout_ms` passed; true when idle.
  bool drain(double timeout_ms);
  size_t live_requests() const;
  std::vector<WorkerMetrics> worker_metrics() const;
  /// Metrics of recently finished requests of every worker.
  std::vector<RequestMetrics> request_metrics() const;
  std::vector<WorkerLoad> loads() const;
  /// The devices' labels, and the device of each worker (an index into them).
  std::vector<std::string> device_labels() const;
  size_t device_of_worker(size_t worker) const { return worker_device_.at(worker); }
  /// ms since the runtime started: the clock of every timestamp it reports.
  double now_ms() const;
  /// The options it was created with.
  const RuntimeOptions& options() const { return options_; }
  /// Ok with a device team in use; else why there is none (one device, switched off, no
  /// backend) or why it was taken out of use.
  Status team_status() const;
  /// The team's planner decisions and process groups; unset without a team.
  std::optional<DeviceTeam::Metrics> team_metrics() const;

 private:
  ServingRuntime() = default;

  struct Live {
    uint64_t client_id;
    size_t worker;
  };

  // The router's inputs beyond the loads: the template entry an edit reads and what another
  // worker pays to get it (router.h).
  void entry_affinity(const ServingRequest& request, size_t slot, int64_t total_tokens, int steps,
                      RouteQuery& query) const;
  // The slot of a model, whichever device's instance it is (null: the default, 0).
  std::optional<size_t> slot_of(const std::shared_ptr<const EditModel>& model) const;
  // What the router needs of a request; `work_ms` holds its work per worker (the query's span).
  RouteQuery route_query(const ServingRequest& request, size_t slot, std::vector<double>& work_ms) const;
  // Under mu_: routes and counts the decision.
  size_t route_locked(std::span<const WorkerLoad> loads, const RouteQuery& query);
  // Sets the target device's instance of the model, calling the request's rebind when it
  // changes.
  Status bind_to_worker(ServingRequest& request, size_t slot, size_t target);
  // WorkerOptions::reroute: routes a request its worker handed back after leaving service
  // again (it keeps its id, submission time and callbacks), or ends it.
  void reroute(ServingRequest request, double submitted_ms);

  std::vector<RuntimeDevice> devices_;
  std::vector<size_t> worker_device_;  // the device of each worker
  std::shared_ptr<ActivationStore> store_;
  RuntimeOptions options_;
  std::chrono::steady_clock::time_point epoch_;
  std::unique_ptr<TaskPool> pool_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::shared_ptr<DeviceTeam> team_;
  Status team_status_;  // why there is no team_

  mutable std::mutex mu_;  // guards router_, live_ and routed_; never held while computing
  std::unique_ptr<Router> router_;
  std::unordered_map<uint64_t, Live> live_;
  std::vector<RouteCounts> routed_;  // per worker
  std::mutex reroute_mu_;  // held by reroute() while it hands a request over; guards stopping_
  bool stopping_ = false;
  std::condition_variable idle_cv_;
};

}  // namespace infill
