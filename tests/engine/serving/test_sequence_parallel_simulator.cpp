#include "support/catch.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <random>

#include "serving/sequence_parallel_simulator.h"

using namespace infill;

namespace {

const SequenceParallelCostModel& flux() {
  static const SequenceParallelCostModel m = SequenceParallelCostModel::flux1_dev_h100();
  return m;
}

SpSimRequest request(uint64_t id, double arrival, int64_t tokens, int steps, double deadline) {
  return {id, arrival, tokens, steps, deadline};
}

SpSimReport run(const std::vector<SpSimRequest>& trace, const SpSimOptions& o) {
  const Result<SpSimReport> r = simulate_sequence_parallel(trace, flux().function(), o);
  REQUIRE(r.ok());
  return *r;
}

SpSimOptions fixed(int degree, int devices = 8) {
  SpSimOptions o;
  o.devices = devices;
  o.policy = SpPolicy::kFixedDegree;
  o.fixed_degree = degree;
  return o;
}

}  // namespace

TEST_CASE("a lone request runs at the degree it is given", "[serving][sp_simulator]") {
  const double s1 = flux().step_ms(16384, 1), s8 = flux().step_ms(16384, 8);
  const std::vector<SpSimRequest> trace{request(5, 200.0, 16384, 28, 2 * 28 * s1)};

  SECTION("fixed degrees") {
    for (int d : {1, 2, 4, 8}) {
      const SpSimReport rep = run(trace, fixed(d));
      REQUIRE(rep.requests.size() == 1);
      CHECK(rep.requests[0].id == 5);
      CHECK(rep.requests[0].latency_ms == Approx(28 * flux().step_ms(16384, d)));
      CHECK(rep.requests[0].mean_degree == d);
      CHECK(rep.steps_by_degree[static_cast<size_t>(d)] == 28);
      CHECK(rep.busy_device_ms == Approx(d * 28 * flux().step_ms(16384, d)));
      CHECK(rep.rounds == 0);
    }
  }

  SECTION("the round planner grants it every device and never moves it") {
    SpSimOptions o;
    o.round_ms = 100;  // it arrives on a round's boundary
    const SpSimReport rep = run(trace, o);
    CHECK(rep.requests[0].latency_ms == Approx(28 * s8));
    CHECK(rep.requests[0].deadline_met);
    CHECK(rep.requests[0].mean_degree == 8);
    CHECK(rep.requests[0].degree_changes == 0);
    CHECK(rep.requests[0].moves == 0);
    CHECK(rep.rounds > 40);  // every 100 ms while it has steps to start
    o.grant_idle_devices = false;
    const SpSimReport packed = run(trace, o);
    CHECK(packed.requests[0].mean_degree == 1);  // on time at degree 1, the cheapest
    CHECK(packed.requests[0].latency_ms == Approx(28 * s1));
  }

  SECTION("rounds counted in steps") {
    SpSimOptions o;
    o.round_steps = 2;
    const SpSimReport rep = run(trace, o);
    CHECK(rep.requests[0].latency_ms == Approx(28 * s8));
    CHECK(rep.rounds == 14);
  }

  SECTION("an arrival between rounds waits for the next one") {
    SpSimOptions o;
    o.round_ms = 300;
    const SpSimReport rep = run(trace, o);
    CHECK(rep.requests[0].latency_ms == Approx(100 + 28 * s8));
  }

  SECTION("planned on arrival, as the engine's team plans, it starts at once") {
    SpSimOptions o;
    o.round_ms = 300;
    o.plan_on_arrival = true;
    const SpSimReport rep = run(trace, o);
    CHECK(rep.requests[0].latency_ms == Approx(28 * s8));
    CHECK(rep.requests[0].mean_degree == 8);
    // The arrival's round restarts the clock: rounds every 300 ms from 200 ms, no extra ones
    // from the grid it replaced.
    const int starting = static_cast<int>(std::ceil(28 * s8 / 300.0));
    CHECK(rep.rounds >= starting - 1);
    CHECK(rep.rounds <= starting + 1);
  }
}

TEST_CASE("planned on arrival a second request takes free devices mid-round",
          "[serving][sp_simulator]") {
  // The first holds degree 1 and is on time there (no grants); the second arrives 50 ms into
  // a 1-second round with a deadline that a wait for the next round would miss.
  const double s1 = flux().step_ms(4096, 1), s2 = flux().step_ms(4096, 2);
  const std::vector<SpSimRequest> trace{request(1, 0, 4096, 10, 1e9),
                                        request(2, 50, 4096, 10, 10 * s2 + 100)};
  SpSimOptions o;
  o.devices = 3;
  o.round_ms = 1000;
  o.grant_idle_devices = false;
  const SpSimReport waits = run(trace, o);
  CHECK_FALSE(waits.requests[1].deadline_met);
  CHECK(waits.requests[1].latency_ms >= 950);
  o.plan_on_arrival = true;
  const SpSimReport at_once = run(trace, o);
  CHECK(at_once.requests[1].deadline_met);
  CHECK(at_once.requests[1].latency_ms == Approx(10 * s2));  // degree 1 would be late
  CHECK(at_once.requests[1].mean_degree == 2);
  CHECK(at_once.requests[0].latency_ms == Approx(10 * s1));  // the first one is not disturbed
  CHECK(at_once.requests[0].moves == 0);
}

TEST_CASE("a fixed degree serves first come first served on its groups",
          "[serving][sp_simulator]") {
  const double run4 = 10 * flux().step_ms(4096, 4);
  // Three at once on 8 devices at degree 4: two groups, the third waits for the first.
  const std::vector<SpSimRequest> trace{request(1, 0, 4096, 10, 1e9), request(2, 0, 4096, 10, 1e9),
                                        request(3, 1, 4096, 10, 1e9)};
  const SpSimReport rep = run(trace, fixed(4));
  CHECK(rep.requests[0].latency_ms == Approx(run4));
  CHECK(rep.requests[1].latency_ms == Approx(run4));
  CHECK(rep.requests[2].latency_ms == Approx(2 * run4 - 1));
  CHECK(rep.makespan_ms == Approx(2 * run4));
}

TEST_CASE("the round planner meets deadlines that no fixed degree meets",
          "[serving][sp_simulator]") {
  // A 2048^2 request that needs 4 devices to make its deadline and four 256^2 requests that
  // make theirs on one device each: planned per request, all five are on time (the large one
  // at 4 devices, then at more as the small ones finish and leave theirs idle). Degree 1
  // misses the large one, degree 4 queues the small ones on one group, degree 8 queues them
  // behind the large one.
  std::vector<SpSimRequest> trace{request(1, 0, 16384, 10, 1.1 * 10 * flux().step_ms(16384, 4))};
  for (uint64_t i = 2; i <= 5; ++i)
    trace.push_back(request(i, 0, 256, 10, 1.5 * 10 * flux().step_ms(256, 1)));
  SpSimOptions o;
  o.round_ms = 50;
  const SpSimReport planned = run(trace, o);
  CHECK(planned.slo_attainment == 1.0);
  CHECK(planned.requests[0].mean_degree >= 4);
  CHECK(planned.requests[0].mean_degree < 8);
  for (size_t i = 1; i < 5; ++i) CHECK(planned.requests[i].mean_degree == 1);
  for (int d : {1, 2, 4, 8}) {
    INFO("fixed degree " << d);
    CHECK(run(trace, fixed(d)).slo_attainment < 1.0);
  }
}

TEST_CASE("the simulator plans only degrees that divide the heads", "[serving][sp_simulator]") {
  std::mt19937_64 rng(17);
  std::exponential_distribution<double> gap(1.0 / 300.0);
  const int64_t sizes[] = {256, 1024, 4096, 16384};
  std::vector<SpSimRequest> trace;
  double t = 0;
  for (uint64_t i = 0; i < 300; ++i) {
    t += gap(rng);
    const int64_t tokens = sizes[i % 4];
    trace.push_back(request(i, t, tokens, 20, 1.2 * 20 * flux().step_ms(tokens, 1)));
  }
  SpSimOptions o;
  o.heads = 6;
  o.round_ms = 100;
  const SpSimReport rep = run(trace, o);
  REQUIRE(rep.steps_by_degree.size() == 9);
  for (int bad : {4, 5, 7, 8}) CHECK(rep.steps_by_degree[static_cast<size_t>(bad)] == 0);
  CHECK(rep.steps_by_degree[6] > 0);
  CHECK(rep.steps_by_degree[1] > 0);
  uint64_t steps = 0;
  for (uint64_t s : rep.steps_by_degree) steps += s;
  CHECK(steps == 300 * 20);
  for (const SpSimOutcome& out : rep.requests) CHECK(out.latency_ms > 0);
}

TEST_CASE("the sequence-parallel simulator runs 512 devices and never books a device twice",
          "[serving][sp_simulator]") {
  std::mt19937_64 rng(5);
  std::exponential_distribution<double> gap(1.0 / 45.0);  // half the devices' time at degree 1
  std::uniform_int_distribution<int> pick(0, 3);
  const int64_t sizes[] = {256, 1024, 4096, 16384};
  std::vector<SpSimRequest> trace;
  double t = 0;
  for (uint64_t i = 0; i < 2000; ++i) {
    t += gap(rng);
    const int64_t tokens = sizes[pick(rng)];
    trace.push_back(request(i, t, tokens, 28, 1.0 * 28 * flux().step_ms(tokens, 1)));
  }
  SpSimOptions bound{512, 24, SpPolicy::kRoundPlanner, 1, 200, 0, 0, true};
  bound.bind_to_home = true;
  for (const SpSimOptions& o :
       {SpSimOptions{512, 24, SpPolicy::kRoundPlanner, 1, 200, 0, 0, true}, fixed(8, 512), bound}) {
    const SpSimReport rep = run(trace, o);
    REQUIRE(rep.requests.size() == trace.size());
    for (const SpSimOutcome& out : rep.requests) CHECK(out.mean_degree >= 1);  // every one ran
    // Device time used fits in the devices over the span of the run.
    CHECK(rep.busy_device_ms <= 512 * (rep.makespan_ms + 200) * (1 + 1e-9));
    CHECK(rep.slo_attainment > 0.0);
    CHECK(rep.slo_attainment <= 1.0);
  }
}

TEST_CASE("the sequence-parallel simulator refuses bad options and requests",
          "[serving][sp_simulator]") {
  const std::vector<SpSimRequest> trace{request(1, 0, 1024, 10, 1000)};
  SpSimOptions o = fixed(5);
  Result<SpSimReport> r = simulate_sequence_parallel(trace, flux().function(), o);
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.status().message(), Catch::Contains("fixed_degree is 5"));
  o = SpSimOptions{};
  o.round_ms = 0;
  r = simulate_sequence_parallel(trace, flux().function(), o);
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.status().message(), Catch::Contains("round_ms is 0"));
  const std::vector<SpSimRequest> bad{request(9, 0, 1024, 0, 1000)};
  r = simulate_sequence_parallel(bad, flux().function(), SpSimOptions{});
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.status().message(), Catch::Contains("request 9 has 0 steps"));
}

namespace {

SpSimRequest guided_request(uint64_t id, double arrival, int64_t tokens, int steps,
                            double deadline) {
  SpSimRequest r = request(id, arrival, tokens, steps, deadline);
  r.guided = true;
  return r;
}

SpSimReport run_guided(const std::vector<SpSimRequest>& trace, const SpSimOptions& o) {
  const Result<SpSimReport> r =
      simulate_sequence_parallel(trace, flux().function(), flux().guided_function(), o);
  REQUIRE(r.ok());
  return *r;
}

}  // namespace

TEST_CASE("a guided request runs its halves on two devices at once or packed on one",
          "[serving][sp_simulator][guidance]") {
  const double split1 = flux().guided_step_ms(4096, 1, true);
  const double packed1 = flux().guided_step_ms(4096, 1, false);
  const double packed2 = flux().guided_step_ms(4096, 2, false);
  const std::vector<SpSimRequest> trace{guided_request(1, 0.0, 4096, 28, 1.01 * 28 * split1)};

  SECTION("the round planner splits it over two free devices") {
    SpSimOptions o;
    o.devices = 2;
    o.round_ms = 100;
    const SpSimReport rep = run_guided(trace, o);
    CHECK(rep.requests[0].latency_ms == Approx(28 * split1));
    CHECK(rep.requests[0].deadline_met);
    CHECK(rep.requests[0].split_steps == 28);
    CHECK(rep.requests[0].mean_degree == 2);  // devices: a half on each
    CHECK(rep.guided_steps == 28);
    CHECK(rep.split_steps == 28);
    CHECK(rep.steps_by_degree[2] == 28);
  }

  SECTION("packing always: one forward of both halves over the two devices, late") {
    SpSimOptions o;
    o.devices = 2;
    o.round_ms = 100;
    o.split_guidance = false;
    const SpSimReport rep = run_guided(trace, o);
    CHECK(rep.requests[0].latency_ms == Approx(28 * packed2));
    CHECK_FALSE(rep.requests[0].deadline_met);
    CHECK(rep.split_steps == 0);
    CHECK(rep.guided_steps == 28);
  }

  SECTION("one device: packed on it") {
    SpSimOptions o;
    o.devices = 1;
    o.round_ms = 100;
    const SpSimReport rep = run_guided(trace, o);
    CHECK(rep.requests[0].latency_ms == Approx(28 * packed1));
    CHECK(rep.split_steps == 0);
  }

  SECTION("fixed degree 2, packed or split over the group's halves") {
    SpSimOptions o = fixed(2, 2);
    CHECK(run_guided(trace, o).requests[0].latency_ms == Approx(28 * packed2));
    o.fixed_split_guidance = true;
    const SpSimReport rep = run_guided(trace, o);
    CHECK(rep.requests[0].latency_ms == Approx(28 * split1));
    CHECK(rep.split_steps == 28);
  }
}

TEST_CASE("a trace's guided share: only guided requests split, every step counted",
          "[serving][sp_simulator][guidance]") {
  std::mt19937_64 rng(23);
  std::exponential_distribution<double> gap(1.0 / 400.0);
  std::bernoulli_distribution guided(0.5);
  const int64_t sizes[] = {256, 1024, 4096, 16384};
  std::vector<SpSimRequest> trace;
  double t = 0;
  uint64_t guided_count = 0;
  for (uint64_t i = 0; i < 300; ++i) {
    t += gap(rng);
    const int64_t tokens = sizes[i % 4];
    SpSimRequest r = request(i, t, tokens, 20, 1.2 * 20 * flux().step_ms(tokens, 1));
    r.guided = guided(rng);
    if (r.guided) {
      r.deadline_ms = 1.2 * 20 * flux().guided_step_ms(tokens, 1, false);
      ++guided_count;
    }
    trace.push_back(r);
  }
  SpSimOptions o;
  o.round_ms = 100;
  const SpSimReport rep = run_guided(trace, o);
  CHECK(rep.guided_steps == guided_count * 20);
  CHECK(rep.split_steps > 0);
  CHECK(rep.split_steps < rep.guided_steps);
  uint64_t steps = 0;
  for (uint64_t s : rep.steps_by_degree) steps += s;
  CHECK(steps == 300 * 20);
  for (size_t i = 0; i < trace.size(); ++i) {
    if (!trace[i].guided) CHECK(rep.requests[i].split_steps == 0);
  }
  o.split_guidance = false;
  CHECK(run_guided(trace, o).split_steps == 0);
}

TEST_CASE("the sequence-parallel simulator refuses guided input it cannot run",
          "[serving][sp_simulator][guidance]") {
  const std::vector<SpSimRequest> trace{guided_request(4, 0, 1024, 10, 1000)};
  Result<SpSimReport> r = simulate_sequence_parallel(trace, flux().function(), SpSimOptions{});
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.status().message(),
             Catch::Contains("request 4 is guided, expected a guided step function"));
  SpSimOptions o = fixed(3);
  o.fixed_split_guidance = true;
  r = simulate_sequence_parallel(trace, flux().function(), flux().guided_function(), o);
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.status().message(), Catch::Contains("fixed_degree is 3 with fixed_split_guidance"));
}

TEST_CASE("bound to their devices, as in the engine, requests still share idle devices and meet those deadlines",
          "[serving][sp_simulator]") {
  SpSimOptions o;
  o.round_ms = 50;
  o.bind_to_home = true;

  SECTION("a lone request is granted every device") {
    const std::vector<SpSimRequest> trace{request(5, 200.0, 16384, 28, 1e9)};
    const SpSimReport rep = run(trace, o);
    CHECK(rep.requests[0].mean_degree == 8);
    CHECK(rep.requests[0].latency_ms == Approx(28 * flux().step_ms(16384, 8)));
  }

  SECTION("the large request takes the devices nobody is bound to") {
    // As "the round planner meets deadlines that no fixed degree meets": the large one is
    // bound to device 0, the small ones to 1 .. 4; 5, 6 and 7 are granted to the large one.
    std::vector<SpSimRequest> trace{request(1, 0, 16384, 10, 1.1 * 10 * flux().step_ms(16384, 4))};
    for (uint64_t i = 2; i <= 5; ++i) trace.push_back(request(i, 0, 256, 10, 1.5 * 10 * flux().step_ms(256, 1)));
    const SpSimReport rep = run(trace, o);
    CHECK(rep.slo_attainment == 1.0);
    CHECK(rep.requests[0].mean_degree >= 4);
    for (size_t i = 1; i < 5; ++i) CHECK(rep.requests[i].mean_degree == 1);
  }

  SECTION("a device runs one of its requests at a time, and a free planner would not wait") {
    // Nine alike at once on eight devices: the ninth is bound to device 0 and waits for the
    // first to finish there; unbound, it waits as well (no device is free) but then runs on
    // all eight as the others end together.
    std::vector<SpSimRequest> trace;
    for (uint64_t i = 1; i <= 9; ++i) trace.push_back(request(i, 0, 4096, 10, 1e9));
    const SpSimReport rep = run(trace, o);
    const double alone = 10 * flux().step_ms(4096, 1);
    for (size_t i = 0; i < 8; ++i) {
      CHECK(rep.requests[i].mean_degree == 1);
      CHECK(rep.requests[i].latency_ms == Approx(alone));
    }
    CHECK(rep.requests[8].latency_ms > alone);
    CHECK(rep.requests[8].mean_degree > 1);  // granted the devices the others left
    CHECK(rep.busy_device_ms <= 8 * rep.makespan_ms * (1 + 1e-9));
  }

  SECTION("a bound request with time to spare yields its device to an urgent one") {
    // Bound to devices 0 and 1: the first needs both at once, the second can wait for it and
    // still finish on its own device. Never yielding, each runs alone and the first is late.
    const double s1 = flux().step_ms(4096, 1), s2 = flux().step_ms(4096, 2);
    const std::vector<SpSimRequest> trace{request(1, 0, 4096, 10, 10 * s2 + 10),
                                          request(2, 0, 4096, 10, 10 * s2 + 2 * o.round_ms + 10 * s1 + 100)};
    o.devices = 2;
    o.plan_on_arrival = true;
    const SpSimReport stays = run(trace, o);
    CHECK_FALSE(stays.requests[0].deadline_met);
    CHECK(stays.requests[0].mean_degree == 1);
    CHECK(stays.requests[1].deadline_met);
    o.bound_may_yield = true;
    const SpSimReport yields = run(trace, o);
    CHECK(yields.slo_attainment == 1.0);
    CHECK(yields.requests[0].latency_ms == Approx(10 * s2));
    CHECK(yields.requests[0].mean_degree == 2);
    CHECK(yields.requests[1].latency_ms > 10 * s2);  // it waited for the first
    CHECK(yields.busy_device_ms <= 2 * yields.makespan_ms * (1 + 1e-9));
  }

  SECTION("late work on a device yields to work that can still be on time") {
    // Both bound to the one device: the first's deadline is earlier but already out of reach,
    // so the second, on time alone, runs first.
    const double s1 = flux().step_ms(4096, 1);
    const std::vector<SpSimRequest> trace{request(1, 0, 4096, 10, 100),
                                          request(2, 0, 4096, 10, 10 * s1 + 50)};
    o.devices = 1;
    const SpSimReport rep = run(trace, o);
    CHECK(rep.requests[1].deadline_met);
    CHECK(rep.requests[1].latency_ms == Approx(10 * s1));
    CHECK_FALSE(rep.requests[0].deadline_met);
    // Served after it, not dropped: from the first round once the second ended.
    CHECK(rep.requests[0].latency_ms >= 20 * s1);
    CHECK(rep.requests[0].latency_ms <= 20 * s1 + o.round_ms);
  }
}

TEST_CASE("a step whose planned devices are still in another's step waits for them or runs short of plan",
          "[serving][sp_simulator]") {
  {
    // Three devices, bound: a large slack request (home 0) and a one-step small one (home 1)
    // at t = 0, the slack one granted device 2 as well; at 140 ms an urgent large one arrives
    // (home 1), planned over devices its step needs while one of them is still in the slack
    // step. Stepping short of plan at once (alone) makes it late; waiting for that step's end
    // (a few ms) and then stepping as planned meets its deadline, as waiting always does here.
    const double deadline = 10 * flux().step_ms(16384, 2) + 300;
    const std::vector<SpSimRequest> three{request(1, 0, 16384, 10, 1e9), request(2, 0, 256, 1, 1e9),
                                          request(3, 140, 16384, 10, deadline)};
    SpSimOptions o;
    o.devices = 3;
    o.round_ms = 50;
    o.bind_to_home = true;
    o.plan_on_arrival = true;
    o.bound_may_yield = true;
    o.busy_devices = SpBusyDevices::kShortOfPlan;
    const SpSimReport short_now = run(three, o);
    CHECK(short_now.short_of_plan_steps >= 1);
    CHECK_FALSE(short_now.requests[2].deadline_met);
    o.busy_devices = SpBusyDevices::kWaitWhenSooner;
    const SpSimReport waits = run(three, o);
    CHECK(waits.short_of_plan_steps == 0);
    CHECK(waits.requests[2].deadline_met);
    CHECK(waits.requests[2].latency_ms < short_now.requests[2].latency_ms);
    o.busy_devices = SpBusyDevices::kWait;
    CHECK(run(three, o).requests[2].latency_ms == Approx(waits.requests[2].latency_ms));
  }
  // A Poisson trace of mixed sizes on eight devices at half load, bound as in the engine, under
  // each way of meeting busy planned devices: every request runs all its steps (a device a
  // short step left out is free again: before that was so, this trace never ended), no device
  // is booked twice, and only the ways that may step short do so.
  const int64_t sizes[] = {256, 1024, 4096, 16384};
  double mean_ms = 0;
  for (int64_t tokens : sizes) mean_ms += 0.25 * 28 * flux().step_ms(tokens, 1);
  std::mt19937_64 rng(1000);
  std::exponential_distribution<double> gap(0.5 * 8 / mean_ms);
  std::uniform_int_distribution<int> pick(0, 3);
  std::vector<SpSimRequest> trace;
  double t = 0;
  uint64_t steps = 0;
  for (uint64_t i = 0; i < 400; ++i) {
    t += gap(rng);
    const int64_t tokens = sizes[pick(rng)];
    trace.push_back(request(i, t, tokens, 28, 1.0 * 28 * flux().step_ms(tokens, 1)));
    steps += 28;
  }
  SpSimOptions o;
  o.round_ms = 100;
  o.bind_to_home = true;
  o.plan_on_arrival = true;
  o.bound_may_yield = true;
  std::map<SpBusyDevices, SpSimReport> reports;
  for (const SpBusyDevices busy : {SpBusyDevices::kWait, SpBusyDevices::kShortOfPlan, SpBusyDevices::kWaitWhenSooner}) {
    INFO("busy_devices " << static_cast<int>(busy));
    o.busy_devices = busy;
    const SpSimReport rep = run(trace, o);
    REQUIRE(rep.requests.size() == trace.size());
    uint64_t ran = 0;
    for (uint64_t n : rep.steps_by_degree) ran += n;
    CHECK(ran == steps);
    CHECK(rep.busy_device_ms <= 8 * rep.makespan_ms * (1 + 1e-9));
    reports[busy] = rep;
  }
  CHECK(reports[SpBusyDevices::kWait].short_of_plan_steps == 0);
  CHECK(reports[SpBusyDevices::kShortOfPlan].short_of_plan_steps > 0);
  // Waiting where it is sooner steps short less often than stepping short always.
  CHECK(reports[SpBusyDevices::kWaitWhenSooner].short_of_plan_steps < reports[SpBusyDevices::kShortOfPlan].short_of_plan_steps);
  o.busy_devices = static_cast<SpBusyDevices>(7);
  const Result<SpSimReport> bad = simulate_sequence_parallel(trace, flux().function(), o);
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("busy_devices is 7"));
}
