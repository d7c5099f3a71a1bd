// The router's affinities for an engine with several devices: template locality (the worker
// that last took a template's entry keeps its edits unless another is cheaper by more than
// what getting the entry costs), live clients staying on one worker, both giving way when
// their worker leaves service; the per-worker request cost; and the bounded memory.
#include "support/catch.h"

#include <string>
#include <vector>

#include "serving/router.h"

using namespace infill;

namespace {

RouteQuery query(const std::string& entry, double miss_ms = 0.0, double request_ms = 10.0) {
  RouteQuery q;
  q.request_ms = request_ms;
  q.entry_key = entry;
  q.entry_miss_ms = miss_ms;
  return q;
}

RouteQuery live(uint64_t client, const std::string& entry = "") {
  RouteQuery q = query(entry);
  q.live_client = client;
  return q;
}

}  // namespace

TEST_CASE("route reasons have names", "[serving][router]") {
  CHECK(std::string(route_reason_name(RouteReason::kLeastLoaded)) == "least_loaded");
  CHECK(std::string(route_reason_name(RouteReason::kTemplateLocality)) == "template_locality");
  CHECK(std::string(route_reason_name(RouteReason::kLiveClient)) == "live_client");
}

TEST_CASE(
    "an edit goes to the worker holding its template entry unless another is cheaper by more than "
    "the miss",
    "[serving][router][devices]") {
  Router router(RoutingPolicy::kMaskAware);
  const std::vector<WorkerLoad> idle = {{0, 0.0}, {0, 0.0}};
  // Template A: nobody holds it; the tie goes to worker 0, which now holds it.
  RouteDecision a = router.route(idle, query("A"));
  CHECK(a.worker == 0);
  CHECK(a.reason == RouteReason::kLeastLoaded);
  CHECK(a.locality_missed_worker == -1);
  // Template B while worker 0 is busy: worker 1 takes it.
  const std::vector<WorkerLoad> busy0 = {{1, 300.0}, {0, 0.0}};
  CHECK(router.route(busy0, query("B")).worker == 1);
  CHECK(router.holder_of("B") == size_t{1});
  // Idle again: B's edits stay on worker 1 although ties would pick worker 0; A's on worker 0.
  for (int i = 0; i < 3; ++i) {
    const RouteDecision b = router.route(idle, query("B"));
    CHECK(b.worker == 1);
    CHECK(b.reason == RouteReason::kTemplateLocality);
    const RouteDecision again = router.route(idle, query("A"));
    CHECK(again.worker == 0);
    CHECK(again.reason == RouteReason::kTemplateLocality);
  }
  // The holder is busier by 50 ms, getting the entry elsewhere costs 100: the holder.
  const std::vector<WorkerLoad> busy1 = {{0, 0.0}, {1, 50.0}};
  CHECK(router.route(busy1, query("B", 100.0)).worker == 1);
  // Getting it costs 10: worker 0 is cheaper; B's holder is worker 0 from now on.
  const RouteDecision moved = router.route(busy1, query("B", 10.0));
  CHECK(moved.worker == 0);
  CHECK(moved.reason == RouteReason::kLeastLoaded);
  CHECK(moved.locality_missed_worker == 1);
  CHECK(router.holder_of("B") == size_t{0});
  // Without an entry key: no locality, no memory.
  const RouteDecision none = router.route(busy1, query(""));
  CHECK(none.worker == 0);
  CHECK(none.reason == RouteReason::kLeastLoaded);
}

TEST_CASE("a holder out of service is passed over and counted as a locality miss",
          "[serving][router][devices]") {
  Router router(RoutingPolicy::kMaskAware);
  const std::vector<WorkerLoad> busy0 = {{1, 300.0}, {0, 0.0}};
  REQUIRE(router.route(busy0, query("B")).worker == 1);
  std::vector<WorkerLoad> lost = {{1, 300.0}, {0, 0.0}};
  lost[1].in_service = false;
  const RouteDecision d = router.route(lost, query("B", 1e9));
  CHECK(d.worker == 0);
  CHECK(d.reason == RouteReason::kLeastLoaded);
  CHECK(d.locality_missed_worker == 1);
}

TEST_CASE("a live client's edits stay on one worker until it leaves service",
          "[serving][router][devices]") {
  Router router(RoutingPolicy::kMaskAware);
  const std::vector<WorkerLoad> busy0 = {{2, 500.0}, {0, 0.0}};
  REQUIRE(router.route(busy0, live(7)).worker == 1);
  CHECK(router.worker_of_live_client(7) == size_t{1});
  // Worker 1 now far busier, and the template held by worker 0: the client stays.
  const std::vector<WorkerLoad> idle = {{0, 0.0}, {0, 0.0}};
  REQUIRE(router.route(idle, query("T")).worker == 0);
  const std::vector<WorkerLoad> busy1 = {{0, 0.0}, {5, 900.0}};
  const RouteDecision d = router.route(busy1, live(7, "T"));
  CHECK(d.worker == 1);
  CHECK(d.reason == RouteReason::kLiveClient);
  CHECK(d.locality_missed_worker == 0);
  // Another live client and a non-live edit of the same client id route by load.
  CHECK(router.route(busy1, live(8)).worker == 0);
  CHECK(router.route(busy1, query("")).worker == 0);
  // Worker 1 leaves service: the client moves, and stays where it moved.
  std::vector<WorkerLoad> lost = {{3, 400.0}, {0, 0.0}};
  lost[1].in_service = false;
  const RouteDecision moved = router.route(lost, live(7));
  CHECK(moved.worker == 0);
  CHECK(moved.reason == RouteReason::kLeastLoaded);
  const std::vector<WorkerLoad> back = {{3, 400.0}, {0, 0.0}};
  CHECK(router.route(back, live(7)).worker == 0);
}

TEST_CASE("least-requests weighs locality in ties only, round-robin ignores it",
          "[serving][router][devices]") {
  const std::vector<WorkerLoad> one_on_0 = {{1, 0.0}, {0, 0.0}}, idle = {{0, 0.0}, {0, 0.0}},
                                one_on_1 = {{0, 0.0}, {1, 0.0}};
  Router least(RoutingPolicy::kLeastRequests);
  REQUIRE(least.route(one_on_0, query("A")).worker == 1);
  CHECK(least.route(idle, query("A")).worker == 1);
  CHECK(least.route(one_on_1, query("A")).worker == 0);
  Router rr(RoutingPolicy::kRoundRobin);
  CHECK(rr.route(idle, query("A")).worker == 0);
  const RouteDecision next = rr.route(idle, query("A"));
  CHECK(next.worker == 1);
  CHECK(next.reason == RouteReason::kLeastLoaded);
}

TEST_CASE("mask-aware routing charges the request on each worker's own cost model",
          "[serving][router][devices]") {
  Router router(RoutingPolicy::kMaskAware);
  const std::vector<WorkerLoad> loads = {{0, 0.0}, {0, 20.0}};
  const std::vector<double> slow_then_fast = {100.0, 30.0};  // worker 1's device is faster
  RouteQuery q = query("");
  q.request_ms_by_worker = slow_then_fast;
  CHECK(router.route(loads, q).worker == 1);
  CHECK(router.choose(loads, 10.0) == 0);  // one cost for all: the emptier worker
}

TEST_CASE("the router remembers a bounded number of entries and live clients",
          "[serving][router][devices]") {
  Router router(RoutingPolicy::kMaskAware);
  const std::vector<WorkerLoad> busy0 = {{1, 300.0}, {0, 0.0}};
  REQUIRE(router.route(busy0, query("first")).worker == 1);
  REQUIRE(router.route(busy0, live(1)).worker == 1);
  const std::vector<WorkerLoad> idle = {{0, 0.0}, {0, 0.0}};
  for (size_t i = 0; i < Router::kRemembered; ++i) {
    RouteQuery q = query("entry" + std::to_string(i));
    q.live_client = 100 + i;
    (void)router.route(idle, q);
  }
  CHECK_FALSE(router.holder_of("first").has_value());
  CHECK_FALSE(router.worker_of_live_client(1).has_value());
  CHECK(router.holder_of("entry" + std::to_string(Router::kRemembered - 1)).has_value());
}
