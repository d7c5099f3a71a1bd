#pragma once
/// SIGTERM / SIGINT for infill-render: taken synchronously on a thread of their own (never in
/// an async handler), turned into a call that stops the job runner; once the runner has
/// cancelled its edits and removed partial files, the process dies by the same signal, so a
/// farm manager sees the status it expects from a killed task.

#include <atomic>
#include <functional>
#include <mutex>
#include <thread>

namespace infill::render {

class SignalWatcher {
 public:
  /// Blocks SIGTERM and SIGINT in the calling thread, and so in every thread it creates
  /// afterwards: construct it before any other thread starts.
  SignalWatcher();
  /// Stops watching; the signals stay blocked.
  ~SignalWatcher();
  SignalWatcher(const SignalWatcher&) = delete;
  SignalWatcher& operator=(const SignalWatcher&) = delete;

  /// Called (on the watcher's thread) with the first signal; at once if one already came.
  void on_signal(std::function<void(int)> handler);
  /// The first signal received, or 0.
  int received() const { return received_.load(); }

 private:
  void loop();
  std::atomic<int> received_{0};
  std::atomic<bool> stop_{false};
  std::mutex mu_;  // guards handler_
  std::function<void(int)> handler_;
  std::thread thread_;
};

/// Ends the process by `signal` with its default action (unblocked, then raised). Never returns.
[[noreturn]] void die_by_signal(int signal);

}  // namespace infill::render
