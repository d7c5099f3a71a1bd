#include "support/catch.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <set>

#include "serving/round_planner.h"

using namespace infill;

namespace {

// A step function whose degree scaling varies per case: a fixed part, a part that divides by
// the degree and a communication part that grows with it (so that a higher degree may be
// slower, as for small images).
struct SyntheticCost {
  double fixed_ms, per_token_ms, comm_ms;
  double operator()(int64_t tokens, int degree) const {
    return fixed_ms + per_token_ms * double(tokens) / double(degree) + comm_ms * double(degree - 1);
  }
};

struct Objective {
  int value = 0;
  double gpu_ms = 0;
};

// Busy on its devices through the round: it keeps them and its degree.
bool pinned(const PlannerRequest& r, double now, double round_ms) {
  return r.steps_left > 0 && !r.placement.empty() && r.ready_ms >= now + round_ms;
}

// The header's value function, written out again: what the planner must maximise.
Objective evaluate(const std::vector<PlannerRequest>& rs, const std::vector<int>& degree,
                   double now, double round_ms, const std::vector<int>& allowed,
                   const StepMsFunction& step) {
  Objective obj;
  for (size_t i = 0; i < rs.size(); ++i) {
    const PlannerRequest& r = rs[i];
    const double steps = double(r.steps_left);
    if (degree[i] > 0) {
      // A pinned request's step in flight ends after now (ready_ms): max() covers it.
      const double s = step(r.tokens, degree[i]);
      obj.value += std::max(now, r.ready_ms) + steps * s <= r.deadline_ms ? 1 : 0;
      obj.gpu_ms += double(degree[i]) * steps * s;
      continue;
    }
    if (r.steps_left == 0) {
      obj.value += r.ready_ms <= r.deadline_ms ? 1 : 0;
      continue;
    }
    double cheapest = std::numeric_limits<double>::infinity();
    double cheapest_on_time = cheapest;
    int d_star = 0;
    for (int d : allowed) {
      const double s = step(r.tokens, d);
      cheapest = std::min(cheapest, double(d) * steps * s);
      if (std::max(now, r.ready_ms) + steps * s <= r.deadline_ms &&
          double(d) * steps * s < cheapest_on_time) {
        cheapest_on_time = double(d) * steps * s;
        d_star = d;
      }
    }
    // A request with a home (waiting only under homes_may_wait) counts on its home alone.
    const int resume = r.home >= 0 ? 1 : d_star;
    const bool on_time =
        d_star > 0 &&
        std::max(now + round_ms, r.ready_ms) + steps * step(r.tokens, resume) <= r.deadline_ms;
    obj.value += on_time ? 1 : 0;
    obj.gpu_ms += on_time ? cheapest_on_time : cheapest;
  }
  return obj;
}

// Every assignment of {0} + allowed degrees with at most `devices` in all: the best value,
// and the least GPU time among the assignments of that value.
// A request with a home never waits while it has steps left unless `homes_may_wait`;
// `devices` is the capacity (the devices less the unavailable ones).
Objective brute_force(const std::vector<PlannerRequest>& rs, int devices, double now,
                      double round_ms, const std::vector<int>& allowed,
                      const StepMsFunction& step, bool homes_may_wait = false) {
  std::vector<int> choices{0};
  choices.insert(choices.end(), allowed.begin(), allowed.end());
  std::vector<int> degree(rs.size(), 0);
  Objective best{-1, 0};
  std::function<void(size_t, int)> walk = [&](size_t i, int used) {
    if (i == rs.size()) {
      const Objective o = evaluate(rs, degree, now, round_ms, allowed, step);
      if (o.value > best.value || (o.value == best.value && o.gpu_ms < best.gpu_ms)) best = o;
      return;
    }
    for (int d : choices) {
      if (used + d > devices || (d > 0 && rs[i].steps_left == 0)) continue;
      if (d == 0 && rs[i].home >= 0 && rs[i].steps_left > 0 && !homes_may_wait) continue;
      if (pinned(rs[i], now, round_ms) && d != static_cast<int>(rs[i].placement.size())) continue;
      degree[i] = d;
      walk(i + 1, used + d);
    }
    degree[i] = 0;
  };
  walk(0, 0);
  return best;
}

// Random requests: deadlines from hopeless to slack, some with a step in flight (some of
// those past the round's end), disjoint random placements of allowed sizes.
std::vector<PlannerRequest> random_requests(std::mt19937_64& rng, int count, int devices,
                                            double now, const StepMsFunction& step,
                                            const std::vector<int>& allowed) {
  std::uniform_int_distribution<int64_t> tokens(64, 20000);
  std::uniform_int_distribution<int> steps(0, 30);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<int> free(static_cast<size_t>(devices));
  for (int d = 0; d < devices; ++d) free[static_cast<size_t>(d)] = d;
  std::shuffle(free.begin(), free.end(), rng);
  std::vector<PlannerRequest> rs;
  for (int i = 0; i < count; ++i) {
    PlannerRequest r;
    r.id = static_cast<uint64_t>(100 + i);
    r.tokens = tokens(rng);
    r.steps_left = steps(rng);
    r.ready_ms = u(rng) < 0.4 ? now + 2 * u(rng) * step(r.tokens, 1) : now - 1.0;
    r.deadline_ms =
        now + (0.1 + 1.6 * u(rng)) * double(std::max(1, r.steps_left)) * step(r.tokens, 1);
    std::vector<int> sizes{0};
    for (int d : allowed) {
      if (d <= static_cast<int>(free.size())) sizes.push_back(d);
    }
    const int held = sizes[std::uniform_int_distribution<size_t>(0, sizes.size() - 1)(rng)];
    for (int h = 0; h < held; ++h) {
      r.placement.push_back(free.back());
      free.pop_back();
    }
    rs.push_back(r);
  }
  return rs;
}

// What every plan must satisfy: allowed degrees only, disjoint devices as many as the degree,
// no more devices than there are.
void require_valid(const RoundPlan& plan, const std::vector<PlannerRequest>& rs, int devices,
                   const std::vector<int>& allowed) {
  REQUIRE(plan.requests.size() == rs.size());
  std::set<int> taken;
  int used = 0;
  for (size_t i = 0; i < rs.size(); ++i) {
    const PlannedRequest& p = plan.requests[i];
    CHECK(p.id == rs[i].id);
    if (p.degree != 0) CHECK(std::find(allowed.begin(), allowed.end(), p.degree) != allowed.end());
    CHECK(static_cast<int>(p.devices.size()) == p.degree);
    CHECK(std::is_sorted(p.devices.begin(), p.devices.end()));
    for (int d : p.devices) {
      CHECK(d >= 0);
      CHECK(d < devices);
      CHECK(taken.insert(d).second);
    }
    used += p.degree;
  }
  CHECK(used <= devices);
  CHECK(used == plan.devices_used);
}

}  // namespace

TEST_CASE("allowed degrees are the divisors of the heads up to the devices",
          "[serving][round_planner]") {
  CHECK(allowed_degrees(24, 8) == std::vector<int>{1, 2, 3, 4, 6, 8});
  CHECK(allowed_degrees(24, 512) == std::vector<int>{1, 2, 3, 4, 6, 8, 12, 24});
  CHECK(allowed_degrees(6, 8) == std::vector<int>{1, 2, 3, 6});
  CHECK(allowed_degrees(24, 8, 4) == std::vector<int>{1, 2, 3, 4});
  CHECK(allowed_degrees(7, 8) == std::vector<int>{1, 7});
  CHECK(allowed_degrees(24, 1) == std::vector<int>{1});
  CHECK(allowed_degrees(0, 8).empty());
}

TEST_CASE("the packing equals a brute-force search over every (request, degree) assignment",
          "[serving][round_planner]") {
  std::mt19937_64 rng(41);
  std::uniform_real_distribution<double> u(0, 1);
  const int heads_choices[] = {24, 6, 12, 8, 7};
  int cases_with_waiting = 0, cases_with_late = 0, pinned_requests = 0;
  for (int c = 0; c < 200; ++c) {
    const int devices = std::uniform_int_distribution<int>(2, 8)(rng);
    const int count = std::uniform_int_distribution<int>(1, 5)(rng);
    const int heads = heads_choices[c % 5];
    const SyntheticCost cost{0.5 + 5 * u(rng), 0.001 + 0.01 * u(rng),
                             u(rng) < 0.5 ? 0.0 : 20 * u(rng)};
    const StepMsFunction step = cost;
    const double now = 1000.0 * u(rng);
    const std::vector<int> allowed = allowed_degrees(heads, devices);
    const std::vector<PlannerRequest> rs = random_requests(rng, count, devices, now, step, allowed);
    RoundPlannerOptions o;
    o.devices = devices;
    o.heads = heads;
    o.round_ms = 5 + 200 * u(rng);
    o.grant_idle_devices = false;
    INFO("case " << c << ": " << count << " requests, " << devices << " devices, heads " << heads);
    const Result<RoundPlan> plan = plan_round(rs, now, step, o);
    REQUIRE(plan.ok());
    require_valid(*plan, rs, devices, allowed);
    const Objective best = brute_force(rs, devices, now, o.round_ms, allowed, step);
    CHECK(plan->predicted_on_time == best.value);
    CHECK(plan->packing_gpu_ms == Approx(best.gpu_ms).epsilon(1e-7));
    // The plan's own degrees score what it reports, request by request.
    std::vector<int> degree;
    for (const PlannedRequest& p : plan->requests) degree.push_back(p.degree);
    const Objective own = evaluate(rs, degree, now, o.round_ms, allowed, step);
    CHECK(own.value == plan->predicted_on_time);
    CHECK(own.gpu_ms == Approx(plan->packing_gpu_ms).epsilon(1e-7));
    for (size_t i = 0; i < rs.size(); ++i) {
      std::vector<PlannerRequest> one{rs[i]};
      CHECK(evaluate(one, {degree[i]}, now, o.round_ms, allowed, step).value ==
            (plan->requests[i].on_time ? 1 : 0));
    }
    if (std::count(degree.begin(), degree.end(), 0) > 0) ++cases_with_waiting;
    if (best.value < count) ++cases_with_late;
    for (size_t i = 0; i < rs.size(); ++i) {
      if (!pinned(rs[i], now, o.round_ms)) continue;
      ++pinned_requests;
      std::vector<int> held = rs[i].placement;
      std::sort(held.begin(), held.end());
      CHECK(plan->requests[i].devices == held);
    }
  }
  // The cases reach every side of the decisions (some wait, some are late, some pinned).
  CHECK(cases_with_waiting > 20);
  CHECK(cases_with_late > 20);
  CHECK(pinned_requests > 20);
}

TEST_CASE("grants keep the packing's on-time count and use only allowed degrees",
          "[serving][round_planner]") {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(0, 1);
  for (int heads : {24, 6}) {
    const int devices = 8;
    const std::vector<int> allowed = allowed_degrees(heads, devices);
    std::set<int> seen;
    for (int c = 0; c < 150; ++c) {
      const SyntheticCost cost{1 + 3 * u(rng), 0.002 + 0.01 * u(rng),
                               u(rng) < 0.7 ? 0.0 : 5 * u(rng)};
      const StepMsFunction step = cost;
      const int count = std::uniform_int_distribution<int>(1, 6)(rng);
      const std::vector<PlannerRequest> rs =
          random_requests(rng, count, devices, 0.0, step, allowed);
      RoundPlannerOptions o;
      o.devices = devices;
      o.heads = heads;
      o.round_ms = 50;
      const Result<RoundPlan> with = plan_round(rs, 0.0, step, o);
      o.grant_idle_devices = false;
      const Result<RoundPlan> without = plan_round(rs, 0.0, step, o);
      REQUIRE(with.ok());
      REQUIRE(without.ok());
      require_valid(*with, rs, devices, allowed);
      CHECK(with->predicted_on_time == without->predicted_on_time);
      CHECK(with->devices_used == without->devices_used + with->devices_granted);
      for (size_t i = 0; i < rs.size(); ++i) {
        const int d = with->requests[i].degree;
        seen.insert(d);
        CHECK(heads % std::max(d, 1) == 0);
        CHECK(d >= without->requests[i].degree);
      }
    }
    INFO("heads " << heads);
    CHECK_FALSE(seen.count(5));
    CHECK_FALSE(seen.count(7));
    if (heads == 6) {
      CHECK_FALSE(seen.count(4));
      CHECK_FALSE(seen.count(8));
      CHECK(seen.count(6));
    } else {
      CHECK(seen.count(8));
    }
  }
}

TEST_CASE("a request whose degree is unchanged keeps its devices", "[serving][round_planner]") {
  const StepMsFunction step = SequenceParallelCostModel::flux1_dev_h100().function();
  RoundPlannerOptions o;
  o.devices = 8;
  o.round_ms = 100;
  o.grant_idle_devices = false;

  SECTION("a new request does not move a running one to find a contiguous block") {
    // A 2048^2 request at degree 2 on {5, 6} leaves {0..4} and {7} free. A second one needs
    // 4: it takes {0..3}, and the first stays on {5, 6}.
    PlannerRequest a{1, 16384, 10, 0, {5, 6}, 0};
    a.deadline_ms = 10 * step(16384, 2) + 1;
    PlannerRequest b{2, 16384, 10, 0, {}, 0};
    b.deadline_ms = 10 * step(16384, 4) + 1;
    const std::vector<PlannerRequest> rs{a, b};
    const Result<RoundPlan> plan = plan_round(rs, 0.0, step, o);
    REQUIRE(plan.ok());
    CHECK(plan->requests[0].degree == 2);
    CHECK(plan->requests[0].devices == std::vector<int>{5, 6});
    CHECK_FALSE(plan->requests[0].moved);
    CHECK(plan->requests[1].degree == 4);
    CHECK(plan->requests[1].devices == std::vector<int>{0, 1, 2, 3});
  }

  SECTION("round after round, a request keeps its devices while its degree stays") {
    std::mt19937_64 rng(3);
    std::uniform_real_distribution<double> u(0, 1);
    o.grant_idle_devices = true;
    int kept = 0, changed = 0;
    for (int c = 0; c < 100; ++c) {
      std::vector<PlannerRequest> rs =
          random_requests(rng, 5, 8, 0.0, step, allowed_degrees(24, 8));
      for (auto& r : rs) r.placement.clear();
      double now = 0;
      for (int round = 0; round < 6; ++round) {
        const Result<RoundPlan> plan = plan_round(rs, now, step, o);
        REQUIRE(plan.ok());
        for (size_t i = 0; i < rs.size(); ++i) {
          const PlannedRequest& p = plan->requests[i];
          if (!rs[i].placement.empty() && p.degree == static_cast<int>(rs[i].placement.size())) {
            CHECK(p.devices == rs[i].placement);
            CHECK_FALSE(p.moved);
            ++kept;
          } else if (!rs[i].placement.empty()) {
            ++changed;
          }
          rs[i].placement = p.devices;
          rs[i].steps_left = std::max(0, rs[i].steps_left - p.steps);
        }
        now += o.round_ms;
      }
    }
    CHECK(kept > 100);
    CHECK(changed > 10);
  }
}

TEST_CASE("idle devices are granted to running requests", "[serving][round_planner]") {
  const StepMsFunction step = SequenceParallelCostModel::flux1_dev_h100().function();
  RoundPlannerOptions o;
  o.devices = 8;
  o.round_ms = 100;
  // A 2048^2 request with a loose deadline: degree 1 is on time and cheapest.
  PlannerRequest r{1, 16384, 28, 0, {}, 0};
  r.deadline_ms = 2 * 28 * step(16384, 1);
  const std::vector<PlannerRequest> rs{r};

  o.grant_idle_devices = false;
  const Result<RoundPlan> packed = plan_round(rs, 0.0, step, o);
  REQUIRE(packed.ok());
  CHECK(packed->requests[0].degree == 1);
  CHECK(packed->devices_granted == 0);

  o.grant_idle_devices = true;
  const Result<RoundPlan> granted = plan_round(rs, 0.0, step, o);
  REQUIRE(granted.ok());
  CHECK(granted->requests[0].degree == 8);
  CHECK(granted->requests[0].devices == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7});
  CHECK(granted->devices_granted == 7);
  CHECK(granted->predicted_on_time == 1);
  CHECK(granted->requests[0].finish_ms == Approx(28 * step(16384, 8)));

  SECTION("not where a higher degree is slower") {
    const StepMsFunction slower = [](int64_t, int degree) { return 10.0 + 3.0 * degree; };
    const Result<RoundPlan> p = plan_round(rs, 0.0, slower, o);
    REQUIRE(p.ok());
    CHECK(p->requests[0].degree == 1);
    CHECK(p->devices_granted == 0);
  }

  SECTION("earliest deadline first, one allowed degree at a time") {
    // Two requests at degree 1 each (on time and cheapest), 6 devices left: the earlier
    // deadline is raised first, so with 24 heads it reaches 6 (1-2-3-4-6) and the other 2.
    PlannerRequest a{1, 16384, 28, 0, {}, 0}, b{2, 16384, 28, 0, {}, 0};
    a.deadline_ms = 3 * 28 * step(16384, 1);
    b.deadline_ms = 4 * 28 * step(16384, 1);
    const std::vector<PlannerRequest> two{b, a};
    const Result<RoundPlan> p = plan_round(two, 0.0, step, o);
    REQUIRE(p.ok());
    CHECK(p->requests[1].degree == 6);
    CHECK(p->requests[0].degree == 2);
    CHECK(p->devices_used == 8);
  }
}

TEST_CASE("an empty round, one device, and more requests than devices",
          "[serving][round_planner]") {
  const StepMsFunction step = SequenceParallelCostModel::flux1_dev_h100().function();
  RoundPlannerOptions o;
  o.round_ms = 200;

  SECTION("an empty round") {
    o.devices = 8;
    const Result<RoundPlan> p = plan_round({}, 0.0, step, o);
    REQUIRE(p.ok());
    CHECK(p->requests.empty());
    CHECK(p->devices_used == 0);
    CHECK(p->predicted_on_time == 0);
  }

  SECTION("one device: the request that cannot wait runs, the one that can waits") {
    o.devices = 1;
    const double s = step(4096, 1);
    PlannerRequest urgent{1, 4096, 10, 0, {}, 0}, slack{2, 4096, 10, 0, {}, 0};
    urgent.deadline_ms = 10 * s + 1;
    slack.deadline_ms = 25 * s;  // on time if it starts after urgent finishes (10 steps)
    const std::vector<PlannerRequest> rs{slack, urgent};
    const Result<RoundPlan> p = plan_round(rs, 0.0, step, o);
    REQUIRE(p.ok());
    CHECK(p->requests[1].degree == 1);
    CHECK(p->requests[1].devices == std::vector<int>{0});
    CHECK(p->requests[0].degree == 0);
    CHECK(p->requests[0].devices.empty());
    CHECK(p->predicted_on_time == 2);
    CHECK(p->requests[1].steps == static_cast<int>(std::ceil(200.0 / s)));
  }

  SECTION("more requests than devices") {
    o.devices = 4;
    std::mt19937_64 rng(11);
    for (int c = 0; c < 20; ++c) {
      const std::vector<PlannerRequest> rs =
          random_requests(rng, 8, 4, 0.0, step, allowed_degrees(24, 4));
      const Result<RoundPlan> p = plan_round(rs, 0.0, step, o);
      REQUIRE(p.ok());
      require_valid(*p, rs, 4, allowed_degrees(24, 4));
      RoundPlannerOptions packed = o;
      packed.grant_idle_devices = false;
      const Result<RoundPlan> q = plan_round(rs, 0.0, step, packed);
      REQUIRE(q.ok());
      CHECK(q->predicted_on_time ==
            brute_force(rs, 4, 0.0, o.round_ms, allowed_degrees(24, 4), step).value);
    }
  }
}

TEST_CASE("the steps a request starts in the round", "[serving][round_planner]") {
  const StepMsFunction step = [](int64_t, int degree) { return 30.0 / degree; };
  RoundPlannerOptions o;
  o.devices = 1;
  o.round_ms = 100;
  PlannerRequest r{1, 100, 50, 1e9, {}, 0};
  // Steps start at 0, 30, 60 and 90: four start before the round ends.
  CHECK(plan_round(std::vector<PlannerRequest>{r}, 0.0, step, o)->requests[0].steps == 4);
  // Its step in flight ends at 50: steps start at 50 and 80.
  r.ready_ms = 50;
  CHECK(plan_round(std::vector<PlannerRequest>{r}, 0.0, step, o)->requests[0].steps == 2);
  r.ready_ms = 0;
  r.steps_left = 3;
  CHECK(plan_round(std::vector<PlannerRequest>{r}, 0.0, step, o)->requests[0].steps == 3);
}

TEST_CASE("the round planner refuses inconsistent input, naming it", "[serving][round_planner]") {
  const StepMsFunction step = SequenceParallelCostModel::flux1_dev_h100().function();
  RoundPlannerOptions o;
  o.devices = 4;
  o.round_ms = 100;
  const auto message = [&](std::vector<PlannerRequest> rs, const RoundPlannerOptions& opt,
                           const StepMsFunction& f) {
    const Result<RoundPlan> p = plan_round(rs, 0.0, f, opt);
    REQUIRE_FALSE(p.ok());
    return p.status().message();
  };
  const PlannerRequest a{1, 1024, 10, 1000, {0, 1}, 0};
  PlannerRequest b{2, 1024, 10, 1000, {1}, 0};
  CHECK_THAT(message({a, b}, o, step), Catch::Contains("request 2") &&
                                           Catch::Contains("device 1") &&
                                           Catch::Contains("request 1 also holds"));
  b.placement = {4};
  CHECK_THAT(message({a, b}, o, step), Catch::Contains("device 4, expected 0..3"));
  b.placement = {2, 2};
  CHECK_THAT(message({a, b}, o, step), Catch::Contains("device 2 twice"));
  b = a;
  b.placement = {};
  CHECK_THAT(message({a, b}, o, step), Catch::Contains("request 1 appears twice"));
  b.id = 2;
  b.tokens = 0;
  CHECK_THAT(message({a, b}, o, step), Catch::Contains("request 2 has 0 tokens"));
  RoundPlannerOptions bad = o;
  bad.devices = 0;
  CHECK_THAT(message({}, bad, step), Catch::Contains("devices is 0"));
  bad = o;
  bad.round_ms = 0;
  CHECK_THAT(message({}, bad, step), Catch::Contains("round_ms"));
  const StepMsFunction broken = [](int64_t, int degree) { return degree == 2 ? 0.0 : 1.0; };
  CHECK_THAT(message({a}, o, broken), Catch::Contains("request 1 (1024 tokens) at degree 2 is 0"));
}

namespace {

// A guided step function of the same family: packed, two sequences in one forward (twice the
// per-token work, one fixed part, communication growing with the degree and the rows); split,
// each half at `degree` on its own devices plus an exchange.
struct SyntheticGuidedCost {
  SyntheticCost one;
  double exchange_ms;
  double operator()(int64_t tokens, int degree, bool split) const {
    if (split) return one(tokens, degree) + exchange_ms;
    return one.fixed_ms + 2 * one.per_token_ms * double(tokens) / double(degree) +
           1.5 * one.comm_ms * double(degree - 1);
  }
};

// One way to run: devices 0 waits; else degree per forward and split (guided only).
struct Choice {
  int degree = 0;
  bool split = false;
  int devices() const { return split ? 2 * degree : degree; }
};

double step_of(const PlannerRequest& r, const Choice& c, const StepMsFunction& step,
               const GuidedStepMsFunction& guided) {
  return r.guided ? guided(r.tokens, c.degree, c.split) : step(r.tokens, c.degree);
}

// The modes a request may take: every allowed degree packed, and split where guided, allowed
// and 2 d fits.
std::vector<Choice> modes_of(const PlannerRequest& r, int devices, const std::vector<int>& allowed,
                             bool split_guidance) {
  std::vector<Choice> out;
  for (int d : allowed) out.push_back({d, false});
  if (r.guided && split_guidance) {
    for (int d : allowed) {
      if (2 * d <= devices) out.push_back({d, true});
    }
  }
  return out;
}

// The header's value function with guidance placement, written out again.
Objective evaluate_guided(const std::vector<PlannerRequest>& rs, const std::vector<Choice>& choice,
                          double now, double round_ms, int devices, const std::vector<int>& allowed,
                          bool split_guidance, const StepMsFunction& step,
                          const GuidedStepMsFunction& guided) {
  Objective obj;
  for (size_t i = 0; i < rs.size(); ++i) {
    const PlannerRequest& r = rs[i];
    const double steps = double(r.steps_left);
    if (choice[i].degree > 0) {
      const double s = step_of(r, choice[i], step, guided);
      obj.value += std::max(now, r.ready_ms) + steps * s <= r.deadline_ms ? 1 : 0;
      obj.gpu_ms += double(choice[i].devices()) * steps * s;
      continue;
    }
    if (r.steps_left == 0) {
      obj.value += r.ready_ms <= r.deadline_ms ? 1 : 0;
      continue;
    }
    double cheapest = std::numeric_limits<double>::infinity();
    double cheapest_on_time = cheapest, s_star = 0;
    for (const Choice& c : modes_of(r, devices, allowed, split_guidance)) {
      const double s = step_of(r, c, step, guided);
      const double gpu = double(c.devices()) * steps * s;
      cheapest = std::min(cheapest, gpu);
      if (std::max(now, r.ready_ms) + steps * s <= r.deadline_ms && gpu < cheapest_on_time) {
        cheapest_on_time = gpu;
        s_star = s;
      }
    }
    const bool on_time =
        s_star > 0 && std::max(now + round_ms, r.ready_ms) + steps * s_star <= r.deadline_ms;
    obj.value += on_time ? 1 : 0;
    obj.gpu_ms += on_time ? cheapest_on_time : cheapest;
  }
  return obj;
}

// Every assignment of a mode or waiting to each request within the devices: the best value,
// and the least GPU time among the assignments of that value.
Objective brute_force_guided(const std::vector<PlannerRequest>& rs, int devices, double now,
                             double round_ms, const std::vector<int>& allowed, bool split_guidance,
                             const StepMsFunction& step, const GuidedStepMsFunction& guided) {
  std::vector<Choice> choice(rs.size());
  Objective best{-1, 0};
  std::function<void(size_t, int)> walk = [&](size_t i, int used) {
    if (i == rs.size()) {
      const Objective o = evaluate_guided(rs, choice, now, round_ms, devices, allowed,
                                          split_guidance, step, guided);
      if (o.value > best.value || (o.value == best.value && o.gpu_ms < best.gpu_ms)) best = o;
      return;
    }
    const PlannerRequest& r = rs[i];
    std::vector<Choice> choices{{0, false}};
    if (pinned(r, now, round_ms)) {
      const int held = static_cast<int>(r.placement.size());
      choices = {{r.split ? held / 2 : held, r.split}};
    } else if (r.steps_left > 0) {
      for (const Choice& c : modes_of(r, devices, allowed, split_guidance)) choices.push_back(c);
    }
    for (const Choice& c : choices) {
      if (used + c.devices() > devices) continue;
      choice[i] = c;
      walk(i + 1, used + c.devices());
    }
    choice[i] = {};
  };
  walk(0, 0);
  return best;
}

// random_requests with about half of them guided; a guided one holding an even number of
// devices whose half is allowed runs split on them (most of the time).
std::vector<PlannerRequest> random_guided_requests(std::mt19937_64& rng, int count, int devices,
                                                   double now, const StepMsFunction& step,
                                                   const std::vector<int>& allowed) {
  std::vector<PlannerRequest> rs = random_requests(rng, count, devices, now, step, allowed);
  std::bernoulli_distribution coin(0.5);
  for (PlannerRequest& r : rs) {
    r.guided = coin(rng);
    const int held = static_cast<int>(r.placement.size());
    if (r.guided && held % 2 == 0 && held > 0 &&
        std::find(allowed.begin(), allowed.end(), held / 2) != allowed.end() &&
        std::bernoulli_distribution(0.8)(rng)) {
      r.split = true;
    }
  }
  return rs;
}

}  // namespace

TEST_CASE("with guided requests the packing equals a brute-force search over every mode",
          "[serving][round_planner][guidance]") {
  std::mt19937_64 rng(4141);
  std::uniform_real_distribution<double> u(0, 1);
  const int heads_choices[] = {24, 6, 12, 8, 7};
  int split_chosen = 0, packed_chosen = 0, pinned_split = 0, late = 0;
  for (int c = 0; c < 200; ++c) {
    const int devices = std::uniform_int_distribution<int>(2, 8)(rng);
    const int count = std::uniform_int_distribution<int>(1, 4)(rng);
    const int heads = heads_choices[c % 5];
    const SyntheticCost cost{0.5 + 5 * u(rng), 0.001 + 0.01 * u(rng),
                             u(rng) < 0.5 ? 0.0 : 20 * u(rng)};
    const StepMsFunction step = cost;
    const GuidedStepMsFunction guided = SyntheticGuidedCost{cost, 0.3 * u(rng)};
    const double now = 1000.0 * u(rng);
    const std::vector<int> allowed = allowed_degrees(heads, devices);
    const std::vector<PlannerRequest> rs =
        random_guided_requests(rng, count, devices, now, step, allowed);
    RoundPlannerOptions o;
    o.devices = devices;
    o.heads = heads;
    o.round_ms = 5 + 200 * u(rng);
    o.grant_idle_devices = false;
    o.split_guidance = c % 4 != 3;  // a quarter packs always
    INFO("case " << c << ": " << count << " requests, " << devices << " devices, heads " << heads
                 << ", split_guidance " << o.split_guidance);
    const Result<RoundPlan> plan = plan_round(rs, now, step, guided, o);
    REQUIRE(plan.ok());
    const Objective best =
        brute_force_guided(rs, devices, now, o.round_ms, allowed, o.split_guidance, step, guided);
    CHECK(plan->predicted_on_time == best.value);
    CHECK(plan->packing_gpu_ms == Approx(best.gpu_ms).epsilon(1e-7));
    // The plan is valid and its own modes score what it reports.
    std::vector<Choice> choice;
    std::set<int> taken;
    int used = 0;
    for (size_t i = 0; i < rs.size(); ++i) {
      const PlannedRequest& p = plan->requests[i];
      CHECK(p.id == rs[i].id);
      if (p.degree != 0)
        CHECK(std::find(allowed.begin(), allowed.end(), p.degree) != allowed.end());
      if (!rs[i].guided || !o.split_guidance) CHECK((!p.split || pinned(rs[i], now, o.round_ms)));
      CHECK(static_cast<int>(p.devices.size()) == p.device_count());
      CHECK(std::is_sorted(p.devices.begin(), p.devices.end()));
      for (int d : p.devices) CHECK(taken.insert(d).second);
      used += p.device_count();
      choice.push_back({p.degree, p.split});
      if (p.degree > 0 && rs[i].guided) ++(p.split ? split_chosen : packed_chosen);
      if (pinned(rs[i], now, o.round_ms)) {
        std::vector<int> held = rs[i].placement;
        std::sort(held.begin(), held.end());
        CHECK(p.devices == held);
        CHECK(p.split == rs[i].split);
        if (p.split) ++pinned_split;
      }
    }
    CHECK(used <= devices);
    CHECK(used == plan->devices_used);
    const Objective own = evaluate_guided(rs, choice, now, o.round_ms, devices, allowed,
                                          o.split_guidance, step, guided);
    CHECK(own.value == plan->predicted_on_time);
    CHECK(own.gpu_ms == Approx(plan->packing_gpu_ms).epsilon(1e-7));
    if (best.value < count) ++late;
  }
  // Both modes are chosen, pinned split requests occur, and some cases cannot meet every
  // deadline.
  CHECK(split_chosen > 20);
  CHECK(packed_chosen > 20);
  CHECK(pinned_split > 5);
  CHECK(late > 20);
}

TEST_CASE("a guided request is split over two free devices when its deadline needs them",
          "[serving][round_planner][guidance]") {
  const SequenceParallelCostModel m = SequenceParallelCostModel::flux1_dev_h100();
  const StepMsFunction step = m.function();
  const GuidedStepMsFunction guided = m.guided_function();
  const int64_t tokens = 4096;
  const int steps = 28;
  RoundPlannerOptions o;
  o.devices = 2;
  o.round_ms = 100;
  o.grant_idle_devices = false;
  PlannerRequest r{7, tokens, steps, 0, {}, 0};
  r.guided = true;
  // Tight: only the halves at once on two devices make it; packed on two devices (one forward
  // of both halves, each all-to-all twice the rows) and packed on one are late.
  r.deadline_ms = 1.01 * steps * guided(tokens, 1, true);
  REQUIRE(steps * guided(tokens, 2, false) > r.deadline_ms);
  REQUIRE(steps * guided(tokens, 1, false) > r.deadline_ms);

  SECTION("two free devices: split, one half on each") {
    const Result<RoundPlan> p = plan_round(std::vector<PlannerRequest>{r}, 0.0, step, guided, o);
    REQUIRE(p.ok());
    CHECK(p->requests[0].split);
    CHECK(p->requests[0].degree == 1);
    CHECK(p->requests[0].devices == std::vector<int>{0, 1});
    CHECK(p->requests[0].on_time);
    CHECK(p->requests[0].finish_ms == Approx(steps * guided(tokens, 1, true)));
    CHECK(p->devices_used == 2);
  }

  SECTION("one free device: packed on it") {
    // Device 0 is busy through the round with another request's step.
    PlannerRequest busy{8, 1024, 10, 1e9, {0}, 500};
    const Result<RoundPlan> p =
        plan_round(std::vector<PlannerRequest>{busy, r}, 0.0, step, guided, o);
    REQUIRE(p.ok());
    CHECK(p->requests[0].devices == std::vector<int>{0});
    CHECK_FALSE(p->requests[1].split);
    CHECK(p->requests[1].degree == 1);
    CHECK(p->requests[1].devices == std::vector<int>{1});
    CHECK_FALSE(p->requests[1].on_time);
  }

  SECTION("packing always: packed, and late") {
    o.split_guidance = false;
    const Result<RoundPlan> p = plan_round(std::vector<PlannerRequest>{r}, 0.0, step, guided, o);
    REQUIRE(p.ok());
    CHECK_FALSE(p->requests[0].split);
    CHECK(p->predicted_on_time == 0);
  }

  SECTION("a loose deadline: packed on one device, the least GPU time; granted the second") {
    r.deadline_ms = 1.2 * steps * guided(tokens, 1, false);
    const Result<RoundPlan> p = plan_round(std::vector<PlannerRequest>{r}, 0.0, step, guided, o);
    REQUIRE(p.ok());
    CHECK_FALSE(p->requests[0].split);
    CHECK(p->requests[0].degree == 1);
    CHECK(p->requests[0].on_time);
    // Idle devices: the next rung at two devices is the split (faster than packed on two).
    o.grant_idle_devices = true;
    const Result<RoundPlan> g = plan_round(std::vector<PlannerRequest>{r}, 0.0, step, guided, o);
    REQUIRE(g.ok());
    CHECK(g->requests[0].split);
    CHECK(g->requests[0].devices == std::vector<int>{0, 1});
    CHECK(g->devices_granted == 1);
  }

  SECTION("a split request busy through the round keeps its mode and devices") {
    o.devices = 4;
    r.placement = {2, 3};
    r.split = true;
    r.ready_ms = 150;
    const Result<RoundPlan> p = plan_round(std::vector<PlannerRequest>{r}, 0.0, step, guided, o);
    REQUIRE(p.ok());
    CHECK(p->requests[0].split);
    CHECK(p->requests[0].degree == 1);
    CHECK(p->requests[0].devices == std::vector<int>{2, 3});
  }
}

TEST_CASE("the round planner refuses inconsistent guided input, naming it",
          "[serving][round_planner][guidance]") {
  const SequenceParallelCostModel m = SequenceParallelCostModel::flux1_dev_h100();
  RoundPlannerOptions o;
  o.devices = 4;
  o.round_ms = 100;
  PlannerRequest r{3, 1024, 10, 1000, {}, 0};
  r.guided = true;
  Result<RoundPlan> p = plan_round(std::vector<PlannerRequest>{r}, 0.0, m.function(), o);
  REQUIRE_FALSE(p.ok());
  CHECK_THAT(p.status().message(),
             Catch::Contains("request 3 is guided, expected a guided step function"));
  r.guided = false;
  r.split = true;
  p = plan_round(std::vector<PlannerRequest>{r}, 0.0, m.function(), m.guided_function(), o);
  REQUIRE_FALSE(p.ok());
  CHECK_THAT(p.status().message(), Catch::Contains("request 3 is split but not guided"));
  // Pinned, split over 3 devices: not twice an allowed degree.
  r.guided = true;
  r.placement = {0, 1, 2};
  r.ready_ms = 500;
  p = plan_round(std::vector<PlannerRequest>{r}, 0.0, m.function(), m.guided_function(), o);
  REQUIRE_FALSE(p.ok());
  CHECK_THAT(p.status().message(), Catch::Contains("request 3 holds 3 devices") &&
                                       Catch::Contains("halves split") &&
                                       Catch::Contains("expected twice an allowed degree"));
  const GuidedStepMsFunction broken = [](int64_t, int, bool split) { return split ? -1.0 : 1.0; };
  r.placement = {};
  r.split = false;
  p = plan_round(std::vector<PlannerRequest>{r}, 0.0, m.function(), broken, o);
  REQUIRE_FALSE(p.ok());
  CHECK_THAT(p.status().message(),
             Catch::Contains("request 3 (1024 tokens, guided, halves split) at degree 1 is -1"));
}

TEST_CASE("with homes and unavailable devices the packing equals a brute-force search, and a home request runs on its home",
          "[serving][round_planner]") {
  // An engine's planning (serving/team_planner.h): every request is bound to the device whose
  // worker holds it, and devices serving masked edits are nobody's to give.
  std::mt19937_64 rng(1141);
  std::uniform_real_distribution<double> u(0, 1);
  int grown = 0, with_unavailable = 0, shrunk_around_home = 0, yielded = 0;
  for (int c = 0; c < 400; ++c) {
    const int devices = std::uniform_int_distribution<int>(2, 8)(rng);
    const int count = std::uniform_int_distribution<int>(1, std::min(4, devices))(rng);
    const int heads = c % 2 == 0 ? 24 : 12;
    const SyntheticCost cost{0.5 + 5 * u(rng), 0.001 + 0.01 * u(rng), u(rng) < 0.5 ? 0.0 : 20 * u(rng)};
    const StepMsFunction step = cost;
    const double now = 1000.0 * u(rng);
    std::vector<PlannerRequest> rs = random_requests(rng, count, devices, now, step, allowed_degrees(heads, devices));
    // Homes: a held device where there is one, else a device nobody holds.
    std::set<int> taken;
    for (const auto& r : rs) taken.insert(r.placement.begin(), r.placement.end());
    std::vector<int> spare;
    for (int d = 0; d < devices; ++d) {
      if (!taken.count(d)) spare.push_back(d);
    }
    std::shuffle(spare.begin(), spare.end(), rng);
    for (auto& r : rs) {
      if (!r.placement.empty()) {
        r.home = r.placement[std::uniform_int_distribution<size_t>(0, r.placement.size() - 1)(rng)];
      } else if (!spare.empty() && u(rng) < 0.8) {
        r.home = spare.back();
        spare.pop_back();
      }
    }
    RoundPlannerOptions o;
    o.devices = devices;
    o.heads = heads;
    o.round_ms = 5 + 200 * u(rng);
    o.grant_idle_devices = c % 3 != 0;
    o.homes_may_wait = c % 4 >= 2;
    for (int d : spare) {
      if (u(rng) < 0.4) o.unavailable.push_back(d);
    }
    if (!o.unavailable.empty()) ++with_unavailable;
    const int capacity = devices - static_cast<int>(o.unavailable.size());
    const std::vector<int> allowed = allowed_degrees(heads, capacity);
    INFO("case " << c << ": " << count << " requests, " << devices << " devices, " << o.unavailable.size()
                 << " unavailable");
    const Result<RoundPlan> plan = plan_round(rs, now, step, o);
    REQUIRE(plan.ok());
    if (!o.grant_idle_devices) {
      const Objective best = brute_force(rs, capacity, now, o.round_ms, allowed, step, o.homes_may_wait);
      CHECK(plan->predicted_on_time == best.value);
      CHECK(plan->packing_gpu_ms == Approx(best.gpu_ms).epsilon(1e-7));
    }
    std::set<int> used;
    for (size_t i = 0; i < rs.size(); ++i) {
      const PlannedRequest& p = plan->requests[i];
      CHECK(static_cast<int>(p.devices.size()) == p.degree);
      for (int d : p.devices) {
        CHECK(used.insert(d).second);
        CHECK(std::find(o.unavailable.begin(), o.unavailable.end(), d) == o.unavailable.end());
      }
      if (rs[i].home < 0 || rs[i].steps_left == 0) continue;
      if (o.homes_may_wait && p.degree == 0) {
        ++yielded;
        continue;
      }
      CHECK(p.degree >= 1);
      CHECK(std::find(p.devices.begin(), p.devices.end(), rs[i].home) != p.devices.end());
      if (p.degree > 1) ++grown;
      if (!rs[i].placement.empty() && p.degree < static_cast<int>(rs[i].placement.size())) ++shrunk_around_home;
    }
  }
  CHECK(grown > 20);
  CHECK(with_unavailable > 20);
  CHECK(shrunk_around_home > 5);
  CHECK(yielded > 5);
}

TEST_CASE("a home request grows around its home, and requests price themselves", "[serving][round_planner]") {
  RoundPlannerOptions o;
  o.devices = 4;
  o.heads = 4;
  o.round_ms = 10;
  o.unavailable = {1};
  // Two requests of different models: each brings its own step times. The urgent one (home 2)
  // needs two devices to make its deadline; the slack one (home 0) does not. Device 3 is
  // free, device 1 serves masked edits.
  PlannerRequest urgent;
  urgent.id = 1;
  urgent.tokens = 4096;
  urgent.steps_left = 10;
  urgent.home = 2;
  urgent.step_ms = [](int64_t, int d) { return 100.0 / d + 1.0; };
  urgent.deadline_ms = 10 * 60.0;  // at degree 1 it takes 1010 ms, at 2 510
  PlannerRequest slack;
  slack.id = 2;
  slack.tokens = 4096;
  slack.steps_left = 10;
  slack.home = 0;
  slack.step_ms = [](int64_t, int d) { return 10.0 / d + 1.0; };
  slack.deadline_ms = 1e9;
  const std::vector<PlannerRequest> rs{slack, urgent};
  const StepMsFunction unused = [](int64_t, int) { return -1.0; };  // every request has its own
  o.grant_idle_devices = false;
  Result<RoundPlan> plan = plan_round(rs, 0.0, unused, o);
  REQUIRE(plan.ok());
  CHECK(plan->predicted_on_time == 2);
  CHECK(plan->requests[0].devices == std::vector<int>{0});
  CHECK(plan->requests[1].devices == std::vector<int>{2, 3});
  // With the urgent one's home at 3, it grows to 2 (its window around 3 is {2, 3}).
  std::vector<PlannerRequest> moved = rs;
  moved[1].home = 3;
  plan = plan_round(moved, 0.0, unused, o);
  REQUIRE(plan.ok());
  CHECK(plan->requests[1].devices == std::vector<int>{2, 3});
  // A home request never waits, even where waiting would free its devices for another.
  moved[0].deadline_ms = 0;  // hopeless
  plan = plan_round(moved, 0.0, unused, o);
  REQUIRE(plan.ok());
  CHECK(plan->requests[0].degree == 1);
  CHECK(plan->requests[0].devices == std::vector<int>{0});
  // With homes_may_wait a home request may wait a round, its home then given to another. The
  // slack one (home 0) can still finish alone from the next round, so it yields device 0 to
  // the urgent one, which needs three devices (no device 1) to be on time.
  {
    RoundPlannerOptions yield = o;
    yield.homes_may_wait = true;
    std::vector<PlannerRequest> tight = rs;
    tight[1].home = 2;
    tight[1].deadline_ms = 10 * 40.0;  // 1010 ms at degree 1, 510 at 2, 343 at 3 (device 1 out)
    tight[1].step_ms = [](int64_t, int d) { return 100.0 / d + 1.0; };
    RoundPlannerOptions three = yield;
    three.heads = 3;
    plan = plan_round(tight, 0.0, unused, three);
    REQUIRE(plan.ok());
    CHECK(plan->predicted_on_time == 2);
    CHECK(plan->requests[0].degree == 0);  // waits: its home is given away
    CHECK(plan->requests[1].degree == 3);
    CHECK(plan->requests[1].devices == std::vector<int>{0, 2, 3});
    // Where its home alone would be late from the next round, it does not count on waiting:
    // it keeps its device and the urgent one misses.
    tight[0].deadline_ms = 10 * 11.0 + 5;  // 110 ms alone from now, 120 from the next round
    plan = plan_round(tight, 0.0, unused, three);
    REQUIRE(plan.ok());
    CHECK(plan->requests[0].degree >= 1);
    CHECK(plan->requests[0].on_time);
    three.homes_may_wait = false;  // never waiting: the same here
    CHECK(plan_round(tight, 0.0, unused, three)->requests[0].degree >= 1);
  }
  // A shrink keeps the part around the home: holding {0, 1, 2, 3} where degree 4 is slow, the
  // request drops to degree 2 and keeps {0, 1}, its home 0 among them.
  RoundPlannerOptions four = o;
  four.unavailable.clear();
  PlannerRequest held = urgent;
  held.home = 0;
  held.placement = {0, 1, 2, 3};
  held.step_ms = [](int64_t, int d) { return d == 4 ? 1000.0 : 100.0 / d + 1.0; };  // 4 is slow
  const std::vector<PlannerRequest> one{held};
  plan = plan_round(one, 0.0, unused, four);
  REQUIRE(plan.ok());
  CHECK(plan->requests[0].degree == 2);
  CHECK(plan->requests[0].devices == std::vector<int>{0, 1});
  CHECK(plan->requests[0].moved);
}

TEST_CASE("the round planner refuses inconsistent homes and unavailable devices, naming them",
          "[serving][round_planner]") {
  const StepMsFunction step = SyntheticCost{1, 0.01, 0};
  RoundPlannerOptions o;
  o.devices = 4;
  o.round_ms = 10;
  PlannerRequest a{1, 100, 3, 1e9, {}, 0};
  PlannerRequest b{2, 100, 3, 1e9, {}, 0};
  const auto refused = [&](std::vector<PlannerRequest> rs, const RoundPlannerOptions& opts) {
    const Result<RoundPlan> plan = plan_round(rs, 0.0, step, opts);
    REQUIRE_FALSE(plan.ok());
    return plan.status().message();
  };
  RoundPlannerOptions bad = o;
  bad.unavailable = {4};
  CHECK_THAT(refused({a}, bad), Catch::Contains("unavailable device 4, expected 0..3"));
  bad.unavailable = {1, 1};
  CHECK_THAT(refused({a}, bad), Catch::Contains("unavailable device 1 is listed twice"));
  a.home = 7;
  CHECK_THAT(refused({a}, o), Catch::Contains("request 1's home is device 7, expected 0..3 or -1"));
  a.home = 1;
  bad.unavailable = {1};
  CHECK_THAT(refused({a}, bad), Catch::Contains("request 1's home is device 1, which is unavailable"));
  b.home = 1;
  CHECK_THAT(refused({a, b}, o), Catch::Contains("request 2's home is device 1, the home of request 1 too"));
  b.home = -1;
  b.placement = {1};
  CHECK_THAT(refused({a, b}, o), Catch::Contains("request 1's home is device 1, which request 2 holds"));
  b.placement = {};
  a.placement = {2, 3};
  CHECK_THAT(refused({a}, o), Catch::Contains("request 1's placement leaves out its home, device 1"));
  a.home = -1;
  a.placement = {1};
  bad.unavailable = {1};
  CHECK_THAT(refused({a}, bad), Catch::Contains("request 1's placement names device 1, which is unavailable"));
}
