#include "serving/batch_policy.h"

#include <algorithm>
#include <string>
#include <unordered_set>

namespace infill {

const char* batching_policy_name(BatchingPolicy policy) {
  switch (policy) {
    case BatchingPolicy::kStatic: return "static";
    case BatchingPolicy::kContinuous: return "continuous";
    case BatchingPolicy::kDeadline: return "deadline";
  }
  return "unknown";
}

Result<BatchingPolicy> parse_batching_policy(std::string_view name) {
  for (BatchingPolicy p : {BatchingPolicy::kStatic, BatchingPolicy::kContinuous, BatchingPolicy::kDeadline}) {
    if (name == batching_policy_name(p)) return p;
  }
  return invalid_argument("batching policy '" + std::string(name) +
                          "' is unknown, expected static, continuous or deadline");
}

BatchSelector::BatchSelector(BatchingPolicy policy, int64_t token_budget, SchedulerOptions options)
    : policy_(policy), token_budget_(std::max<int64_t>(1, token_budget)), options_(options) {}

SchedDecision BatchSelector::select(const std::vector<SchedCandidate>& ready, double now_ms,
                                    const StepLatencyFn& step_ms) {
  SchedDecision decision;
  if (policy_ == BatchingPolicy::kDeadline) {
    return schedule_step(ready, token_budget_, now_ms, step_ms, options_);
  }
  std::unordered_set<uint64_t> present;
  for (const SchedCandidate& c : ready) {
    if (c.steps_left > 0) present.insert(c.id);
  }
  // Members that finished or were cancelled leave the batch.
  std::erase_if(members_, [&](uint64_t id) { return !present.contains(id); });
  const bool admit = policy_ == BatchingPolicy::kContinuous || members_.empty();
  if (admit) {
    int64_t used = 0;
    std::unordered_set<uint64_t> in(members_.begin(), members_.end());
    for (const SchedCandidate& c : ready) {
      if (in.contains(c.id)) used += std::max<int64_t>(0, c.tokens);
    }
    for (const SchedCandidate& c : ready) {
      if (c.steps_left <= 0 || in.contains(c.id)) continue;
      const int64_t t = std::max<int64_t>(0, c.tokens);
      // Strict FCFS: the head that does not fit blocks the ones behind it, unless the batch
      // is empty (an oversized request then runs alone rather than never).
      if (used + t > token_budget_ && !members_.empty()) break;
      members_.push_back(c.id);
      in.insert(c.id);
      used += t;
    }
  }
  decision.advance = members_;
  return decision;
}

}  // namespace infill
