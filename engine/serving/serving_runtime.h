#pragma once
/// The serving runtime of one device: N workers (one step loop each; one per device on a GPU,
/// a share of the cores each on the CPU), every worker serving every model, one task pool for
/// pre/post-processing, and a router that spreads requests over the workers. Handles ids,
/// cancel and supersede, across models.
///
/// Threading: every public method is safe from any thread. Request callbacks run on the pool.

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
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

struct RuntimeOptions {
  /// On a 2-core CPU, 2 workers of 1 compute thread or 1 worker of 2 are both valid set-ups.
  int workers = 1;
  int threads_per_worker = 1;
  int pool_threads = 1;
  RoutingPolicy routing = RoutingPolicy::kMaskAware;
  /// Applied to every worker (index and epoch are set by the runtime).
  WorkerOptions worker;
};

class ServingRuntime {
 public:
  /// Starts the workers, each serving every model of `models` (the first is the default of
  /// requests that name none). Errors: no model, a null model or cost model, two models with
  /// one id, models on different devices, workers or threads < 1, a null store.
  static Result<std::unique_ptr<ServingRuntime>> create(std::vector<ServedModel> models,
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

  /// Routes and queues a request. Errors (the request is then not queued and on_complete is
  /// not called): id 0 or already live, a model this runtime does not serve, supersedes naming
  /// a live request of another client, every worker out of service (unavailable, naming their
  /// device faults). A request may supersede one of another model.
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
  /// ms since the runtime started: the clock of every timestamp it reports.
  double now_ms() const;

 private:
  ServingRuntime() = default;

  struct Live {
    uint64_t client_id;
    size_t worker;
  };

  std::vector<ServedModel> models_;
  RuntimeOptions options_;
  std::chrono::steady_clock::time_point epoch_;
  std::unique_ptr<TaskPool> pool_;
  std::vector<std::unique_ptr<Worker>> workers_;

  mutable std::mutex mu_;  // guards router_ and live_; never held while computing
  std::unique_ptr<Router> router_;
  std::unordered_map<uint64_t, Live> live_;
  std::condition_variable idle_cv_;
};

}  // namespace infill
