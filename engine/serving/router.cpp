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

const char* route_reason_name(RouteReason reason) {
  switch (reason) {
    case RouteReason::kLeastLoaded: return "least_loaded";
    case RouteReason::kTemplateLocality: return "template_locality";
    case RouteReason::kLiveClient: return "live_client";
  }
  return "unknown";
}

template <class Key>
std::optional<size_t> Router::Recent<Key>::find(const Key& key) const {
  auto it = index_.find(key);
  if (it == index_.end()) return std::nullopt;
  return it->second->second;
}

template <class Key>
void Router::Recent<Key>::put(const Key& key, size_t worker) {
  auto it = index_.find(key);
  if (it != index_.end()) order_.erase(it->second);
  order_.emplace_front(key, worker);
  index_[key] = order_.begin();
  if (order_.size() > kRemembered) {
    index_.erase(order_.back().first);
    order_.pop_back();
  }
}

size_t Router::choose(std::span<const WorkerLoad> loads, double request_ms) {
  RouteQuery query;
  query.request_ms = request_ms;
  return route(loads, query).worker;
}

std::optional<size_t> Router::holder_of(const std::string& entry_key) const { return holders_.find(entry_key); }

std::optional<size_t> Router::worker_of_live_client(uint64_t client) const { return live_clients_.find(client); }

size_t Router::choose_by_policy(std::span<const WorkerLoad> loads, const RouteQuery& query, std::optional<size_t> holder) {
  const size_t n = loads.size();
  // Workers out of service (their device failed) take nothing; the caller checks that one is in.
  auto usable = [&](size_t i) { return loads[i].in_service; };
  auto own_ms = [&](size_t i) {
    return query.request_ms_by_worker.size() == n ? query.request_ms_by_worker[i] : query.request_ms;
  };
  // Ties go to the entry's holder, then to fewer requests, then to the lower index.
  auto holds = [&](size_t i) { return holder && *holder == i; };
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
        if (!usable(i)) continue;
        if (loads[i].requests < loads[best].requests || (loads[i].requests == loads[best].requests && holds(i)))
          best = i;
      }
      return best;
    }
    case RoutingPolicy::kMaskAware: {
      // The predicted completion on each worker, plus the entry's cost where it is not held.
      auto cost = [&](size_t i) {
        return loads[i].backlog_ms + own_ms(i) + (holder && !holds(i) ? std::max(0.0, query.entry_miss_ms) : 0.0);
      };
      size_t best = first;
      for (size_t i = first + 1; i < n; ++i) {
        if (!usable(i)) continue;
        const double a = cost(i), b = cost(best);
        if (a < b || (a == b && loads[i].requests < loads[best].requests)) best = i;
      }
      // The holder unless another finishes the edit sooner by more than the cost models'
      // error, taken as kLocalityTolerance of the edit's own work: two alike devices whose
      // refitted cost models differ by noise keep their templates.
      if (holder && *holder != best && cost(*holder) <= cost(best) + kLocalityTolerance * own_ms(*holder) + 1e-6)
        best = *holder;
      return best;
    }
  }
  return first;
}

RouteDecision Router::route(std::span<const WorkerLoad> loads, const RouteQuery& query) {
  const size_t n = loads.size();
  auto usable = [&](std::optional<size_t> i) { return i && *i < n && loads[*i].in_service; };
  RouteDecision d;
  const std::optional<size_t> holder = query.entry_key.empty() ? std::nullopt : holders_.find(query.entry_key);
  const std::optional<size_t> sticky = query.live_client ? live_clients_.find(*query.live_client) : std::nullopt;
  if (usable(sticky)) {
    d.worker = *sticky;
    d.reason = RouteReason::kLiveClient;
  } else {
    // Round-robin is the baseline that ignores what workers hold.
    const bool weigh_holder = usable(holder) && policy_ != RoutingPolicy::kRoundRobin;
    d.worker = choose_by_policy(loads, query, weigh_holder ? holder : std::nullopt);
    d.reason = weigh_holder && d.worker == *holder ? RouteReason::kTemplateLocality : RouteReason::kLeastLoaded;
  }
  if (holder && *holder != d.worker) d.locality_missed_worker = static_cast<int>(*holder);
  // The chosen worker now prepares or reads the entry, and serves the live client.
  if (!query.entry_key.empty()) holders_.put(query.entry_key, d.worker);
  if (query.live_client) live_clients_.put(*query.live_client, d.worker);
  return d;
}

}  // namespace infill
