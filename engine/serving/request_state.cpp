#include "serving/request_state.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace infill {

double default_deadline_ms(RequestClass cls) {
  switch (cls) {
    case RequestClass::kLive: return 800.0;
    case RequestClass::kInteractive: return 5000.0;
    case RequestClass::kBatch: return 600000.0;
  }
  return 600000.0;
}

double min_step_fraction(RequestClass cls) {
  switch (cls) {
    case RequestClass::kLive: return 0.5;
    case RequestClass::kInteractive: return 0.75;
    case RequestClass::kBatch: return 1.0;
  }
  return 1.0;
}

int min_steps_allowed(RequestClass cls, int requested_steps) {
  if (requested_steps <= 1) return requested_steps < 0 ? 0 : requested_steps;
  // The small epsilon keeps 0.75 * 8 = 6 from rounding up to 7 through float noise.
  const int steps = static_cast<int>(std::ceil(min_step_fraction(cls) * requested_steps - 1e-9));
  return steps < 1 ? 1 : steps;
}

int min_steps_left(int min_steps_total, int steps_run, int steps_left) {
  return std::clamp(min_steps_total - steps_run, 1, std::max(1, steps_left));
}

const char* request_class_name(RequestClass cls) {
  switch (cls) {
    case RequestClass::kLive: return "live";
    case RequestClass::kInteractive: return "interactive";
    case RequestClass::kBatch: return "batch";
  }
  return "unknown";
}

Result<RequestClass> parse_request_class(std::string_view name) {
  for (RequestClass c : {RequestClass::kLive, RequestClass::kInteractive, RequestClass::kBatch}) {
    if (name == request_class_name(c)) return c;
  }
  return invalid_argument("request class '" + std::string(name) +
                          "' is unknown, expected live, interactive or batch");
}

bool is_terminal(RequestState state) {
  return state == RequestState::kDone || state == RequestState::kFailed ||
         state == RequestState::kCancelled || state == RequestState::kExpired;
}

const char* request_state_name(RequestState state) {
  switch (state) {
    case RequestState::kQueued: return "queued";
    case RequestState::kPreparing: return "preparing";
    case RequestState::kRunning: return "running";
    case RequestState::kDone: return "done";
    case RequestState::kFailed: return "failed";
    case RequestState::kCancelled: return "cancelled";
    case RequestState::kExpired: return "expired";
  }
  return "unknown";
}

Result<RequestState> parse_request_state(std::string_view name) {
  for (RequestState s : {RequestState::kQueued, RequestState::kPreparing, RequestState::kRunning,
                         RequestState::kDone, RequestState::kFailed, RequestState::kCancelled,
                         RequestState::kExpired}) {
    if (name == request_state_name(s)) return s;
  }
  return invalid_argument("request state '" + std::string(name) +
                          "' is unknown, expected queued, preparing, running, done, failed, "
                          "cancelled or expired");
}

RequestLifecycle::RequestLifecycle(double created_ms) {
  history_.push_back({RequestState::kQueued, created_ms});
}

Status RequestLifecycle::transition(RequestState to, double time_ms) {
  const RequestState from = state();
  const std::string move = std::string(request_state_name(from)) + " -> " + request_state_name(to);
  if (is_terminal(from)) {
    return invalid_argument("request transition " + move + " is illegal: " +
                            request_state_name(from) + " is terminal");
  }
  bool legal = false;
  switch (to) {
    case RequestState::kQueued: legal = false; break;
    case RequestState::kPreparing: legal = from == RequestState::kQueued; break;
    case RequestState::kRunning: legal = from == RequestState::kPreparing; break;
    case RequestState::kDone: legal = from == RequestState::kRunning; break;
    case RequestState::kFailed:
    case RequestState::kCancelled:
    case RequestState::kExpired: legal = true; break;
  }
  if (!legal) return invalid_argument("request transition " + move + " is illegal");
  if (!(time_ms >= history_.back().time_ms)) {
    return invalid_argument("request transition " + move + " at " + std::to_string(time_ms) +
                            " ms is before the previous transition at " +
                            std::to_string(history_.back().time_ms) + " ms");
  }
  history_.push_back({to, time_ms});
  return Status::success();
}

std::optional<double> RequestLifecycle::entered_ms(RequestState state) const {
  for (const Entry& e : history_) {
    if (e.state == state) return e.time_ms;
  }
  return std::nullopt;
}

}  // namespace infill
