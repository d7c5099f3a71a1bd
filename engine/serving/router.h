#pragma once
/// Request routing across workers: round-robin, least-requests, and FlashPS's mask-aware
/// policy (smallest predicted completion time including the worker's queue), with two
/// affinities for an engine with several devices (route()):
/// - template locality: the worker an edit's template entry was last routed to (the one that
///   prepared or last served it) holds the entry: on a GPU in its device tier, so another
///   device would copy it over the bus; before the entry is stored, its prepare job, which
///   another worker would run again. Under mask-aware routing the holder is chosen unless
///   another worker's backlog + the request's work + `entry_miss_ms` (what it pays to get the
///   entry) is smaller by more than kLocalityTolerance of the request's work (the cost models'
///   error). On CPU devices, whose RAM tier is shared, a stored entry costs the others nothing
///   (`entry_miss_ms` 0), so the holder then keeps the edit only within that tolerance.
/// - live clients: a live-painting client's edits stay on the worker its first one went to
///   (its strokes supersede each other there and read the prompt-keyed entry its background
///   prepare made there), until that worker leaves service.
/// Pure functions plus a cursor and those two bounded maps, shared by the runtime and the
/// simulator so both route identically.
///
/// Threading: a Router is used under its owner's lock (or by the single simulator thread).

#include <cstddef>
#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>

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

/// What route() knows of a request beyond its work.
struct RouteQuery {
  /// The request's own work on any worker (see request_work_ms).
  double request_ms = 0.0;
  /// When not empty (one per worker): the request's work on each worker's device, from that
  /// worker's cost model of the model; replaces request_ms.
  std::span<const double> request_ms_by_worker;
  /// The template entry the edit reads (its cache key); "" = none (no template locality).
  std::string entry_key;
  /// What a worker that does not hold the entry pays to get it (ms): its prepare, or its copy
  /// to another GPU; 0 = nothing (a stored entry in a RAM tier the workers share).
  double entry_miss_ms = 0.0;
  /// A live-painting client's id: its edits stay on one worker. Empty for other classes.
  std::optional<uint64_t> live_client;
};

/// Why route() chose its worker. Values only grow; 0 is not a reason.
enum class RouteReason {
  kLeastLoaded = 1,       ///< the policy's choice: no affinity applied
  kTemplateLocality = 2,  ///< the worker holding the edit's template entry
  kLiveClient = 3,        ///< the worker of the live client's earlier edits
};

/// "least_loaded", "template_locality", "live_client".
const char* route_reason_name(RouteReason reason);

struct RouteDecision {
  size_t worker = 0;
  RouteReason reason = RouteReason::kLeastLoaded;
  /// A worker held the entry but was passed over (out of service, or dearer than another);
  /// -1 when none did or it was chosen.
  int locality_missed_worker = -1;
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

  /// The worker for a request with affinities (see the file comment): a live client's worker
  /// while it is in service; else the policy's choice, where mask-aware and least-requests
  /// weigh the entry's holder as above (round-robin ignores locality). Remembers the choice
  /// as the entry's holder and the live client's worker. Precondition: at least one load is
  /// in service.
  RouteDecision route(std::span<const WorkerLoad> loads, const RouteQuery& query);

  /// The worker an entry or a live client was last routed to, if remembered.
  std::optional<size_t> holder_of(const std::string& entry_key) const;
  std::optional<size_t> worker_of_live_client(uint64_t client) const;

  /// Entries and live clients remembered (each map keeps the most recent ones).
  static constexpr size_t kRemembered = 4096;
  /// The holder of an edit's entry keeps it while no worker would finish it sooner by more
  /// than this share of its own work (mask-aware routing).
  static constexpr double kLocalityTolerance = 0.1;

 private:
  // A bounded map, least recently routed first out.
  template <class Key>
  class Recent {
   public:
    std::optional<size_t> find(const Key& key) const;
    void put(const Key& key, size_t worker);

   private:
    std::list<std::pair<Key, size_t>> order_;  // most recent first
    std::unordered_map<Key, typename std::list<std::pair<Key, size_t>>::iterator> index_;
  };

  size_t choose_by_policy(std::span<const WorkerLoad> loads, const RouteQuery& query, std::optional<size_t> holder);

  RoutingPolicy policy_;
  size_t cursor_ = 0;
  Recent<std::string> holders_;
  Recent<uint64_t> live_clients_;
};

}  // namespace infill
