#include "serving/router.h"

#include <algorithm>
#include <string>

namespace infill {

const char* routing_policy_name(RoutingPolicy policy) {
  switch (policy) {
    case RoutingPolicy::kRoundRobin: return "round_robin";
    case RoutingPolicy::kLeastRequests: return "least_requests";
    case RoutingPolicy::kMaskAware: return "mask_aware";
  }
  return "unknown";
}

Result<RoutingPolicy> parse_routing_policy(std::string_view name) {
  for (RoutingPolicy p : {RoutingPolicy::kRoundRobin, RoutingPolicy::kLeastRequests, RoutingPolicy::kMaskAware}) {
    if (name == routing_policy_name(p)) return p;
  }
  return invalid_argument("routing policy '" + std::string(name) +
                          "' is unknown, expected round_robin, least_requests or mask_aware");
}

double request_work_ms(const StepCostModel& model, int64_t tokens, int64_t total_tokens, int steps) {
  const auto& c = model.coefficients();
  const double t = static_cast<double>(std::max<int64_t>(0, tokens));
  const double per_step = c[1] * t + c[2] + c[3] * t * static_cast<double>(total_tokens);
  return std::max(0.0, per_step) * std::max(0, steps);
}

double drain_ms(const StepCostModel& model, double work_ms_sum, int max_steps_left) {
  return std::max(0.0, work_ms_sum) + std::max(0.0, model.coefficients()[0]) * std::max(0, max_steps_left);
}

size_t Router::choose(std::span<const WorkerLoad> loads, double request_ms) {
  const size_t n = loads.size();
  // Workers out of service (their device failed) take nothing; the caller checks that one is in.
  auto usable = [&](size_t i) { return loads[i].in_service; };
  size_t first = 0;
  while (first + 1 < n && !usable(first)) ++first;
  switch (policy_) {
    case RoutingPolicy::kRoundRobin:
      for (size_t tries = 0; tries < n; ++tries) {
        const size_t i = cursor_++ % n;
        if (usable(i)) return i;
      }
      return first;
    case RoutingPolicy::kLeastRequests: {
      size_t best = first;
      for (size_t i = first + 1; i < n; ++i) {
        if (usable(i) && loads[i].requests < loads[best].requests) best = i;
      }
      return best;
    }
    case RoutingPolicy::kMaskAware: {
      size_t best = first;
      for (size_t i = first + 1; i < n; ++i) {
        if (!usable(i)) continue;
        const double a = loads[i].backlog_ms + request_ms, b = loads[best].backlog_ms + request_ms;
        if (a < b || (a == b && loads[i].requests < loads[best].requests)) best = i;
      }
      return best;
    }
  }
  return first;
}

}  // namespace infill
