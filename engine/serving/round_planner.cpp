#include "serving/round_planner.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <string>
#include <unordered_set>

namespace infill {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

// One (request, degree) option of the group knapsack.
struct Option {
  int degree = 0;
  int value = 0;
  double gpu_ms = 0;
};

// A plan's (or a partial plan's) objective: compared lexicographically, every part a sum.
struct Score {
  int value = 0;
  double gpu_ms = 0;
  int devices = 0;
  bool feasible = true;
};

Score operator+(const Score& s, const Option& o) {
  return {s.value + o.value, s.gpu_ms + o.gpu_ms, s.devices + o.degree, s.feasible};
}

// GPU times are sums taken in different orders: equal within a relative 1e-9.
bool less_gpu(double a, double b) {
  return b - a > 1e-9 * std::max({1.0, std::abs(a), std::abs(b)});
}

// True when a is strictly better than b.
bool better(const Score& a, const Score& b) {
  if (a.value != b.value) return a.value > b.value;
  if (less_gpu(a.gpu_ms, b.gpu_ms)) return true;
  if (less_gpu(b.gpu_ms, a.gpu_ms)) return false;
  return a.devices > b.devices;
}

// A request whose step in flight outlasts the round keeps its devices and degree.
bool pinned(const PlannerRequest& r, double now_ms, const RoundPlannerOptions& o) {
  return r.steps_left > 0 && !r.placement.empty() && r.ready_ms >= now_ms + o.round_ms;
}

Status check_inputs(std::span<const PlannerRequest> requests, const RoundPlannerOptions& o) {
  if (o.devices < 1)
    return invalid_argument("round planner: devices is " + std::to_string(o.devices) +
                            ", expected >= 1");
  if (o.heads < 1)
    return invalid_argument("round planner: heads is " + std::to_string(o.heads) +
                            ", expected >= 1");
  if (!(o.round_ms > 0) || !std::isfinite(o.round_ms)) {
    return invalid_argument("round planner: round_ms is " + std::to_string(o.round_ms) +
                            ", expected > 0");
  }
  if (o.max_degree < 0) {
    return invalid_argument("round planner: max_degree is " + std::to_string(o.max_degree) +
                            ", expected >= 0");
  }
  std::unordered_set<uint64_t> ids;
  std::vector<int> holder(static_cast<size_t>(o.devices), -1);
  for (size_t i = 0; i < requests.size(); ++i) {
    const PlannerRequest& r = requests[i];
    const std::string who = "round planner: request " + std::to_string(r.id);
    if (!ids.insert(r.id).second)
      return invalid_argument(who + " appears twice, expected unique ids");
    if (r.tokens < 1)
      return invalid_argument(who + " has " + std::to_string(r.tokens) + " tokens, expected >= 1");
    if (r.steps_left < 0) {
      return invalid_argument(who + " has " + std::to_string(r.steps_left) +
                              " steps left, expected >= 0");
    }
    for (int d : r.placement) {
      if (d < 0 || d >= o.devices) {
        return invalid_argument(who + "'s placement names device " + std::to_string(d) +
                                ", expected 0.." + std::to_string(o.devices - 1));
      }
      int& h = holder[static_cast<size_t>(d)];
      if (h == static_cast<int>(i))
        return invalid_argument(who + "'s placement names device " + std::to_string(d) + " twice");
      if (h >= 0) {
        return invalid_argument(
            who + "'s placement names device " + std::to_string(d) + ", which request " +
            std::to_string(requests[static_cast<size_t>(h)].id) + " also holds");
      }
      h = static_cast<int>(i);
    }
  }
  return Status::success();
}

// Devices for requests whose degree changed or who are new; see the header's "Placement".
class Placer {
 public:
  explicit Placer(int devices) : owner_(static_cast<size_t>(devices), -1) {}

  void take(int who, const std::vector<int>& devices) {
    for (int d : devices) owner_[static_cast<size_t>(d)] = who;
  }
  void release(const std::vector<int>& devices) {
    for (int d : devices) owner_[static_cast<size_t>(d)] = -1;
  }
  bool is_free(int d) const { return owner_[static_cast<size_t>(d)] < 0; }

  // A contiguous part of `held` (sorted) where there is one, else its least-spread part.
  static std::vector<int> shrink(const std::vector<int>& held, int degree) {
    size_t best = 0;
    int best_span = std::numeric_limits<int>::max();
    for (size_t s = 0; s + static_cast<size_t>(degree) <= held.size(); ++s) {
      const int span = held[s + static_cast<size_t>(degree) - 1] - held[s];
      if (span < best_span) {
        best_span = span;
        best = s;
      }
    }
    return {held.begin() + static_cast<std::ptrdiff_t>(best),
            held.begin() + static_cast<std::ptrdiff_t>(best) + degree};
  }

  // `held` (sorted, owned by `who`) plus free devices: a contiguous window around them if one
  // is free, else the free devices nearest to them.
  std::vector<int> grow(int who, const std::vector<int>& held, int degree) const {
    const int n = static_cast<int>(owner_.size());
    const int lo = held.front(), hi = held.back();
    for (int a = std::max(0, hi - degree + 1); a <= lo && a + degree <= n; ++a) {
      bool ok = true;
      for (int d = a; d < a + degree && ok; ++d) {
        ok = is_free(d) || owner_[static_cast<size_t>(d)] == who;
      }
      if (ok) {
        std::vector<int> w(static_cast<size_t>(degree));
        std::iota(w.begin(), w.end(), a);
        return w;
      }
    }
    std::vector<int> candidates;
    for (int d = 0; d < n; ++d) {
      if (is_free(d)) candidates.push_back(d);
    }
    const auto distance = [&](int d) {
      int best = n;
      for (int h : held) best = std::min(best, std::abs(h - d));
      return best;
    };
    std::stable_sort(candidates.begin(), candidates.end(),
                     [&](int a, int b) { return distance(a) < distance(b); });
    std::vector<int> out = held;
    out.insert(out.end(), candidates.begin(),
               candidates.begin() + (degree - static_cast<int>(held.size())));
    std::sort(out.begin(), out.end());
    return out;
  }

  // The smallest run of contiguous free devices that fits (its first `degree`), else the
  // `degree` free devices of least spread.
  std::vector<int> fresh(int degree) const {
    const int n = static_cast<int>(owner_.size());
    int best_start = -1, best_len = std::numeric_limits<int>::max();
    for (int d = 0; d < n;) {
      if (!is_free(d)) {
        ++d;
        continue;
      }
      int e = d;
      while (e < n && is_free(e)) ++e;
      if (e - d >= degree && e - d < best_len) {
        best_len = e - d;
        best_start = d;
      }
      d = e;
    }
    std::vector<int> out;
    if (best_start >= 0) {
      for (int d = best_start; d < best_start + degree; ++d) out.push_back(d);
      return out;
    }
    std::vector<int> free;
    for (int d = 0; d < n; ++d) {
      if (is_free(d)) free.push_back(d);
    }
    size_t best = 0;
    int best_span = std::numeric_limits<int>::max();
    for (size_t s = 0; s + static_cast<size_t>(degree) <= free.size(); ++s) {
      const int span = free[s + static_cast<size_t>(degree) - 1] - free[s];
      if (span < best_span) {
        best_span = span;
        best = s;
      }
    }
    return {free.begin() + static_cast<std::ptrdiff_t>(best),
            free.begin() + static_cast<std::ptrdiff_t>(best) + degree};
  }

 private:
  std::vector<int> owner_;
};

}  // namespace

std::vector<int> allowed_degrees(int heads, int devices, int max_degree) {
  std::vector<int> out;
  if (heads < 1 || devices < 1) return out;
  const int cap = max_degree > 0 ? std::min(devices, max_degree) : devices;
  for (int d = 1; d <= std::min(cap, heads); ++d) {
    if (heads % d == 0) out.push_back(d);
  }
  return out;
}

Result<RoundPlan> plan_round(std::span<const PlannerRequest> requests, double now_ms,
                             const StepMsFunction& step_ms, const RoundPlannerOptions& o) {
  INFILL_RETURN_IF_ERROR(check_inputs(requests, o));
  const std::vector<int> degrees = allowed_degrees(o.heads, o.devices, o.max_degree);
  const size_t n = requests.size();
  const size_t nd = degrees.size();
  const int cap = o.devices;
  for (const PlannerRequest& r : requests) {
    const int d = static_cast<int>(r.placement.size());
    if (pinned(r, now_ms, o) && !std::binary_search(degrees.begin(), degrees.end(), d)) {
      return invalid_argument(
          "round planner: request " + std::to_string(r.id) + " holds " + std::to_string(d) +
          " devices through the round (its step in flight), expected an allowed degree (a "
          "divisor of the " +
          std::to_string(o.heads) + " heads up to " + std::to_string(degrees.back()) + ")");
    }
  }

  // step[i * nd + k]: request i's step time at degrees[k].
  std::vector<double> step(n * nd);
  for (size_t i = 0; i < n; ++i) {
    for (size_t k = 0; k < nd; ++k) {
      const double ms = step_ms(requests[i].tokens, degrees[k]);
      if (!std::isfinite(ms) || ms <= 0) {
        return invalid_argument("round planner: the step time of request " +
                                std::to_string(requests[i].id) + " (" +
                                std::to_string(requests[i].tokens) + " tokens) at degree " +
                                std::to_string(degrees[k]) + " is " + std::to_string(ms) +
                                ", expected a positive finite value");
      }
      step[i * nd + k] = ms;
    }
  }

  // The options of each group: waiting first, then each allowed degree ascending.
  std::vector<std::vector<Option>> options(n);
  for (size_t i = 0; i < n; ++i) {
    const PlannerRequest& r = requests[i];
    const double steps = double(r.steps_left);
    std::vector<Option>& opts = options[i];
    if (r.steps_left == 0) {
      opts.push_back({0, r.ready_ms <= r.deadline_ms ? 1 : 0, 0.0});
      continue;
    }
    if (pinned(r, now_ms, o)) {
      // Busy through the round on its devices: only its degree, from its step's end.
      const int d = static_cast<int>(r.placement.size());
      const double s =
          step[i * nd + static_cast<size_t>(std::lower_bound(degrees.begin(), degrees.end(), d) -
                                            degrees.begin())];
      opts.push_back({d, r.ready_ms + steps * s <= r.deadline_ms ? 1 : 0, double(d) * steps * s});
      continue;
    }
    // Waiting: on time if the degree it would take now (the least GPU time on time) is still
    // on time from the next round.
    const double start = std::max(now_ms, r.ready_ms);
    const double start_next = std::max(now_ms + o.round_ms, r.ready_ms);
    double cheapest = kInfinity, cheapest_on_time = kInfinity;
    size_t k_on_time = nd;
    for (size_t k = 0; k < nd; ++k) {
      const double gpu = double(degrees[k]) * steps * step[i * nd + k];
      cheapest = std::min(cheapest, gpu);
      if (start + steps * step[i * nd + k] <= r.deadline_ms && gpu < cheapest_on_time) {
        cheapest_on_time = gpu;
        k_on_time = k;
      }
    }
    if (k_on_time < nd && start_next + steps * step[i * nd + k_on_time] <= r.deadline_ms) {
      opts.push_back({0, 1, cheapest_on_time});
    } else {
      opts.push_back({0, 0, cheapest});
    }
    for (size_t k = 0; k < nd; ++k) {
      const double s = step[i * nd + k];
      const Option opt{degrees[k], start + steps * s <= r.deadline_ms ? 1 : 0,
                       double(degrees[k]) * steps * s};
      // An option is dropped when one with fewer devices scores more, or as much for less GPU
      // time: swapping it in improves any plan. Typically a request keeps waiting, degree 1
      // and the least degree that is on time.
      const bool dominated = std::any_of(opts.begin(), opts.end(), [&](const Option& o) {
        return o.value > opt.value || (o.value == opt.value && less_gpu(o.gpu_ms, opt.gpu_ms));
      });
      if (!dominated) opts.push_back(opt);
    }
  }

  // Group knapsack: best[c] is the best score of the groups so far within c devices, or
  // infeasible (pinned requests need more than c).
  const size_t width = static_cast<size_t>(cap) + 1;
  std::vector<Score> best(width), next(width);
  std::vector<uint8_t> choice(n * width, 0);
  for (size_t i = 0; i < n; ++i) {
    for (size_t c = 0; c < width; ++c) {
      Score top;
      uint8_t top_k = 0;
      bool have = false;
      for (size_t k = 0; k < options[i].size(); ++k) {
        const Option& opt = options[i][k];
        if (static_cast<size_t>(opt.degree) > c) break;  // options ascend by degree
        const Score& before = best[c - static_cast<size_t>(opt.degree)];
        if (!before.feasible) continue;
        const Score s = before + opt;
        if (!have || better(s, top)) {
          top = s;
          top_k = static_cast<uint8_t>(k);
          have = true;
        }
      }
      next[c] = top;
      next[c].feasible = have;
      choice[i * width + c] = top_k;
    }
    best.swap(next);
  }

  std::vector<int> chosen(n, 0);  // option index per request
  {
    size_t c = width - 1;
    for (size_t i = n; i-- > 0;) {
      const uint8_t k = choice[i * width + c];
      chosen[i] = k;
      c -= static_cast<size_t>(options[i][k].degree);
    }
  }

  RoundPlan plan;
  plan.requests.resize(n);
  std::vector<int> degree(n, 0);
  int used = 0;
  for (size_t i = 0; i < n; ++i) {
    const Option& opt = options[i][static_cast<size_t>(chosen[i])];
    degree[i] = opt.degree;
    used += opt.degree;
    plan.requests[i].id = requests[i].id;
    plan.requests[i].on_time = opt.value == 1;
    plan.predicted_on_time += opt.value;
    plan.packing_gpu_ms += opt.gpu_ms;
  }

  const auto degree_index = [&](int d) {
    return static_cast<size_t>(std::lower_bound(degrees.begin(), degrees.end(), d) -
                               degrees.begin());
  };
  if (o.grant_idle_devices) {
    for (;;) {
      const int free = cap - used;
      size_t pick = n;
      int pick_to = 0;
      for (size_t i = 0; i < n && free > 0; ++i) {
        if (requests[i].steps_left == 0 || pinned(requests[i], now_ms, o)) continue;
        const size_t k = degree[i] == 0 ? 0 : degree_index(degree[i]) + 1;
        if (k >= nd || degrees[k] - degree[i] > free) continue;
        if (degree[i] > 0 && !(step[i * nd + k] < step[i * nd + degree_index(degree[i])])) continue;
        if (pick == n || requests[i].deadline_ms < requests[pick].deadline_ms) {
          pick = i;
          pick_to = degrees[k];
        }
      }
      if (pick == n) break;
      plan.devices_granted += pick_to - degree[pick];
      used += pick_to - degree[pick];
      degree[pick] = pick_to;
    }
  }
  plan.devices_used = used;

  // Placement: kept, shrunk, grown, then new, larger degrees first within each kind. The
  // devices of every request that runs are reserved for it first, so that no grown or new
  // request takes another's.
  Placer placer(cap);
  std::vector<std::vector<int>> held(n);
  for (size_t i = 0; i < n; ++i) {
    held[i] = requests[i].placement;
    std::sort(held[i].begin(), held[i].end());
    if (degree[i] > 0) placer.take(static_cast<int>(i), held[i]);
  }
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return degree[a] > degree[b]; });
  const auto pass = [&](auto&& applies, auto&& place) {
    for (size_t i : order) {
      if (degree[i] == 0 || !applies(i)) continue;
      plan.requests[i].devices = place(i);
      placer.take(static_cast<int>(i), plan.requests[i].devices);
    }
  };
  const auto size_of = [&](size_t i) { return static_cast<int>(held[i].size()); };
  pass([&](size_t i) { return size_of(i) == degree[i]; }, [&](size_t i) { return held[i]; });
  pass([&](size_t i) { return size_of(i) > degree[i]; },
       [&](size_t i) {
         placer.release(held[i]);
         return Placer::shrink(held[i], degree[i]);
       });
  pass([&](size_t i) { return size_of(i) > 0 && size_of(i) < degree[i]; },
       [&](size_t i) { return placer.grow(static_cast<int>(i), held[i], degree[i]); });
  pass([&](size_t i) { return size_of(i) == 0; },
       [&](size_t i) { return placer.fresh(degree[i]); });

  for (size_t i = 0; i < n; ++i) {
    PlannedRequest& p = plan.requests[i];
    const PlannerRequest& r = requests[i];
    p.degree = degree[i];
    p.moved = !held[i].empty() && p.devices != held[i];
    if (p.degree == 0) {
      p.finish_ms = r.steps_left == 0 ? r.ready_ms : kInfinity;
      continue;
    }
    const double s = step[i * nd + degree_index(p.degree)];
    const double start = std::max(now_ms, r.ready_ms);
    const double end = now_ms + o.round_ms;
    p.finish_ms = start + double(r.steps_left) * s;
    p.steps =
        start < end ? std::min(r.steps_left, static_cast<int>(std::ceil((end - start) / s))) : 0;
  }
  return plan;
}

}  // namespace infill
