#pragma once
/// Discrete-event simulation of the serving runtime: the same BatchSelector (scheduler) and
/// Router as the real workers, driven by the step cost model instead of model execution, so
/// that clusters of 8, 64 or 512 devices can be planned on a laptop.
///
/// Modelled: routing at arrival (same load signal as Worker::load), pre-processing as a fixed
/// delay before a request can join a step, one step at a time per worker whose latency is the
/// cost model's prediction for the batch plus a fixed per-step overhead, post-processing as a
/// fixed delay after the last step. Not modelled: prepare jobs (templates are assumed prepared),
/// contention of the task pool with the step loops, cancels.
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
  double pre_ms = 0;           ///< arrival -> can join a step
  double post_ms = 0;          ///< last step -> result
  double step_overhead_ms = 0; ///< scheduling, packing and loop overhead per step
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
