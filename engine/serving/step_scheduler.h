#pragma once
/// Per-step batch selection for the denoising loop: before every step, which requests advance.
///
/// Pure function of its inputs (no state, no threads); the step loop calls it at each step
/// boundary, which is the only place a request can be preempted.
///
/// Each candidate is classified with one estimated step latency dt = step_ms(tokens the batch
/// would carry if everything fit, capped at the budget; number of candidates):
///   - urgent:   skipping this step makes it late (now + dt * (steps_left + 1) > deadline) while
///               advancing keeps it on time (now + dt * steps_left <= deadline); also any request
///               that waited longer than max_wait_ms (anti-starvation), and, with
///               allow_step_reduction, a request late at its current step count but on time at
///               some count in [min_steps_left, steps_left) ("rescuable").
///   - slack:    on time whether advanced or not this step.
///   - tight:    late at dt, but on time in a smaller, faster batch: its allowance
///               (deadline - now) / steps_left is at least step_ms(its tokens, 1).
///   - hopeless: late whatever happens now.
/// Selection: urgent first (starving requests by longest wait, then earliest deadline)
/// while each fits the remaining token budget; then tight requests, smallest allowance first,
/// each only while the predicted step stays within the allowance of every tight request taken.
/// If one was taken, its allowance paces the step: slack requests join fewest tokens first
/// while the step stays within it (latency grows with tokens and batch size, so this is the
/// largest count), then hopeless ones, and selection ends. Otherwise a 0/1 knapsack DP over
/// the remaining budget picks the slack requests (maximum count, ties to earlier deadlines);
/// leftover budget goes to remaining slack requests, then hopeless ones. Hopeless requests
/// beside others join fewest tokens first only while the step's predicted latency grows by at
/// most hopeless_ride_fraction (and stays within the pace); in a step of their own they fill
/// the budget, earliest deadline first. Late work thus yields to work that can still be on
/// time (under overload, serving it anyway makes everyone late), yet rides along where it is
/// nearly free and runs whenever nothing else is ready.
/// Urgent and slack requests never constrain the batch: their deadlines hold even at dt, the
/// latency of the fullest batch. If nothing fits at all, the
/// single highest-priority request is advanced alone even though it exceeds the budget, so an
/// oversized request cannot deadlock the queue.

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "serving/request_state.h"

namespace infill {

/// One request waiting at a step boundary.
struct SchedCandidate {
  uint64_t id = 0;
  int64_t tokens = 0;       ///< masked tokens this request adds to the step's packed batch
  int steps_left = 0;       ///< denoising steps still to run, including this one
  int min_steps_left = 0;   ///< smallest steps_left its class allows after reduction
  double deadline_ms = 0;   ///< absolute, same clock as now_ms
  RequestClass cls = RequestClass::kInteractive;
  double waiting_ms = 0;    ///< time since this request last advanced
};

struct SchedulerOptions {
  /// A request that waited longer than this (since it last advanced) is treated as urgent:
  /// the batch class, and hopeless requests under sustained overload, cannot starve.
  double max_wait_ms = 30000.0;
  /// How much longer (as a fraction of its predicted latency) a step with other requests may
  /// get for hopeless ones to ride along; see the selection rules above.
  double hopeless_ride_fraction = 0.1;
  /// Lets the scheduler cut a request's remaining steps (down to min_steps_left) to save its
  /// deadline; every cut is reported in SchedDecision::reduce_steps.
  bool allow_step_reduction = true;
  /// Upper bound on the knapsack's capacity buckets; token weights are rounded up to buckets
  /// of ceil(remaining_budget / max_buckets) tokens, so the budget is never exceeded.
  int max_buckets = 256;
};

struct SchedDecision {
  /// Requests to run this step, in selection order.
  std::vector<uint64_t> advance;
  /// (id, new steps_left) for advanced requests whose step count is cut to meet a deadline.
  std::vector<std::pair<uint64_t, int>> reduce_steps;
};

/// Chooses the batch for the next denoising step. `step_ms(tokens, batch)` predicts one step's
/// latency (e.g. from StepCostModel). Candidates with steps_left <= 0 are ignored; negative
/// token counts count as 0. The sum of advanced tokens is <= token_budget except when a single
/// request larger than the budget is advanced alone.
SchedDecision schedule_step(const std::vector<SchedCandidate>& candidates, int64_t token_budget,
                            double now_ms,
                            const std::function<double(int64_t tokens, int batch)>& step_ms,
                            const SchedulerOptions& options);

}  // namespace infill
