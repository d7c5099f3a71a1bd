#include "support/catch.h"

#include "serving/router.h"

using namespace infill;

namespace {

StepCostModel linear_cost() {
  // ms = 2 + 0.1 * tokens + 0.5 * batch + 0.001 * attention, fitted exactly.
  std::vector<StepSample> s;
  for (double t : {10.0, 50.0, 200.0})
    for (double b : {1.0, 2.0, 4.0})
      for (double a : {1000.0, 9000.0}) s.push_back({t, b, a, 2 + 0.1 * t + 0.5 * b + 0.001 * a});
  auto m = StepCostModel::fit(s);
  REQUIRE(m.ok());
  return *m;
}

}  // namespace

TEST_CASE("routing policy names round-trip", "[serving][router]") {
  for (auto p : {RoutingPolicy::kRoundRobin, RoutingPolicy::kLeastRequests, RoutingPolicy::kMaskAware}) {
    auto parsed = parse_routing_policy(routing_policy_name(p));
    REQUIRE(parsed.ok());
    CHECK(*parsed == p);
  }
  CHECK_FALSE(parse_routing_policy("random").ok());
}

TEST_CASE("request work and drain time follow the cost model", "[serving][router]") {
  const StepCostModel m = linear_cost();
  // 10 steps of 20 tokens on a 100-token grid: 10 * (0.1 * 20 + 0.5 + 0.001 * 2000) = 45.
  CHECK(request_work_ms(m, 20, 100, 10) == Approx(45.0).margin(1e-6));
  // The intercept is paid once per step of the longest request.
  CHECK(drain_ms(m, 45.0, 10) == Approx(65.0).margin(1e-6));
}

TEST_CASE("each routing policy picks its worker", "[serving][router]") {
  const std::vector<WorkerLoad> loads = {{3, 100.0}, {1, 500.0}, {2, 50.0}};
  Router rr(RoutingPolicy::kRoundRobin);
  CHECK(rr.choose(loads, 10) == 0);
  CHECK(rr.choose(loads, 10) == 1);
  CHECK(rr.choose(loads, 10) == 2);
  CHECK(rr.choose(loads, 10) == 0);
  Router least(RoutingPolicy::kLeastRequests);
  CHECK(least.choose(loads, 10) == 1);
  Router mask(RoutingPolicy::kMaskAware);
  // Fewest requests is not the least loaded: worker 1 holds one huge request.
  CHECK(mask.choose(loads, 10) == 2);
}
