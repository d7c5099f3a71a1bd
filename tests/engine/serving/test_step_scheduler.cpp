#include "support/catch.h"

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "serving/step_scheduler.h"

using namespace infill;

namespace {

// Integer-valued latency so deadline comparisons are exact in double: 2 ms + 1 ms per 20
// tokens + 1 ms per request.
double int_step_ms(int64_t tokens, int batch) { return 2.0 + double(tokens / 20) + batch; }

const auto kStepFn = std::function<double(int64_t, int)>(int_step_ms);

std::set<uint64_t> as_set(const std::vector<uint64_t>& v) { return {v.begin(), v.end()}; }

const SchedCandidate& by_id(const std::vector<SchedCandidate>& cs, uint64_t id) {
  for (const auto& c : cs) {
    if (c.id == id) return c;
  }
  FAIL("unknown id " << id);
  return cs.front();
}

// Independent restatement of the classification documented in step_scheduler.h.
struct RefClass {
  bool urgent = false, slack = false, starving = false;
  int rescue_steps = 0;
};

RefClass classify(const SchedCandidate& c, double now, double dt, const SchedulerOptions& o) {
  RefClass r;
  const bool on_time = now + dt * c.steps_left <= c.deadline_ms;
  const bool late_skip = now + dt * (c.steps_left + 1) > c.deadline_ms;
  r.starving = c.waiting_ms > o.max_wait_ms;
  if (!on_time && o.allow_step_reduction) {
    for (int s = c.steps_left - 1; s >= std::max(1, c.min_steps_left); --s) {
      if (now + dt * s <= c.deadline_ms) {
        r.rescue_steps = s;
        break;
      }
    }
  }
  r.urgent = r.starving || (on_time && late_skip) || r.rescue_steps > 0;
  r.slack = !r.urgent && on_time;
  return r;
}

std::vector<SchedCandidate> random_instance(std::mt19937& rng, int max_n, double now) {
  std::uniform_int_distribution<int> n_d(0, max_n), tok_d(0, 40), steps_d(1, 8), dl_d(0, 150),
      cls_d(1, 3), wait_d(0, 200);
  std::vector<SchedCandidate> cs;
  const int n = n_d(rng);
  for (int i = 0; i < n; ++i) {
    SchedCandidate c;
    c.id = 100 + uint64_t(i);
    c.tokens = tok_d(rng);
    c.steps_left = steps_d(rng);
    c.min_steps_left = std::uniform_int_distribution<int>(1, c.steps_left)(rng);
    c.deadline_ms = now + dl_d(rng);
    c.cls = static_cast<RequestClass>(cls_d(rng));
    c.waiting_ms = wait_d(rng);
    cs.push_back(c);
  }
  return cs;
}

}  // namespace

TEST_CASE("empty input and zero-step candidates advance nothing", "[serving][scheduler]") {
  SchedulerOptions opt;
  auto d = schedule_step({}, 1000, 0.0, kStepFn, opt);
  CHECK(d.advance.empty());
  CHECK(d.reduce_steps.empty());
  SchedCandidate done{1, 10, 0, 0, 100.0, RequestClass::kLive, 0.0};
  d = schedule_step({done}, 1000, 0.0, kStepFn, opt);
  CHECK(d.advance.empty());
}

TEST_CASE("knapsack DP matches exhaustive subset enumeration on small instances",
          "[serving][scheduler]") {
  std::mt19937 rng(12345);
  SchedulerOptions opt;
  opt.max_wait_ms = 100.0;
  const double now = 1000.0;
  int instances = 0, with_choice = 0, paced = 0;
  for (int iter = 0; iter < 400; ++iter) {
    opt.allow_step_reduction = iter % 2 == 0;
    const auto cs = random_instance(rng, 10, now);
    const int64_t budget = std::uniform_int_distribution<int64_t>(0, 150)(rng);  // < 256: exact
    const auto d = schedule_step(cs, budget, now, kStepFn, opt);
    ++instances;
    if (cs.empty()) {
      CHECK(d.advance.empty());
      continue;
    }
    int64_t total = 0;
    for (const auto& c : cs) total += c.tokens;
    const double dt = int_step_ms(std::min(total, budget), int(cs.size()));

    // Urgent pass: starving by longest wait, then earliest deadline, greedily while it fits.
    std::vector<size_t> urgent, slack;
    std::vector<RefClass> cls;
    for (size_t i = 0; i < cs.size(); ++i) {
      cls.push_back(classify(cs[i], now, dt, opt));
      if (cls[i].urgent) urgent.push_back(i);
      if (cls[i].slack) slack.push_back(i);
    }
    std::sort(urgent.begin(), urgent.end(), [&](size_t a, size_t b) {
      if (cls[a].starving != cls[b].starving) return cls[a].starving;
      if (cls[a].starving && cs[a].waiting_ms != cs[b].waiting_ms)
        return cs[a].waiting_ms > cs[b].waiting_ms;
      if (cs[a].deadline_ms != cs[b].deadline_ms) return cs[a].deadline_ms < cs[b].deadline_ms;
      return cs[a].id < cs[b].id;
    });
    int64_t remaining = budget;
    std::set<uint64_t> ref_urgent;
    for (size_t i : urgent) {
      if (cs[i].tokens <= remaining) {
        remaining -= cs[i].tokens;
        ref_urgent.insert(cs[i].id);
      }
    }
    std::sort(slack.begin(), slack.end(), [&](size_t a, size_t b) {
      if (cs[a].deadline_ms != cs[b].deadline_ms) return cs[a].deadline_ms < cs[b].deadline_ms;
      return cs[a].id < cs[b].id;
    });

    // Tight tier: late at dt but on time alone; smallest allowance first while the step stays
    // within every taken allowance. Once one is taken, it paces the rest of the step.
    auto allowance = [&](size_t i) { return (cs[i].deadline_ms - now) / cs[i].steps_left; };
    std::vector<size_t> tight, hopeless;
    for (size_t i = 0; i < cs.size(); ++i) {
      if (cls[i].urgent || cls[i].slack) continue;
      (allowance(i) >= int_step_ms(cs[i].tokens, 1) ? tight : hopeless).push_back(i);
    }
    std::sort(tight.begin(), tight.end(), [&](size_t a, size_t b) {
      return allowance(a) != allowance(b) ? allowance(a) < allowance(b) : cs[a].id < cs[b].id;
    });
    double limit = 1e300;
    int batch = int(ref_urgent.size());
    std::set<uint64_t> ref_tight;
    for (size_t i : tight) {
      const double l = std::min(limit, allowance(i));
      if (cs[i].tokens <= remaining && int_step_ms(budget - remaining + cs[i].tokens, batch + 1) <= l) {
        remaining -= cs[i].tokens;
        ref_tight.insert(cs[i].id);
        limit = l;
        ++batch;
      }
    }
    if (!ref_tight.empty()) {
      const auto adv = as_set(d.advance);
      for (uint64_t id : ref_urgent) CHECK(adv.count(id) == 1);
      for (uint64_t id : ref_tight) CHECK(adv.count(id) == 1);
      // Paced: the most slack requests whose step stays within the limit; then hopeless
      // ones while the step also grows by at most hopeless_ride_fraction.
      int64_t used = budget - remaining;
      for (std::vector<size_t>* group : {&slack, &hopeless}) {
        std::vector<int64_t> sizes;
        for (size_t i : *group) sizes.push_back(cs[i].tokens);
        std::sort(sizes.begin(), sizes.end());
        const double cap = group == &slack ? limit
                                           : std::min(limit, int_step_ms(used, batch) * (1 + opt.hopeless_ride_fraction));
        size_t fit = 0;
        while (fit < sizes.size() && used + sizes[fit] <= budget && int_step_ms(used + sizes[fit], batch + 1) <= cap) {
          used += sizes[fit++];
          ++batch;
        }
        size_t got = 0;
        for (size_t i : *group) got += adv.count(cs[i].id);
        CHECK(got == fit);
      }
      int64_t advanced = 0;
      for (const auto& c : cs) advanced += adv.count(c.id) ? c.tokens : 0;
      CHECK(advanced <= budget);
      CHECK(int_step_ms(advanced, int(adv.size())) <= limit);
      ++paced;
      continue;
    }

    // Exhaustive: the best (count, earliest-deadline rank sum) over subsets of slack requests.
    const size_t m = slack.size();
    int best_count = 0;
    int64_t best_rank = 0;
    for (uint32_t mask = 0; mask < (1u << m); ++mask) {
      int64_t tokens = 0, rank = 0;
      int count = 0;
      for (size_t k = 0; k < m; ++k) {
        if (mask & (1u << k)) {
          tokens += cs[slack[k]].tokens;
          rank += int64_t(m - k);
          ++count;
        }
      }
      if (tokens > remaining) continue;
      if (count > best_count || (count == best_count && rank > best_rank)) {
        best_count = count;
        best_rank = rank;
      }
    }

    const auto adv = as_set(d.advance);
    REQUIRE(adv.size() == d.advance.size());  // no duplicates
    int got_count = 0;
    int64_t got_rank = 0;
    for (size_t k = 0; k < m; ++k) {
      if (adv.count(cs[slack[k]].id)) {
        ++got_count;
        got_rank += int64_t(m - k);
      }
    }
    bool oversized_alone = false;
    if (budget >= 0) {
      bool any_fits = false;
      for (const auto& c : cs) any_fits = any_fits || c.tokens <= budget;
      oversized_alone = !any_fits;
    }
    if (oversized_alone) {
      CHECK(d.advance.size() == 1);
      continue;
    }
    INFO("iter " << iter << " budget " << budget << " n " << cs.size());
    CHECK(got_count == best_count);
    CHECK(got_rank == best_rank);
    for (uint64_t id : ref_urgent) CHECK(adv.count(id) == 1);
    for (size_t i : urgent) {
      if (!ref_urgent.count(cs[i].id)) CHECK(adv.count(cs[i].id) == 0);
    }
    // "Requests meeting their deadline" after the step, as the DP counts it.
    int meeting = 0, ref_meeting = 0;
    for (size_t i = 0; i < cs.size(); ++i) {
      const bool on_time_adv = now + dt * cs[i].steps_left <= cs[i].deadline_ms ||
                               cls[i].rescue_steps > 0;
      const bool on_time_skip = now + dt * (cs[i].steps_left + 1) <= cs[i].deadline_ms;
      meeting += adv.count(cs[i].id) ? on_time_adv : on_time_skip;
      ref_meeting += ref_urgent.count(cs[i].id) ? on_time_adv : on_time_skip;
    }
    CHECK(meeting >= ref_meeting);
    if (m > 1 && best_count < int(m)) ++with_choice;
  }
  CHECK(instances == 400);
  INFO("instances where the budget forced the DP to drop slack requests: " << with_choice);
  CHECK(with_choice > 50);
  INFO("instances paced by a tight request: " << paced);
  CHECK(paced > 20);
}

TEST_CASE("a request late in a full batch but on time in a small one paces the step",
          "[serving][scheduler]") {
  // 10 requests of 20 tokens: the full batch takes 2 + 200/20 + 10 = 22 ms per step. Request 1
  // has 12 ms for 2 steps (6 ms a step): late at 22 ms, on time alone (4 ms) or with one more
  // request (2 + 40/20 + 2 = 6 ms). The other nine have all the time in the world.
  SchedulerOptions opt;
  opt.allow_step_reduction = false;
  std::vector<SchedCandidate> cs = {{1, 20, 2, 2, 12.0, RequestClass::kLive, 0.0}};
  for (uint64_t id = 2; id <= 10; ++id) cs.push_back({id, 20, 2, 2, 1000.0, RequestClass::kInteractive, 0.0});
  const auto d = schedule_step(cs, 200, 0.0, kStepFn, opt);
  CHECK(as_set(d.advance) == std::set<uint64_t>{1, 2});
  CHECK(int_step_ms(40, 2) * 2 <= 12.0);
  // With a deadline even one step alone cannot meet, it is hopeless: the nine others run, and
  // it rides along only if that lengthens their step (20 -> 22 ms) by no more than allowed.
  cs[0].deadline_ms = 7.0;
  opt.hopeless_ride_fraction = 0.05;
  CHECK(as_set(schedule_step(cs, 200, 0.0, kStepFn, opt).advance) == std::set<uint64_t>{2, 3, 4, 5, 6, 7, 8, 9, 10});
  opt.hopeless_ride_fraction = 0.2;
  CHECK(schedule_step(cs, 200, 0.0, kStepFn, opt).advance.size() == 10);
  // Alone, it runs: the device does not idle while late work waits.
  CHECK(schedule_step({cs[0]}, 200, 0.0, kStepFn, opt).advance == std::vector<uint64_t>{1});
}

TEST_CASE("token budget is never exceeded except by a single oversized request",
          "[serving][scheduler]") {
  std::mt19937 rng(777);
  SchedulerOptions opt;
  for (int iter = 0; iter < 300; ++iter) {
    auto cs = random_instance(rng, 40, 0.0);
    for (auto& c : cs) c.tokens *= 100;  // large budgets exercise the bucketed DP
    const int64_t budget = std::uniform_int_distribution<int64_t>(0, 60000)(rng);
    const auto d = schedule_step(cs, budget, 0.0, kStepFn, opt);
    int64_t used = 0;
    for (uint64_t id : d.advance) used += by_id(cs, id).tokens;
    if (used > budget) {
      REQUIRE(d.advance.size() == 1);
      for (const auto& c : cs) CHECK(c.tokens > budget);
    }
    if (!cs.empty()) CHECK_FALSE(d.advance.empty());
  }
}

TEST_CASE("an oversized request runs alone only when nothing else fits", "[serving][scheduler]") {
  SchedulerOptions opt;
  SchedCandidate big{1, 5000, 4, 4, 1e6, RequestClass::kBatch, 0.0};
  SchedCandidate small{2, 100, 4, 4, 1e6, RequestClass::kBatch, 0.0};
  auto d = schedule_step({big}, 1000, 0.0, kStepFn, opt);
  CHECK(d.advance == std::vector<uint64_t>{1});
  d = schedule_step({big, small}, 1000, 0.0, kStepFn, opt);
  CHECK(d.advance == std::vector<uint64_t>{2});
}

TEST_CASE("urgent requests come before a larger number of slack ones", "[serving][scheduler]") {
  SchedulerOptions opt;
  // dt with 4 candidates, 100 tokens budget: 2 + 100/20 + 4 = 11 ms.
  // Request 1 (80 tokens) has 3 steps and deadline 33: skipping makes it late -> urgent.
  std::vector<SchedCandidate> cs = {
      {1, 80, 3, 3, 33.0, RequestClass::kLive, 0.0},
      {2, 30, 1, 1, 1000.0, RequestClass::kInteractive, 0.0},
      {3, 30, 1, 1, 1000.0, RequestClass::kInteractive, 0.0},
      {4, 30, 1, 1, 1000.0, RequestClass::kInteractive, 0.0},
  };
  auto d = schedule_step(cs, 100, 0.0, kStepFn, opt);
  CHECK(as_set(d.advance) == std::set<uint64_t>{1});
  // Without urgency (deadline far away) the DP prefers three small requests.
  cs[0].deadline_ms = 1000.0;
  d = schedule_step(cs, 100, 0.0, kStepFn, opt);
  CHECK(as_set(d.advance) == std::set<uint64_t>{2, 3, 4});
}

TEST_CASE("equal-size slack requests tie-break to the earliest deadline", "[serving][scheduler]") {
  SchedulerOptions opt;
  std::vector<SchedCandidate> cs = {
      {1, 50, 2, 2, 900.0, RequestClass::kBatch, 0.0},
      {2, 50, 2, 2, 500.0, RequestClass::kBatch, 0.0},
      {3, 50, 2, 2, 700.0, RequestClass::kBatch, 0.0},
  };
  auto d = schedule_step(cs, 100, 0.0, kStepFn, opt);
  CHECK(d.advance == std::vector<uint64_t>{2, 3});
}

TEST_CASE("a batch request among a stream of live ones advances within max_wait",
          "[serving][scheduler]") {
  SchedulerOptions opt;
  opt.max_wait_ms = 100.0;
  const int64_t budget = 100;
  double now = 0.0, batch_wait = 0.0;
  bool advanced = false;
  uint64_t next_id = 10;
  for (int step = 0; step < 50 && !advanced; ++step) {
    // Two fresh live requests each step, each filling most of the budget and due exactly
    // when advanced every step from now: always urgent, only one fits.
    std::vector<SchedCandidate> cs;
    const double dt = int_step_ms(budget, 3);
    for (int k = 0; k < 2; ++k) {
      cs.push_back({next_id++, 60, 4, 2, now + 4 * dt, RequestClass::kLive, 0.0});
    }
    cs.push_back({1, 50, 20, 20, now + 600000.0, RequestClass::kBatch, batch_wait});
    const auto d = schedule_step(cs, budget, now, kStepFn, opt);
    int64_t used = 0;
    for (uint64_t id : d.advance) used += by_id(cs, id).tokens;
    CHECK(used <= budget);
    advanced = as_set(d.advance).count(1) == 1;
    if (!advanced) {
      CHECK(batch_wait <= opt.max_wait_ms);  // live requests win only until the limit
      now += dt;
      batch_wait += dt;
    }
  }
  CHECK(advanced);
  CHECK(batch_wait > opt.max_wait_ms);
  CHECK(batch_wait <= opt.max_wait_ms + int_step_ms(budget, 3));
}

TEST_CASE("step reduction saves a deadline within class bounds and only when needed",
          "[serving][scheduler]") {
  SchedulerOptions opt;
  // One candidate with 100 tokens, budget 100: dt = 2 + 5 + 1 = 8 ms.
  SchedCandidate live{7, 100, 10, 5, 60.0, RequestClass::kLive, 0.0};
  auto d = schedule_step({live}, 100, 0.0, kStepFn, opt);
  CHECK(d.advance == std::vector<uint64_t>{7});
  // floor(60 / 8) = 7 steps still fit the deadline.
  CHECK(d.reduce_steps == std::vector<std::pair<uint64_t, int>>{{7, 7}});

  live.deadline_ms = 80.0;  // 10 * 8 = 80: on time, no cut
  d = schedule_step({live}, 100, 0.0, kStepFn, opt);
  CHECK(d.reduce_steps.empty());

  live.deadline_ms = 30.0;  // would need 3 steps, class floor is 5: hopeless, no cut
  d = schedule_step({live}, 100, 0.0, kStepFn, opt);
  CHECK(d.advance == std::vector<uint64_t>{7});
  CHECK(d.reduce_steps.empty());

  live.deadline_ms = 60.0;
  opt.allow_step_reduction = false;
  d = schedule_step({live}, 100, 0.0, kStepFn, opt);
  CHECK(d.reduce_steps.empty());
}

TEST_CASE("random reductions respect bounds and are only proposed for late advanced requests",
          "[serving][scheduler]") {
  std::mt19937 rng(4242);
  SchedulerOptions opt;
  const double now = 1000.0;
  int reductions = 0;
  for (int iter = 0; iter < 300; ++iter) {
    const auto cs = random_instance(rng, 10, now);
    const int64_t budget = std::uniform_int_distribution<int64_t>(0, 150)(rng);
    const auto d = schedule_step(cs, budget, now, kStepFn, opt);
    int64_t total = 0;
    for (const auto& c : cs) total += c.tokens;
    const double dt = cs.empty() ? 0.0 : int_step_ms(std::min(total, budget), int(cs.size()));
    const auto adv = as_set(d.advance);
    for (const auto& [id, steps] : d.reduce_steps) {
      ++reductions;
      const auto& c = by_id(cs, id);
      CHECK(adv.count(id) == 1);
      CHECK(steps >= c.min_steps_left);
      CHECK(steps < c.steps_left);
      CHECK(now + dt * c.steps_left > c.deadline_ms);  // needed
      CHECK(now + dt * steps <= c.deadline_ms);        // sufficient
      CHECK(now + dt * (steps + 1) > c.deadline_ms);   // minimal cut
    }
  }
  CHECK(reductions > 20);
}
