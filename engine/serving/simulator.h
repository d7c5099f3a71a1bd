#pragma once
/// Discrete-event simulation of the serving runtime: the same BatchSelector (scheduler) and
/// Router as the real workers, driven by the step cost model instead of model execution, so
/// that clusters of 8, 64 or 512 devices can be planned on a laptop.
///
/// Modelled: routing at arrival (same load signal as Worker::load); pre-processing before a
/// request can join a step and post-processing after its last step, either as fixed delays or
/// as tasks queueing for a bounded pool of threads (first come first served, as the worker's
/// task pool); one step at a time per worker whose latency is the cost model's prediction for
/// the batch plus a fixed per-step overhead; optionally, the step loops and pool threads
/// sharing fewer cores than there are of them (work started while more are busy than there
/// are cores runs proportionally slower, fixed at its start). Not modelled: prepare jobs
/// (templates are assumed prepared), cancels. Optionally, step and pool times vary by factors
/// drawn from measured ratios (see SimOptions::step_time_factors).
///
/// Threading: a pure function; runs on the calling thread.

#include <cstdint>
#include <span>
#include <vector>

#include "serving/batch_policy.h"
#include "serving/cost_model.h"
#include "serving/request_state.h"
#include "serving/router.h"

namespace infill {

struct SimRequest {
  uint64_t id = 0;
  double arrival_ms = 0;
  int64_t tokens = 0;         ///< masked tokens per step (twice that for a guided request)
  int64_t total_tokens = 0;   ///< tokens of its grid
  int steps = 0;
  double deadline_ms = 0;     ///< relative to arrival
  RequestClass cls = RequestClass::kInteractive;
};

struct SimOptions {
  int workers = 1;
  BatchingPolicy policy = BatchingPolicy::kDeadline;
  RoutingPolicy routing = RoutingPolicy::kMaskAware;
  int64_t token_budget = 2048;
  SchedulerOptions scheduler;  ///< allow_step_reduction is honoured here
  double pre_ms = 0;           ///< arrival -> can join a step (pool work of pre-processing)
  double post_ms = 0;          ///< last step -> result (pool work of post-processing) ...
  double post_ms_per_token = 0;  ///< ... plus this per masked token (the decoded region grows)
  double step_overhead_ms = 0; ///< scheduling, packing and loop overhead per step
  /// Threads of the pre/post-processing pool shared by all workers; 0 = unbounded (pre_ms and
  /// post_ms are then pure delays).
  int pool_threads = 0;
  /// Cores shared by the step loops (one thread each) and the pool threads; 0 = no contention.
  int cores = 0;
  /// Run-to-run variation: each step's time, and each pool task's, is multiplied by a factor
  /// drawn uniformly (seeded by `seed`) from these lists, e.g. the measured / predicted ratios
  /// of real steps and tasks. A queue's tail grows with the variance of its service times, so
  /// exact times under-predict P95 on a noisy machine. Empty = exact times.
  std::vector<double> step_time_factors;
  std::vector<double> pool_time_factors;
  uint64_t seed = 1;
};

struct SimOutcome {
  uint64_t id = 0;
  int worker = 0;
  double latency_ms = 0;  ///< arrival -> result
  bool deadline_met = false;
  int steps_run = 0;
};

struct SimReport {
  std::vector<SimOutcome> requests;  ///< in the order of the input
  std::vector<double> busy_ms;       ///< per worker
  double makespan_ms = 0;            ///< first arrival -> last result
  uint64_t steps = 0;
};

/// Runs the trace to completion. Requests may come in any order (they are sorted by arrival).
SimReport simulate(std::span<const SimRequest> trace, const StepCostModel& cost, const SimOptions& options);

}  // namespace infill
