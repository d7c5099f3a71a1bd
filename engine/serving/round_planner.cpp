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

// One way a request can run this round: `devices` devices at Ulysses degree `degree` per
// forward; a guided request's halves split over two groups of `degree`, or packed.
struct Mode {
  int devices = 0;
  int degree = 0;
  bool split = false;
  double step_ms = 0;
};

// One (request, mode) option of the group knapsack; mode -1 waits.
struct Option {
  int mode = -1;
  int devices = 0;
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
  return {s.value + o.value, s.gpu_ms + o.gpu_ms, s.devices + o.devices, s.feasible};
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
  std::vector<bool> unavailable(static_cast<size_t>(o.devices), false);
  for (int d : o.unavailable) {
    if (d < 0 || d >= o.devices) {
      return invalid_argument("round planner: unavailable device " + std::to_string(d) + ", expected 0.." +
                              std::to_string(o.devices - 1));
    }
    if (unavailable[static_cast<size_t>(d)])
      return invalid_argument("round planner: unavailable device " + std::to_string(d) + " is listed twice");
    unavailable[static_cast<size_t>(d)] = true;
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
    if (r.split && !r.guided)
      return invalid_argument(who + " is split but not guided, expected split only when guided");
    if (r.heads < 0)
      return invalid_argument(who + " has " + std::to_string(r.heads) + " heads, expected >= 0");
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
      if (unavailable[static_cast<size_t>(d)]) {
        return invalid_argument(who + "'s placement names device " + std::to_string(d) +
                                ", which is unavailable");
      }
    }
  }
  // Homes, once every placement is known.
  std::vector<int> home_of(static_cast<size_t>(o.devices), -1);
  for (size_t i = 0; i < requests.size(); ++i) {
    const PlannerRequest& r = requests[i];
    if (r.home < 0) continue;
    const std::string who = "round planner: request " + std::to_string(r.id);
    if (r.home >= o.devices) {
      return invalid_argument(who + "'s home is device " + std::to_string(r.home) + ", expected 0.." +
                              std::to_string(o.devices - 1) + " or -1");
    }
    const size_t h = static_cast<size_t>(r.home);
    if (unavailable[h])
      return invalid_argument(who + "'s home is device " + std::to_string(r.home) + ", which is unavailable");
    if (home_of[h] >= 0) {
      return invalid_argument(who + "'s home is device " + std::to_string(r.home) + ", the home of request " +
                              std::to_string(requests[static_cast<size_t>(home_of[h])].id) + " too");
    }
    home_of[h] = static_cast<int>(i);
    if (holder[h] >= 0 && holder[h] != static_cast<int>(i)) {
      return invalid_argument(who + "'s home is device " + std::to_string(r.home) + ", which request " +
                              std::to_string(requests[static_cast<size_t>(holder[h])].id) + " holds");
    }
    if (!r.placement.empty() && holder[h] != static_cast<int>(i)) {
      return invalid_argument(who + "'s placement leaves out its home, device " + std::to_string(r.home) +
                              ", expected a placement that includes it");
    }
  }
  return Status::success();
}

// Devices for requests whose degree changed or who are new; see the header's "Placement".
class Placer {
 public:
  // Unavailable devices are owned by no request (-2): never free.
  Placer(int devices, const std::vector<int>& unavailable) : owner_(static_cast<size_t>(devices), -1) {
    for (int d : unavailable) owner_[static_cast<size_t>(d)] = -2;
  }

  void take(int who, const std::vector<int>& devices) {
    for (int d : devices) owner_[static_cast<size_t>(d)] = who;
  }
  void release(const std::vector<int>& devices) {
    for (int d : devices) owner_[static_cast<size_t>(d)] = -1;
  }
  bool is_free(int d) const { return owner_[static_cast<size_t>(d)] == -1; }

  // A contiguous part of `held` (sorted) where there is one, else its least-spread part;
  // a part with `home` in it when home >= 0.
  static std::vector<int> shrink(const std::vector<int>& held, int degree, int home) {
    size_t best = 0;
    int best_span = std::numeric_limits<int>::max();
    for (size_t s = 0; s + static_cast<size_t>(degree) <= held.size(); ++s) {
      const auto part = held.begin() + static_cast<std::ptrdiff_t>(s);
      if (home >= 0 && std::find(part, part + degree, home) == part + degree) continue;
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
  return plan_round(requests, now_ms, step_ms, GuidedStepMsFunction{}, o);
}

Result<RoundPlan> plan_round(std::span<const PlannerRequest> requests, double now_ms,
                             const StepMsFunction& step_ms,
                             const GuidedStepMsFunction& guided_step_ms,
                             const RoundPlannerOptions& o) {
  INFILL_RETURN_IF_ERROR(check_inputs(requests, o));
  const int cap = o.devices - static_cast<int>(o.unavailable.size());  // the devices to give
  const std::vector<int> degrees = allowed_degrees(o.heads, std::max(cap, 1), o.max_degree);
  const size_t n = requests.size();

  // modes[i]: request i's modes by device count ascending (packed before split at one count):
  // one per allowed degree, and for a guided request also split at each allowed degree d with
  // 2 d devices free. Split modes are listed (and their step times checked) even where
  // split_guidance is off, for a pinned split request; offered[i][m] says which are options.
  std::vector<std::vector<Mode>> modes(n);
  std::vector<std::vector<bool>> offered(n);
  for (size_t i = 0; i < n; ++i) {
    const PlannerRequest& r = requests[i];
    const StepMsFunction& step_of = r.step_ms ? r.step_ms : step_ms;
    const GuidedStepMsFunction& guided_of = r.guided_step_ms ? r.guided_step_ms : guided_step_ms;
    if (r.guided && !guided_of) {
      return invalid_argument("round planner: request " + std::to_string(r.id) +
                              " is guided, expected a guided step function");
    }
    const auto add = [&](int degree, bool split) -> Status {
      const double ms =
          r.guided ? guided_of(r.tokens, degree, split) : step_of(r.tokens, degree);
      if (!std::isfinite(ms) || ms <= 0) {
        return invalid_argument(
            "round planner: the step time of request " + std::to_string(r.id) + " (" +
            std::to_string(r.tokens) + " tokens" +
            (r.guided ? (split ? ", guided, halves split" : ", guided, halves packed") : "") +
            ") at degree " + std::to_string(degree) + " is " + std::to_string(ms) +
            ", expected a positive finite value");
      }
      modes[i].push_back({split ? 2 * degree : degree, degree, split, ms});
      offered[i].push_back(!split || o.split_guidance);
      return Status::success();
    };
    const std::vector<int> own_degrees =
        r.heads > 0 ? allowed_degrees(r.heads, std::max(cap, 1), o.max_degree) : degrees;
    for (int d : own_degrees) INFILL_RETURN_IF_ERROR(add(d, false));
    if (r.guided && r.may_split) {
      for (int d : own_degrees) {
        if (2 * d <= cap && (o.max_split_degree == 0 || d <= o.max_split_degree)) INFILL_RETURN_IF_ERROR(add(d, true));
      }
    }
    // Stable by device count: packed before split at one count, degrees ascending.
    std::vector<size_t> order(modes[i].size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return modes[i][a].devices < modes[i][b].devices; });
    std::vector<Mode> sorted_modes;
    std::vector<bool> sorted_offered;
    for (size_t k : order) {
      sorted_modes.push_back(modes[i][k]);
      sorted_offered.push_back(offered[i][k]);
    }
    modes[i] = std::move(sorted_modes);
    offered[i] = std::move(sorted_offered);
  }

  // A pinned request's one mode: its devices and split, from its step's end.
  std::vector<int> pinned_mode(n, -1);
  for (size_t i = 0; i < n; ++i) {
    const PlannerRequest& r = requests[i];
    if (!pinned(r, now_ms, o)) continue;
    const int d = static_cast<int>(r.placement.size());
    for (size_t m = 0; m < modes[i].size(); ++m) {
      if (modes[i][m].devices == d && modes[i][m].split == r.split) {
        pinned_mode[i] = static_cast<int>(m);
        break;
      }
    }
    if (pinned_mode[i] >= 0) continue;
    const int heads = r.heads > 0 ? r.heads : o.heads;
    const std::vector<int> own = allowed_degrees(heads, std::max(cap, 1), o.max_degree);
    if (!r.guided) {
      return invalid_argument(
          "round planner: request " + std::to_string(r.id) + " holds " + std::to_string(d) +
          " devices through the round (its step in flight), expected an allowed degree (a "
          "divisor of the " +
          std::to_string(heads) + " heads up to " + std::to_string(own.back()) + ")");
    }
    return invalid_argument(
        "round planner: request " + std::to_string(r.id) + " holds " + std::to_string(d) +
        " devices through the round (its guided step in flight, halves " +
        (r.split ? "split" : "packed") + "), expected " + (r.split ? "twice " : "") +
        "an allowed degree (a divisor of the " + std::to_string(heads) + " heads up to " +
        std::to_string(own.back()) + ")" + (r.may_split ? "" : ", and it may not split"));
  }

  // The options of each group: waiting first, then each offered mode by device count.
  std::vector<std::vector<Option>> options(n);
  for (size_t i = 0; i < n; ++i) {
    const PlannerRequest& r = requests[i];
    const double steps = double(r.steps_left);
    const std::vector<Mode>& ms = modes[i];
    std::vector<Option>& opts = options[i];
    if (r.steps_left == 0) {
      opts.push_back({-1, 0, r.ready_ms <= r.deadline_ms ? 1 : 0, 0.0});
      continue;
    }
    if (pinned_mode[i] >= 0) {
      // Busy through the round on its devices: only its mode, from its step's end.
      const Mode& m = ms[static_cast<size_t>(pinned_mode[i])];
      opts.push_back({pinned_mode[i], m.devices,
                      r.ready_ms + steps * m.step_ms <= r.deadline_ms ? 1 : 0,
                      double(m.devices) * steps * m.step_ms});
      continue;
    }
    // Waiting: on time if the mode it would take now (the least GPU time on time) is still
    // on time from the next round; for a request with a home, if its home alone (modes[i][0],
    // one device) is (see "Homes"). Without homes_may_wait a request with a home does not wait.
    const double start = std::max(now_ms, r.ready_ms);
    const double start_next = std::max(now_ms + o.round_ms, r.ready_ms);
    double cheapest = kInfinity, cheapest_on_time = kInfinity;
    size_t m_on_time = ms.size();
    for (size_t m = 0; m < ms.size(); ++m) {
      if (!offered[i][m]) continue;
      const double gpu = double(ms[m].devices) * steps * ms[m].step_ms;
      cheapest = std::min(cheapest, gpu);
      if (start + steps * ms[m].step_ms <= r.deadline_ms && gpu < cheapest_on_time) {
        cheapest_on_time = gpu;
        m_on_time = m;
      }
    }
    if (r.home >= 0 && !o.homes_may_wait) {
      // no waiting option
    } else if (m_on_time < ms.size() &&
               start_next + steps * ms[r.home >= 0 ? 0 : m_on_time].step_ms <= r.deadline_ms) {
      opts.push_back({-1, 0, 1, cheapest_on_time});
    } else {
      opts.push_back({-1, 0, 0, cheapest});
    }
    for (size_t m = 0; m < ms.size(); ++m) {
      if (!offered[i][m]) continue;
      const Option opt{static_cast<int>(m), ms[m].devices,
                       start + steps * ms[m].step_ms <= r.deadline_ms ? 1 : 0,
                       double(ms[m].devices) * steps * ms[m].step_ms};
      // An option is dropped when one with no more devices scores more, or as much for less
      // GPU time: swapping it in improves any plan. Typically a request keeps waiting, degree
      // 1 and the least degree that is on time.
      const bool dominated = std::any_of(opts.begin(), opts.end(), [&](const Option& p) {
        return p.value > opt.value || (p.value == opt.value && less_gpu(p.gpu_ms, opt.gpu_ms));
      });
      if (!dominated) opts.push_back(opt);
    }
  }

  // Group knapsack: best[c] is the best score of the groups so far within c devices, or
  // infeasible (pinned requests need more than c).
  const size_t width = static_cast<size_t>(cap) + 1;
  std::vector<Score> best(width), next(width);
  std::vector<uint16_t> choice(n * width, 0);
  for (size_t i = 0; i < n; ++i) {
    for (size_t c = 0; c < width; ++c) {
      Score top;
      uint16_t top_k = 0;
      bool have = false;
      for (size_t k = 0; k < options[i].size(); ++k) {
        const Option& opt = options[i][k];
        if (static_cast<size_t>(opt.devices) > c) break;  // options ascend by devices
        const Score& before = best[c - static_cast<size_t>(opt.devices)];
        if (!before.feasible) continue;
        const Score s = before + opt;
        if (!have || better(s, top)) {
          top = s;
          top_k = static_cast<uint16_t>(k);
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
      const uint16_t k = choice[i * width + c];
      chosen[i] = k;
      c -= static_cast<size_t>(options[i][k].devices);
    }
  }

  RoundPlan plan;
  plan.requests.resize(n);
  std::vector<int> mode(n, -1);  // index into modes[i]; -1 waits
  std::vector<int> count(n, 0);  // devices of that mode
  int used = 0;
  for (size_t i = 0; i < n; ++i) {
    const Option& opt = options[i][static_cast<size_t>(chosen[i])];
    mode[i] = opt.mode;
    count[i] = opt.devices;
    used += opt.devices;
    plan.requests[i].id = requests[i].id;
    plan.requests[i].on_time = opt.value == 1;
    plan.predicted_on_time += opt.value;
    plan.packing_gpu_ms += opt.gpu_ms;
  }

  if (o.grant_idle_devices) {
    // ladder[i]: per device count the fastest offered mode (the first on ties), ascending.
    std::vector<std::vector<int>> ladder(n);
    for (size_t i = 0; i < n; ++i) {
      for (size_t m = 0; m < modes[i].size(); ++m) {
        if (!offered[i][m]) continue;
        std::vector<int>& l = ladder[i];
        if (!l.empty() && modes[i][static_cast<size_t>(l.back())].devices == modes[i][m].devices) {
          if (modes[i][m].step_ms < modes[i][static_cast<size_t>(l.back())].step_ms)
            l.back() = static_cast<int>(m);
        } else {
          l.push_back(static_cast<int>(m));
        }
      }
    }
    const auto rung_above = [&](size_t i) -> int {
      for (int m : ladder[i]) {
        if (modes[i][static_cast<size_t>(m)].devices > count[i]) return m;
      }
      return -1;
    };
    for (;;) {
      const int free = cap - used;
      size_t pick = n;
      int pick_to = -1;
      for (size_t i = 0; i < n && free > 0; ++i) {
        if (requests[i].steps_left == 0 || pinned_mode[i] >= 0) continue;
        const int to = rung_above(i);
        if (to < 0 || modes[i][static_cast<size_t>(to)].devices - count[i] > free) continue;
        if (mode[i] >= 0 && !(modes[i][static_cast<size_t>(to)].step_ms <
                              modes[i][static_cast<size_t>(mode[i])].step_ms))
          continue;
        if (pick == n || requests[i].deadline_ms < requests[pick].deadline_ms) {
          pick = i;
          pick_to = to;
        }
      }
      if (pick == n) break;
      const int grown = modes[pick][static_cast<size_t>(pick_to)].devices - count[pick];
      plan.devices_granted += grown;
      used += grown;
      mode[pick] = pick_to;
      count[pick] += grown;
    }
  }
  plan.devices_used = used;

  // Placement by device count: kept, shrunk, grown, then new, larger counts first within each
  // kind. The devices of every request that runs are reserved for it first, so that no grown
  // or new request takes another's.
  Placer placer(o.devices, o.unavailable);
  std::vector<std::vector<int>> held(n);
  for (size_t i = 0; i < n; ++i) {
    held[i] = requests[i].placement;
    if (held[i].empty() && requests[i].home >= 0) held[i] = {requests[i].home};
    std::sort(held[i].begin(), held[i].end());
    if (count[i] > 0) placer.take(static_cast<int>(i), held[i]);
  }
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return count[a] > count[b]; });
  const auto pass = [&](auto&& applies, auto&& place) {
    for (size_t i : order) {
      if (count[i] == 0 || !applies(i)) continue;
      plan.requests[i].devices = place(i);
      placer.take(static_cast<int>(i), plan.requests[i].devices);
    }
  };
  const auto size_of = [&](size_t i) { return static_cast<int>(held[i].size()); };
  pass([&](size_t i) { return size_of(i) == count[i]; }, [&](size_t i) { return held[i]; });
  pass([&](size_t i) { return size_of(i) > count[i]; },
       [&](size_t i) {
         placer.release(held[i]);
         return Placer::shrink(held[i], count[i], requests[i].home);
       });
  pass([&](size_t i) { return size_of(i) > 0 && size_of(i) < count[i]; },
       [&](size_t i) { return placer.grow(static_cast<int>(i), held[i], count[i]); });
  pass([&](size_t i) { return size_of(i) == 0; }, [&](size_t i) { return placer.fresh(count[i]); });

  for (size_t i = 0; i < n; ++i) {
    PlannedRequest& p = plan.requests[i];
    const PlannerRequest& r = requests[i];
    std::vector<int> placed = r.placement;
    std::sort(placed.begin(), placed.end());
    p.moved = !placed.empty() && p.devices != placed;
    if (mode[i] < 0) {
      p.finish_ms = r.steps_left == 0 ? r.ready_ms : kInfinity;
      continue;
    }
    const Mode& m = modes[i][static_cast<size_t>(mode[i])];
    p.degree = m.degree;
    p.split = m.split;
    const double s = m.step_ms;
    const double start = std::max(now_ms, r.ready_ms);
    const double end = now_ms + o.round_ms;
    p.finish_ms = start + double(r.steps_left) * s;
    p.steps =
        start < end ? std::min(r.steps_left, static_cast<int>(std::ceil((end - start) / s))) : 0;
  }
  return plan;
}

}  // namespace infill
