#include "serving/task_pool.h"

#include <algorithm>

#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

namespace infill {

TaskPool::TaskPool(int threads, int compute_threads) {
  for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this, compute_threads] { run(compute_threads); });
}

TaskPool::~TaskPool() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void TaskPool::post(std::function<void()> task) {
  {
    std::lock_guard lock(mu_);
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
}

void TaskPool::wait_idle() {
  std::unique_lock lock(mu_);
  idle_cv_.wait(lock, [&] { return queue_.empty() && running_ == 0; });
}

size_t TaskPool::pending() const {
  std::lock_guard lock(mu_);
  return queue_.size() + running_;
}

size_t TaskPool::uncaught() const {
  std::lock_guard lock(mu_);
  return uncaught_;
}

void TaskPool::run(int compute_threads) {
  // The OpenMP thread count is per calling thread, so this limits only the pool's threads.
  at::set_num_threads(std::max(1, compute_threads));
  c10::InferenceMode guard;
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and drained
      task = std::move(queue_.front());
      queue_.pop_front();
      ++running_;
    }
    bool threw = false;
    try {
      task();
    } catch (...) {
      threw = true;
    }
    task = nullptr;  // release captures before reporting idle
    {
      std::lock_guard lock(mu_);
      --running_;
      uncaught_ += threw;
      if (queue_.empty() && running_ == 0) idle_cv_.notify_all();
    }
  }
}

}  // namespace infill
