#include "support/catch.h"

#include <algorithm>
#include <chrono>
#include <random>

#include "serving/simulator.h"

using namespace infill;

namespace {

StepCostModel cost(double c0, double per_token, double per_request, double per_attention) {
  std::vector<StepSample> s;
  for (double t : {10.0, 50.0, 200.0, 400.0})
    for (double b : {1.0, 2.0, 4.0, 8.0})
      for (double a : {1000.0, 9000.0, 40000.0})
        s.push_back({t, b, a, c0 + per_token * t + per_request * b + per_attention * a});
  auto m = StepCostModel::fit(s);
  REQUIRE(m.ok());
  return *m;
}

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * double(v.size() - 1))];
}

std::vector<SimRequest> poisson_trace(uint64_t seed, int n, double rate_per_ms, double deadline_factor,
                                      const StepCostModel& m) {
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> gap(rate_per_ms);
  std::gamma_distribution<double> ratio(2.0, 0.11 / 2.0);
  std::vector<SimRequest> trace;
  double t = 0;
  for (int i = 0; i < n; ++i) {
    t += gap(rng);
    SimRequest r;
    r.id = static_cast<uint64_t>(i + 1);
    r.arrival_ms = t;
    r.total_tokens = 576;
    r.tokens = std::clamp<int64_t>(static_cast<int64_t>(ratio(rng) * 576), 4, 300);
    r.steps = 10;
    r.deadline_ms = deadline_factor * 10 * m.predict_ms(double(r.tokens), 1, double(r.tokens) * 576);
    trace.push_back(r);
  }
  return trace;
}

}  // namespace

TEST_CASE("a lone request takes pre + steps x predicted step + post", "[serving][simulator]") {
  const StepCostModel m = cost(2.0, 0.1, 0.5, 0.0);
  SimRequest r{1, 100.0, 40, 100, 5, 1000.0, RequestClass::kInteractive};
  SimOptions o;
  o.pre_ms = 3;
  o.post_ms = 7;
  o.step_overhead_ms = 0.25;
  const SimReport rep = simulate(std::span(&r, 1), m, o);
  REQUIRE(rep.requests.size() == 1);
  const double step = 2.0 + 0.1 * 40 + 0.5 + 0.25;
  CHECK(rep.requests[0].latency_ms == Approx(3 + 5 * step + 7).margin(1e-3));
  CHECK(rep.requests[0].steps_run == 5);
  CHECK(rep.requests[0].deadline_met);
  CHECK(rep.steps == 5);
}

TEST_CASE("continuous batching lets a late arrival join, static makes it wait", "[serving][simulator]") {
  const StepCostModel m = cost(10.0, 0.0, 0.0, 0.0);  // every step 10 ms, whatever the batch
  std::vector<SimRequest> trace = {{1, 0.0, 10, 100, 4, 1e6, RequestClass::kInteractive},
                                   {2, 5.0, 10, 100, 4, 1e6, RequestClass::kInteractive}};
  SimOptions o;
  o.policy = BatchingPolicy::kStatic;
  const SimReport st = simulate(trace, m, o);
  o.policy = BatchingPolicy::kContinuous;
  const SimReport co = simulate(trace, m, o);
  // Static: 2 waits for 1's four steps (ends at 40), then runs four: done at 80.
  CHECK(st.requests[1].latency_ms == Approx(75.0).margin(1e-3));
  // Continuous: 2 joins at the boundary at 10 and ends at 50.
  CHECK(co.requests[1].latency_ms == Approx(45.0).margin(1e-3));
  CHECK(co.requests[0].latency_ms == Approx(40.0).margin(1e-3));
}

TEST_CASE("a one-thread pool makes pre- and post-processing queue, first come first served", "[serving][simulator]") {
  const StepCostModel m = cost(10.0, 0.0, 0.0, 0.0);  // every step 10 ms
  // Two requests at once, one step each; pre-processing takes 12 ms, post-processing 2 ms +
  // 2 ms per masked token (22 ms for the first, 42 ms for the second).
  std::vector<SimRequest> trace = {{1, 0.0, 10, 100, 1, 1e6, RequestClass::kInteractive},
                                   {2, 0.0, 20, 100, 1, 1e6, RequestClass::kInteractive}};
  SimOptions o;
  o.policy = BatchingPolicy::kContinuous;
  o.pre_ms = 12;
  o.post_ms = 2;
  o.post_ms_per_token = 2;
  o.pool_threads = 1;
  const SimReport one = simulate(trace, m, o);
  // 1: pre 0-12, step 12-22, post waits for 2's pre (12-24) and runs 24-46.
  // 2: step 24-34, post waits for 1's and runs 46-88.
  CHECK(one.requests[0].latency_ms == Approx(46.0).margin(1e-3));
  CHECK(one.requests[1].latency_ms == Approx(88.0).margin(1e-3));
  o.pool_threads = 0;  // unbounded: pure delays
  const SimReport free = simulate(trace, m, o);
  // Both ready at 12; 1's step (12-22) had started, 2 steps 22-32 and posts 32-74.
  CHECK(free.requests[0].latency_ms == Approx(44.0).margin(1e-3));
  CHECK(free.requests[1].latency_ms == Approx(74.0).margin(1e-3));
}

TEST_CASE("step loops sharing fewer cores than they need run proportionally slower", "[serving][simulator]") {
  const StepCostModel m = cost(10.0, 0.0, 0.0, 0.0);  // every step 10 ms on a core of its own
  std::vector<SimRequest> trace = {{1, 0.0, 10, 100, 3, 1e6, RequestClass::kInteractive},
                                   {2, 0.0, 10, 100, 3, 1e6, RequestClass::kInteractive}};
  SimOptions o;
  o.policy = BatchingPolicy::kContinuous;
  o.routing = RoutingPolicy::kRoundRobin;  // one request on each of two workers
  o.workers = 2;
  o.cores = 2;
  const SimReport enough = simulate(trace, m, o);
  CHECK(enough.requests[0].latency_ms == Approx(30.0).margin(1e-3));
  CHECK(enough.requests[1].latency_ms == Approx(30.0).margin(1e-3));
  o.cores = 1;
  const SimReport shared = simulate(trace, m, o);
  // Worker 0's first step starts alone (10 ms); every other step starts with both loops
  // busy and takes 20 ms.
  CHECK(shared.requests[0].latency_ms == Approx(10.0 + 20.0 + 20.0).margin(1e-3));
  CHECK(shared.requests[1].latency_ms == Approx(60.0).margin(1e-3));
  CHECK(shared.requests[1].latency_ms > enough.requests[1].latency_ms);
}

TEST_CASE("step and pool times vary by factors drawn from the given ratios, reproducibly", "[serving][simulator]") {
  const StepCostModel m = cost(2.0, 0.1, 0.5, 0.0);
  SimRequest r{1, 0.0, 40, 100, 5, 1000.0, RequestClass::kInteractive};
  SimOptions o;
  o.pre_ms = 3;
  o.post_ms = 7;
  o.pool_threads = 1;
  o.step_time_factors = {2.0};
  o.pool_time_factors = {3.0};
  const double step = 2.0 + 0.1 * 40 + 0.5;
  const SimReport lone = simulate(std::span(&r, 1), m, o);
  CHECK(lone.requests[0].latency_ms == Approx(3 * 3 + 5 * 2 * step + 3 * 7).margin(1e-3));

  // Two ratios: every step takes 0.5x or 1.5x; the same seed gives the same run.
  const auto trace = poisson_trace(7, 200, 0.005, 3.0, m);  // about half the capacity
  o.step_time_factors = {0.5, 1.5};
  o.pool_time_factors = {};
  o.seed = 11;
  const SimReport a = simulate(trace, m, o), b = simulate(trace, m, o);
  o.seed = 12;
  const SimReport c = simulate(trace, m, o);
  o.step_time_factors = {};
  const SimReport exact = simulate(trace, m, o);
  REQUIRE(a.requests.size() == trace.size());
  bool differs = false;
  for (size_t i = 0; i < trace.size(); ++i) {
    CHECK(a.requests[i].latency_ms == b.requests[i].latency_ms);
    differs = differs || a.requests[i].latency_ms != c.requests[i].latency_ms;
  }
  CHECK(differs);
  // Mean factor 1: the busy time stays near the exact run's (200 requests x 10 steps).
  double busy_a = 0, busy_exact = 0;
  for (double x : a.busy_ms) busy_a += x;
  for (double x : exact.busy_ms) busy_exact += x;
  CHECK(busy_a == Approx(busy_exact).epsilon(0.1));
}

TEST_CASE("under overload the deadline scheduler meets more deadlines than FCFS", "[serving][simulator]") {
  // A fixed per-step cost that batching amortises, as on a CPU with a small model.
  const StepCostModel m = cost(6.0, 0.01, 0.3, 0.00001);
  // A full 256-token step takes ~11 ms for ~4 requests of 10 steps: capacity is about one
  // request per 28 ms; arrivals come every 25 ms on average.
  const auto trace = poisson_trace(7, 1500, 1.0 / 25.0, 2.0, m);
  SimOptions o;
  o.token_budget = 256;
  o.policy = BatchingPolicy::kContinuous;
  const SimReport fcfs = simulate(trace, m, o);
  o.policy = BatchingPolicy::kDeadline;
  o.scheduler.allow_step_reduction = false;
  const SimReport edf = simulate(trace, m, o);
  auto met = [](const SimReport& r) {
    return std::count_if(r.requests.begin(), r.requests.end(), [](const SimOutcome& x) { return x.deadline_met; });
  };
  INFO("fcfs met " << met(fcfs) << ", deadline met " << met(edf));
  CHECK(met(edf) > met(fcfs));
  for (const SimOutcome& x : edf.requests) CHECK(x.steps_run == 10);
}

TEST_CASE("mask-aware routing beats round-robin on mixed mask sizes", "[serving][simulator]") {
  const StepCostModel m = cost(1.0, 0.2, 0.2, 0.0);
  std::mt19937_64 rng(3);
  std::vector<SimRequest> trace;
  double t = 0;
  for (int i = 0; i < 2000; ++i) {
    t += std::exponential_distribution<double>(1.0 / 6.0)(rng);
    // Alternating tiny and large masks: round-robin sends every large one to the same worker.
    const int64_t tokens = (i % 2 == 0) ? 8 : 120;
    trace.push_back({static_cast<uint64_t>(i + 1), t, tokens, 576, 8, 1e9, RequestClass::kInteractive});
  }
  SimOptions o;
  o.workers = 2;
  o.policy = BatchingPolicy::kContinuous;
  o.token_budget = 150;
  auto p95 = [&](RoutingPolicy p) {
    o.routing = p;
    const SimReport r = simulate(trace, m, o);
    std::vector<double> lat;
    for (const auto& x : r.requests) lat.push_back(x.latency_ms);
    return percentile(lat, 0.95);
  };
  const double rr = p95(RoutingPolicy::kRoundRobin), ma = p95(RoutingPolicy::kMaskAware);
  INFO("round-robin p95 " << rr << " ms, mask-aware p95 " << ma << " ms");
  CHECK(ma < rr);
}

TEST_CASE("512 simulated devices plan a large trace quickly", "[serving][simulator]") {
  const StepCostModel m = cost(3.0, 0.05, 0.3, 0.00002);
  const auto trace = poisson_trace(11, 50000, 512.0 / 40.0, 3.0, m);
  SimOptions o;
  o.workers = 512;
  o.token_budget = 512;
  const auto t0 = std::chrono::steady_clock::now();
  const SimReport r = simulate(trace, m, o);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE(r.requests.size() == trace.size());
  // Step reduction is on in the simulator: never below the interactive floor of 8 of 10.
  for (const auto& x : r.requests) REQUIRE(x.steps_run >= 8);
  CHECK(r.busy_ms.size() == 512);
  WARN("simulated 50000 requests on 512 devices in " << s << " s");
}
