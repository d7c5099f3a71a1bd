#include "serving/step_scheduler.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace infill {
namespace {

enum class Kind { kUrgent, kSlack, kTight, kHopeless };

struct Item {
  const SchedCandidate* c;
  int64_t tokens;
  Kind kind;
  bool starving;
  int reduced_steps;  // > 0: advance with this many steps left to stay on time
  double allowance;   // per-step time that keeps it on time: (deadline - now) / steps left
};

bool by_deadline(const Item& a, const Item& b) {
  if (a.c->deadline_ms != b.c->deadline_ms) return a.c->deadline_ms < b.c->deadline_ms;
  return a.c->id < b.c->id;
}

bool urgent_order(const Item& a, const Item& b) {
  if (a.starving != b.starving) return a.starving;
  if (a.starving && a.c->waiting_ms != b.c->waiting_ms) return a.c->waiting_ms > b.c->waiting_ms;
  return by_deadline(a, b);
}

}  // namespace

SchedDecision schedule_step(const std::vector<SchedCandidate>& candidates, int64_t token_budget,
                            double now_ms,
                            const std::function<double(int64_t tokens, int batch)>& step_ms,
                            const SchedulerOptions& options) {
  SchedDecision decision;
  std::vector<Item> items;
  int64_t total_tokens = 0;
  for (const SchedCandidate& c : candidates) {
    if (c.steps_left <= 0) continue;
    const int64_t t = std::max<int64_t>(0, c.tokens);
    items.push_back({&c, t, Kind::kSlack, false, 0, 0.0});
    total_tokens += t;
  }
  if (items.empty()) return decision;
  const int64_t budget = std::max<int64_t>(0, token_budget);

  const double dt = std::max(
      0.0, step_ms(std::min(total_tokens, budget), static_cast<int>(items.size())));

  for (Item& it : items) {
    const SchedCandidate& c = *it.c;
    const bool on_time = now_ms + dt * c.steps_left <= c.deadline_ms;
    const bool late_if_skipped = now_ms + dt * (c.steps_left + 1) > c.deadline_ms;
    it.starving = c.waiting_ms > options.max_wait_ms;
    if (!on_time && options.allow_step_reduction && dt > 0) {
      // Largest step count that still finishes on time; never below the class bound.
      const double fit = std::floor((c.deadline_ms - now_ms) / dt);
      const int floor_steps = std::max(1, c.min_steps_left);
      if (fit >= floor_steps) {
        it.reduced_steps = static_cast<int>(std::min<double>(fit, c.steps_left - 1));
      }
    }
    const bool rescuable = it.reduced_steps > 0;
    it.allowance = (c.deadline_ms - now_ms) / c.steps_left;
    if (it.starving || (on_time && late_if_skipped) || rescuable) {
      it.kind = Kind::kUrgent;
    } else if (on_time) {
      it.kind = Kind::kSlack;
    } else if (it.allowance >= step_ms(it.tokens, 1)) {
      it.kind = Kind::kTight;
    } else {
      it.kind = Kind::kHopeless;
    }
  }

  std::vector<bool> taken(items.size(), false);
  int64_t remaining = budget;
  auto take = [&](size_t i) {
    taken[i] = true;
    remaining -= items[i].tokens;
    decision.advance.push_back(items[i].c->id);
    if (items[i].reduced_steps > 0) {
      decision.reduce_steps.emplace_back(items[i].c->id, items[i].reduced_steps);
    }
  };
  auto order_of = [&](Kind kind, auto less) {
    std::vector<size_t> idx;
    for (size_t i = 0; i < items.size(); ++i) {
      if (items[i].kind == kind) idx.push_back(i);
    }
    std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return less(items[a], items[b]); });
    return idx;
  };
  const std::vector<size_t> urgent = order_of(Kind::kUrgent, urgent_order);
  const std::vector<size_t> slack = order_of(Kind::kSlack, by_deadline);
  const std::vector<size_t> tight = order_of(Kind::kTight, [](const Item& a, const Item& b) {
    return a.allowance != b.allowance ? a.allowance < b.allowance : a.c->id < b.c->id;
  });
  const std::vector<size_t> hopeless = order_of(Kind::kHopeless, by_deadline);

  // Hopeless requests have lost their deadline whatever runs now. Where a step's latency grows
  // with its tokens (a CPU), every token of theirs delays the requests that can still be on
  // time, those queued now and those arriving next; so beside other requests they join only
  // while the step grows by at most hopeless_ride_fraction (nearly free, as on a GPU's flat
  // step cost), fewest tokens first, and within `limit`. Alone they fill the budget, earliest
  // deadline first, so the device never idles while they wait (max_wait_ms bounds the wait).
  // Takes from `group`, fewest tokens first, while each fits the budget and the predicted step
  // stays within `cap`. Step latency grows with tokens and with batch size, so the k smallest
  // are the cheapest k: this maximises the count exactly.
  auto take_smallest_within = [&](const std::vector<size_t>& group, double cap) {
    std::vector<size_t> by_size = group;
    std::stable_sort(by_size.begin(), by_size.end(),
                     [&](size_t a, size_t b) { return items[a].tokens < items[b].tokens; });
    for (size_t i : by_size) {
      const int batch = static_cast<int>(decision.advance.size());
      if (items[i].tokens > remaining || step_ms(budget - remaining + items[i].tokens, batch + 1) > cap) break;
      take(i);
    }
  };
  auto add_hopeless = [&](double limit) {
    if (decision.advance.empty()) {
      for (size_t i : hopeless) {
        if (items[i].tokens <= remaining) take(i);
      }
      return;
    }
    const double ride = step_ms(budget - remaining, static_cast<int>(decision.advance.size())) *
                        (1.0 + std::max(0.0, options.hopeless_ride_fraction));
    take_smallest_within(hopeless, std::min(limit, ride));
  };

  for (size_t i : urgent) {
    if (items[i].tokens <= remaining) take(i);
  }

  // Tight requests, smallest allowance first, each while the step stays within the allowance
  // of every tight request taken (urgent ones tolerate even a full batch). The smallest
  // allowance taken, `limit`, then paces the rest of the step.
  double limit = std::numeric_limits<double>::infinity();
  for (size_t i : tight) {
    const double l = std::min(limit, items[i].allowance);
    const int batch = static_cast<int>(decision.advance.size());
    if (items[i].tokens <= remaining && step_ms(budget - remaining + items[i].tokens, batch + 1) <= l) {
      take(i);
      limit = l;
    }
  }
  if (std::isfinite(limit)) {
    // A protected request sets the pace: as many slack requests as the step holds within
    // `limit`, then hopeless ones.
    take_smallest_within(slack, limit);
    add_hopeless(limit);
    return decision;
  }

  // 0/1 knapsack over the slack requests: value = (count, sum of deadline ranks), so among
  // equally large sets the one holding earlier deadlines wins.
  if (!slack.empty()) {
    const int buckets = std::max(1, options.max_buckets);
    const int64_t quantum = std::max<int64_t>(1, (remaining + buckets - 1) / buckets);
    const size_t cap = static_cast<size_t>(remaining / quantum);
    const size_t m = slack.size();
    struct Value {
      int count = 0;
      int64_t rank_sum = 0;
      bool operator<(const Value& o) const {
        return count != o.count ? count < o.count : rank_sum < o.rank_sum;
      }
    };
    std::vector<std::vector<Value>> dp(m + 1, std::vector<Value>(cap + 1));
    std::vector<int64_t> weight(m);
    for (size_t k = 0; k < m; ++k) {
      weight[k] = (items[slack[k]].tokens + quantum - 1) / quantum;
      const Value gain{1, static_cast<int64_t>(m - k)};
      for (size_t c = 0; c <= cap; ++c) {
        dp[k + 1][c] = dp[k][c];
        if (weight[k] <= static_cast<int64_t>(c)) {
          const Value& prev = dp[k][c - static_cast<size_t>(weight[k])];
          const Value with{prev.count + gain.count, prev.rank_sum + gain.rank_sum};
          if (dp[k + 1][c] < with) dp[k + 1][c] = with;
        }
      }
    }
    std::vector<size_t> chosen;
    size_t c = cap;
    for (size_t k = m; k > 0; --k) {
      if (dp[k][c].count != dp[k - 1][c].count || dp[k][c].rank_sum != dp[k - 1][c].rank_sum) {
        chosen.push_back(slack[k - 1]);
        c -= static_cast<size_t>(weight[k - 1]);
      }
    }
    // Earliest deadline first in the advance list.
    for (auto it = chosen.rbegin(); it != chosen.rend(); ++it) take(*it);
  }

  // Bucket rounding can leave room an exact count would use; then hopeless requests.
  for (size_t i : slack) {
    if (!taken[i] && items[i].tokens <= remaining) take(i);
  }
  add_hopeless(std::numeric_limits<double>::infinity());

  if (decision.advance.empty()) {
    // Everything exceeds the budget on its own: run the most pressing one alone.
    for (const std::vector<size_t>* group : {&urgent, &slack, &hopeless}) {
      if (!group->empty()) {
        take(group->front());
        break;
      }
    }
  }
  return decision;
}

}  // namespace infill
