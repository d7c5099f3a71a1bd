#pragma once
/// Request routing across workers: round-robin, least-requests, and FlashPS's mask-aware
/// policy (smallest predicted completion time including the worker's queue). Pure functions
/// plus a cursor, shared by the runtime and the simulator so both route identically.
///
/// Threading: a Router is used under its owner's lock (or by the single simulator thread).

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "common/status.h"
#include "serving/cost_model.h"

namespace infill {

/// Values only grow; 0 is not a policy.
enum class RoutingPolicy { kRoundRobin = 1, kLeastRequests = 2, kMaskAware = 3 };

/// "round_robin", "least_requests", "mask_aware".
const char* routing_policy_name(RoutingPolicy policy);
/// Inverse of routing_policy_name; the error names the offending text.
Result<RoutingPolicy> parse_routing_policy(std::string_view name);

/// What a worker reports about its load.
struct WorkerLoad {
  int requests = 0;         ///< requests routed to it and not yet terminal
  double backlog_ms = 0.0;  ///< predicted compute time of everything it holds (see backlog_ms)
  /// false once its device failed for good (device_fault.h): the router passes it over.
  bool in_service = true;
};

/// Marginal compute time of one request on a worker: `steps` steps of `tokens` masked tokens
/// on a grid of `total_tokens`, as the cost model charges one more request in a batch (its
/// tokens, one more segment, its attention work). The step's intercept is shared by the batch
/// and is not included.
double request_work_ms(const StepCostModel& model, int64_t tokens, int64_t total_tokens, int steps);

/// Predicted compute time to drain a worker: the sum of the requests' marginal work plus the
/// per-step intercept paid once per step for the longest remaining request.
double drain_ms(const StepCostModel& model, double work_ms_sum, int max_steps_left);

class Router {
 public:
  explicit Router(RoutingPolicy policy) : policy_(policy) {}
  RoutingPolicy policy() const { return policy_; }

  /// Index of the worker for a new request whose own work is `request_ms`. Mask-aware picks
  /// the smallest backlog_ms + request_ms (ties: fewer requests, then lower index);
  /// least-requests the fewest requests (ties: lower index); round-robin cycles. Workers out
  /// of service are passed over. Precondition: at least one load is in service.
  size_t choose(std::span<const WorkerLoad> loads, double request_ms);

 private:
  RoutingPolicy policy_;
  size_t cursor_ = 0;
};

}  // namespace infill
