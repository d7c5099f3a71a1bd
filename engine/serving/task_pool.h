#pragma once
/// A small pool of threads for pre- and post-processing (decode, encode, mask, composite, PNG)
/// so that none of it runs on a worker's step loop.
///
/// Threading: post() may be called from any thread. Tasks run on the pool's threads in FIFO
/// order; a task that throws is caught and counted (tasks are expected to report errors as
/// values). The destructor runs every queued task, then joins.

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace infill {

class TaskPool {
 public:
  /// `threads` >= 1. `compute_threads` is the libtorch intra-op thread count each pool thread
  /// uses (1 keeps pre/post-processing from competing with the step loops for every core).
  explicit TaskPool(int threads, int compute_threads = 1);
  ~TaskPool();
  TaskPool(const TaskPool&) = delete;
  TaskPool& operator=(const TaskPool&) = delete;

  void post(std::function<void()> task);
  /// Blocks until the queue is empty and no task is running.
  void wait_idle();
  /// Tasks queued or running.
  size_t pending() const;
  /// Tasks that escaped with an exception (a bug in the task; each is also swallowed).
  size_t uncaught() const;

 private:
  void run(int compute_threads);

  mutable std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::function<void()>> queue_;
  size_t running_ = 0;
  size_t uncaught_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace infill
