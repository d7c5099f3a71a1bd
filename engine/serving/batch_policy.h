#pragma once
/// Which requests advance at a step boundary, under one of three batching policies. The real
/// worker and the simulator both call BatchSelector, so they schedule identically.
///
/// Threading: a BatchSelector belongs to one step loop (or one simulated worker); it keeps the
/// current batch of the static and continuous policies between calls.

#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "serving/step_scheduler.h"

namespace infill {

/// Values only grow; 0 is not a policy.
enum class BatchingPolicy {
  /// A batch formed when the worker is idle runs to completion; arrivals wait for it to end.
  kStatic = 1,
  /// FCFS continuous batching: requests join at any step boundary in arrival order while the
  /// token budget allows, every admitted request advances every step, and leaves when done.
  kContinuous = 2,
  /// Deadline-aware: schedule_step() picks the batch of every step (urgent first, knapsack
  /// over the budget); a request not picked waits (preemption at step boundaries only).
  kDeadline = 3,
};

/// "static", "continuous", "deadline".
const char* batching_policy_name(BatchingPolicy policy);
/// Inverse of batching_policy_name; the error names the offending text.
Result<BatchingPolicy> parse_batching_policy(std::string_view name);

/// Predicted latency of one step carrying `tokens` packed tokens of `batch` requests.
using StepLatencyFn = std::function<double(int64_t tokens, int batch)>;

class BatchSelector {
 public:
  BatchSelector(BatchingPolicy policy, int64_t token_budget, SchedulerOptions options = {});

  /// Chooses the requests of the next step among `ready` (every request of this worker that
  /// could advance now, in arrival order: FCFS policies admit in that order). Requests that
  /// left (done, cancelled) are simply absent and drop out of the current batch.
  /// SchedDecision::reduce_steps is only ever filled by the deadline policy.
  SchedDecision select(const std::vector<SchedCandidate>& ready, double now_ms,
                       const StepLatencyFn& step_ms);

  BatchingPolicy policy() const { return policy_; }
  int64_t token_budget() const { return token_budget_; }

 private:
  BatchingPolicy policy_;
  int64_t token_budget_;
  SchedulerOptions options_;
  std::vector<uint64_t> members_;  // static: the running batch; continuous: admitted requests
};

}  // namespace infill
