#include "support/catch.h"

#include "serving/request_state.h"

using namespace infill;

TEST_CASE("request classes carry their default deadline and step floor", "[serving][request]") {
  CHECK(default_deadline_ms(RequestClass::kLive) == 800.0);
  CHECK(default_deadline_ms(RequestClass::kInteractive) == 5000.0);
  CHECK(default_deadline_ms(RequestClass::kBatch) == 600000.0);
  CHECK(min_step_fraction(RequestClass::kLive) == 0.5);
  CHECK(min_step_fraction(RequestClass::kInteractive) == 0.75);
  CHECK(min_step_fraction(RequestClass::kBatch) == 1.0);
  // Hand-computed ceilings: 0.5*7=3.5->4, 0.75*8=6 exactly, 0.75*9=6.75->7, batch never cut.
  CHECK(min_steps_allowed(RequestClass::kLive, 7) == 4);
  CHECK(min_steps_allowed(RequestClass::kInteractive, 8) == 6);
  CHECK(min_steps_allowed(RequestClass::kInteractive, 9) == 7);
  CHECK(min_steps_allowed(RequestClass::kBatch, 30) == 30);
  CHECK(min_steps_allowed(RequestClass::kLive, 1) == 1);
}

TEST_CASE("class and state names round-trip and unknown names are rejected",
          "[serving][request]") {
  for (RequestClass c : {RequestClass::kLive, RequestClass::kInteractive, RequestClass::kBatch}) {
    auto parsed = parse_request_class(request_class_name(c));
    REQUIRE(parsed.ok());
    CHECK(*parsed == c);
  }
  for (int s = 1; s <= 7; ++s) {
    const auto state = static_cast<RequestState>(s);
    auto parsed = parse_request_state(request_state_name(state));
    REQUIRE(parsed.ok());
    CHECK(*parsed == state);
  }
  auto bad = parse_request_class("urgent");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("urgent") != std::string::npos);
  CHECK_FALSE(parse_request_state("Running").ok());
}

TEST_CASE("terminal states are exactly done, failed, cancelled, expired", "[serving][request]") {
  CHECK_FALSE(is_terminal(RequestState::kQueued));
  CHECK_FALSE(is_terminal(RequestState::kPreparing));
  CHECK_FALSE(is_terminal(RequestState::kRunning));
  CHECK(is_terminal(RequestState::kDone));
  CHECK(is_terminal(RequestState::kFailed));
  CHECK(is_terminal(RequestState::kCancelled));
  CHECK(is_terminal(RequestState::kExpired));
}

TEST_CASE("the happy path records every transition with its time", "[serving][request]") {
  RequestLifecycle life(10.0);
  CHECK(life.state() == RequestState::kQueued);
  REQUIRE(life.transition(RequestState::kPreparing, 12.0).ok());
  REQUIRE(life.transition(RequestState::kRunning, 15.5).ok());
  REQUIRE(life.transition(RequestState::kDone, 40.0).ok());
  CHECK(life.terminal());
  REQUIRE(life.history().size() == 4);
  CHECK(life.history()[0].state == RequestState::kQueued);
  CHECK(life.history()[0].time_ms == 10.0);
  CHECK(life.history()[2].state == RequestState::kRunning);
  CHECK(life.history()[2].time_ms == 15.5);
  CHECK(life.entered_ms(RequestState::kDone) == 40.0);
  CHECK_FALSE(life.entered_ms(RequestState::kFailed).has_value());
}

TEST_CASE("illegal transitions are refused and leave the lifecycle unchanged",
          "[serving][request]") {
  RequestLifecycle life(0.0);
  CHECK_FALSE(life.transition(RequestState::kRunning, 1.0).ok());  // skips preparing
  CHECK_FALSE(life.transition(RequestState::kDone, 1.0).ok());
  CHECK_FALSE(life.transition(RequestState::kQueued, 1.0).ok());
  CHECK(life.state() == RequestState::kQueued);
  CHECK(life.history().size() == 1);

  REQUIRE(life.transition(RequestState::kPreparing, 5.0).ok());
  Status back = life.transition(RequestState::kRunning, 4.0);  // time goes backwards
  CHECK(back.code() == ErrorCode::kInvalidArgument);
  CHECK(life.state() == RequestState::kPreparing);
}

TEST_CASE("any live state may fail, be cancelled or expire", "[serving][request]") {
  for (RequestState end : {RequestState::kFailed, RequestState::kCancelled, RequestState::kExpired}) {
    RequestLifecycle queued(0.0);
    CHECK(queued.transition(end, 1.0).ok());
    RequestLifecycle running(0.0);
    REQUIRE(running.transition(RequestState::kPreparing, 1.0).ok());
    REQUIRE(running.transition(RequestState::kRunning, 2.0).ok());
    CHECK(running.transition(end, 3.0).ok());
    CHECK(running.state() == end);
  }
}

TEST_CASE("a second terminal transition is an error naming both states", "[serving][request]") {
  RequestLifecycle life(0.0);
  REQUIRE(life.transition(RequestState::kPreparing, 1.0).ok());
  REQUIRE(life.transition(RequestState::kRunning, 2.0).ok());
  REQUIRE(life.transition(RequestState::kDone, 3.0).ok());
  Status again = life.transition(RequestState::kCancelled, 4.0);
  REQUIRE_FALSE(again.ok());
  CHECK(again.message().find("done") != std::string::npos);
  CHECK(again.message().find("cancelled") != std::string::npos);
  CHECK(life.state() == RequestState::kDone);
  CHECK(life.history().size() == 4);
}
