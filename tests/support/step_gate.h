#pragma once
// Holds a serving worker before one of its steps until the test opens the gate: how a test
// says "while the edit is running" without guessing how fast a step is on a busy machine.
//
//   StepGate gate(1);                        // the first batched step runs, the second waits
//   ServerFixture f(true, test_limits(), false, gate.hook());
//   auto opener = gate.open_on_exit();       // declared after the fixture: opens first
//   ... submit; REQUIRE(gate.wait_held(60000)); ... gate.open();
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>

namespace infill::test {

class StepGate {
 public:
  /// Lets `free_steps` batched steps through, then holds every later one until open().
  explicit StepGate(int free_steps) : state_(std::make_shared<State>()) { state_->free_steps = free_steps; }

  /// The worker's before_step hook; it shares the gate's state, so it may outlive the gate.
  std::function<void(std::span<const uint64_t>)> hook() const {
    return [state = state_](std::span<const uint64_t>) {
      std::unique_lock lock(state->mu);
      if (state->free_steps > 0) {
        --state->free_steps;
        return;
      }
      state->held = true;
      state->cv.notify_all();
      state->cv.wait(lock, [&] { return state->open; });
    };
  }

  /// True once the worker waits at the gate (false after `timeout_ms`).
  bool wait_held(int timeout_ms) const {
    std::unique_lock lock(state_->mu);
    return state_->cv.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return state_->held; });
  }

  /// Lets every step through from now on.
  void open() const {
    std::lock_guard lock(state_->mu);
    state_->open = true;
    state_->cv.notify_all();
  }

  /// Opens the gate when it goes out of scope, so that a failed REQUIRE never leaves a worker
  /// held while its engine shuts down.
  struct Opener {
    const StepGate* gate;
    ~Opener() { gate->open(); }
  };
  Opener open_on_exit() const { return Opener{this}; }

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    int free_steps = 0;
    bool held = false;
    bool open = false;
  };
  std::shared_ptr<State> state_;
};

}  // namespace infill::test
