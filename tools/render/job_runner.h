#pragma once
/// Runs the selected items of a resolved job on a RenderBackend: skips outputs that are up to
/// date, keeps a window of edits in flight (so the engine batches them per step and edits on
/// one template share its prepared activation cache), writes each result atomically (temporary
/// file in the same folder, then rename) with its job hash in the PNG, and speaks the output
/// protocol (render_protocol.h). Stops at the first failed item, at the deadline, or when
/// stop() is called (a signal): in-flight edits are cancelled and no partial file is left.
///
/// Threading: run() on one thread; stop() from any thread (e.g. a signal-watching one).

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <vector>

#include "item_range.h"
#include "job_items.h"
#include "render_backend.h"
#include "render_protocol.h"

namespace infill::render {

struct RunOptions {
  ItemRange range;           ///< items to run (numbers from 1)
  bool force = false;        ///< redo outputs that are up to date
  int max_in_flight = 8;     ///< edits submitted to the backend at once
  bool use_cache = true;     ///< false: full recompute of every token (the baseline)
  /// Deadline of the whole run; nullopt = none.
  std::optional<std::chrono::steady_clock::time_point> deadline;
  double deadline_s = 0;     ///< only for messages
};

struct RunReport {
  int exit_code = 0;         ///< exit_codes.h; meaningless when `signal` is set
  int signal = 0;            ///< the signal that stopped the run, or 0
  int written = 0;
  int skipped = 0;
  double wall_ms = 0;
};

class JobRunner {
 public:
  JobRunner(RenderBackend& backend, RenderProtocol& protocol) : backend_(backend), protocol_(protocol) {}

  RunReport run(const std::vector<ResolvedItem>& items, const RunOptions& options);
  /// Asks run() to cancel everything and return with report.signal = `signal`. Safe from any
  /// thread; also before run() starts (run() then returns at once).
  void stop(int signal);

 private:
  struct Event {
    bool complete = false;
    uint64_t id = 0;
    int steps_done = 0, steps_total = 0;
    RenderOutcome outcome;
  };
  void push(Event e);

  RenderBackend& backend_;
  RenderProtocol& protocol_;
  std::mutex mu_;  // guards events_ and stop_signal_; never held while writing or submitting
  std::condition_variable cv_;
  std::deque<Event> events_;
  int stop_signal_ = 0;
};

/// Whether `path` holds an output stamped with `hash`.
bool output_up_to_date(const std::string& path, const std::string& hash);

/// Writes `bytes` to `path` atomically: `.<name>.partial-<pid>` in the same folder (created
/// when missing), then rename. On failure nothing is left behind.
Status write_atomically(const std::string& path, const std::vector<std::byte>& bytes);

}  // namespace infill::render
