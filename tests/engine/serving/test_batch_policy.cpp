#include "support/catch.h"

#include "serving/batch_policy.h"

using namespace infill;

namespace {

SchedCandidate cand(uint64_t id, int64_t tokens, int steps_left, double deadline = 1e9) {
  SchedCandidate c;
  c.id = id;
  c.tokens = tokens;
  c.steps_left = steps_left;
  c.min_steps_left = steps_left;
  c.deadline_ms = deadline;
  return c;
}

double flat_ms(int64_t, int) { return 1.0; }

}  // namespace

TEST_CASE("batching policy names round-trip", "[serving][batch_policy]") {
  for (auto p : {BatchingPolicy::kStatic, BatchingPolicy::kContinuous, BatchingPolicy::kDeadline}) {
    auto parsed = parse_batching_policy(batching_policy_name(p));
    REQUIRE(parsed.ok());
    CHECK(*parsed == p);
  }
  auto bad = parse_batching_policy("fifo");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("'fifo'") != std::string::npos);
}

TEST_CASE("static batching runs a batch to completion before admitting arrivals", "[serving][batch_policy]") {
  BatchSelector s(BatchingPolicy::kStatic, 100);
  auto d = s.select({cand(1, 30, 2), cand(2, 30, 2)}, 0, flat_ms);
  CHECK(d.advance == std::vector<uint64_t>{1, 2});
  // 3 arrives; the batch {1, 2} still has a step: 3 waits.
  d = s.select({cand(1, 30, 1), cand(2, 30, 1), cand(3, 10, 2)}, 1, flat_ms);
  CHECK(d.advance == std::vector<uint64_t>{1, 2});
  // 1 and 2 left: a new batch is formed.
  d = s.select({cand(3, 10, 2)}, 2, flat_ms);
  CHECK(d.advance == std::vector<uint64_t>{3});
}

TEST_CASE("continuous batching admits at every boundary in FCFS order within the budget", "[serving][batch_policy]") {
  BatchSelector s(BatchingPolicy::kContinuous, 100);
  auto d = s.select({cand(1, 60, 3)}, 0, flat_ms);
  CHECK(d.advance == std::vector<uint64_t>{1});
  // 2 fits beside 1; 3 would exceed the budget and blocks 4 behind it (strict FCFS).
  d = s.select({cand(1, 60, 2), cand(2, 30, 2), cand(3, 50, 2), cand(4, 5, 2)}, 1, flat_ms);
  CHECK(d.advance == std::vector<uint64_t>{1, 2});
  // 1 finished: 3 and 4 join.
  d = s.select({cand(2, 30, 1), cand(3, 50, 2), cand(4, 5, 2)}, 2, flat_ms);
  CHECK(d.advance == std::vector<uint64_t>{2, 3, 4});
}

TEST_CASE("an oversized request runs alone rather than never", "[serving][batch_policy]") {
  for (auto p : {BatchingPolicy::kStatic, BatchingPolicy::kContinuous, BatchingPolicy::kDeadline}) {
    BatchSelector s(p, 10);
    auto d = s.select({cand(7, 50, 2)}, 0, flat_ms);
    CHECK(d.advance == std::vector<uint64_t>{7});
  }
}

TEST_CASE("the deadline policy is schedule_step", "[serving][batch_policy]") {
  BatchSelector s(BatchingPolicy::kDeadline, 50);
  std::vector<SchedCandidate> cs = {cand(1, 30, 4, 100), cand(2, 30, 1, 1.5), cand(3, 10, 4, 100)};
  const auto step = std::function<double(int64_t, int)>(flat_ms);
  const SchedDecision a = s.select(cs, 0, step);
  const SchedDecision b = schedule_step(cs, 50, 0, step, SchedulerOptions{});
  CHECK(a.advance == b.advance);
  // 2 is urgent (one step left, due in 1.5 ms) and goes first.
  REQUIRE_FALSE(a.advance.empty());
  CHECK(a.advance.front() == 2);
}
