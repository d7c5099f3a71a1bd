#pragma once
/// Request classes and the lifecycle of one serving request (queued -> preparing -> running ->
/// done | failed | cancelled | expired), every transition timestamped.
///
/// Pure value types: no locks. A RequestLifecycle is owned by whichever thread owns the request.

#include <optional>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace infill {

/// Service class of a request; decides its default deadline and how far the scheduler may cut
/// its step count under overload. Values never change and 0 is not a real class.
enum class RequestClass { kLive = 1, kInteractive = 2, kBatch = 3 };

/// Deadline applied when a request gives none: live 800 ms, interactive 5 s, batch 10 min.
double default_deadline_ms(RequestClass cls);
/// Smallest fraction of the requested denoising steps the scheduler may run under overload:
/// live 0.5, interactive 0.75, batch 1.0 (never reduced).
double min_step_fraction(RequestClass cls);
/// Smallest step count allowed for `requested_steps` in `cls` (ceil of fraction * steps, >= 1).
int min_steps_allowed(RequestClass cls, int requested_steps);
/// SchedCandidate::min_steps_left of a request that already ran `steps_run` steps, has
/// `steps_left` planned and may not end below `min_steps_total` (min_steps_allowed) in all:
/// never below 1, never above what is planned.
int min_steps_left(int min_steps_total, int steps_run, int steps_left);
/// "live", "interactive", "batch".
const char* request_class_name(RequestClass cls);
/// Inverse of request_class_name; error names the offending text.
Result<RequestClass> parse_request_class(std::string_view name);

enum class RequestState {
  kQueued = 1,
  kPreparing,
  kRunning,
  kDone,
  kFailed,
  kCancelled,
  kExpired,
};

/// done, failed, cancelled and expired are final.
bool is_terminal(RequestState state);
/// "queued", "preparing", "running", "done", "failed", "cancelled", "expired".
const char* request_state_name(RequestState state);
/// Inverse of request_state_name; error names the offending text.
Result<RequestState> parse_request_state(std::string_view name);

/// Current state plus the timestamped history of one request. Times are milliseconds on the
/// caller's monotonic clock (e.g. steady_clock since server start) and must not go backwards.
class RequestLifecycle {
 public:
  struct Entry {
    RequestState state;
    double time_ms;
  };

  /// Starts in kQueued at `created_ms`.
  explicit RequestLifecycle(double created_ms = 0.0);

  /// Moves to `to` at `time_ms`. Legal: queued -> preparing, preparing -> running,
  /// running -> done, and any non-terminal state -> failed | cancelled | expired.
  /// Terminal states are final; illegal moves and times before the last entry are errors
  /// and leave the lifecycle unchanged.
  Status transition(RequestState to, double time_ms);

  RequestState state() const { return history_.back().state; }
  bool terminal() const { return is_terminal(state()); }
  /// Every state entered, oldest first; history().front() is the kQueued entry.
  const std::vector<Entry>& history() const { return history_; }
  /// When `state` was entered, if it ever was.
  std::optional<double> entered_ms(RequestState state) const;

 private:
  std::vector<Entry> history_;
};

}  // namespace infill
