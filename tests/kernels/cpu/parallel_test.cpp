#include "support/catch.h"
#include "kernels/cpu/parallel.h"


#include <atomic>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include <ATen/Parallel.h>

namespace {

// Restores the intra-op thread count a test changed.
class ThreadCountGuard {
 public:
  explicit ThreadCountGuard(int threads) : saved_(at::get_num_threads()) {
    at::set_num_threads(threads);
  }
  ~ThreadCountGuard() { at::set_num_threads(saved_); }

 private:
  int saved_;
};

}  // namespace

TEST_CASE("cpu::parallel_for visits every index once on several threads", "[kernels][parallel]") {
  ThreadCountGuard guard(2);
  std::vector<std::atomic<int>> visits(1000);
  std::mutex mutex;
  std::set<std::thread::id> threads;
  infill::kernels::cpu::parallel_for(0, 1000, 1, [&](int64_t begin, int64_t end) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      threads.insert(std::this_thread::get_id());
    }
    for (int64_t i = begin; i < end; ++i) visits[static_cast<size_t>(i)]++;
  });
  for (const auto& v : visits) REQUIRE(v.load() == 1);
  // Without OpenMP in the including target, at::parallel_for silently runs on one thread.
  REQUIRE(threads.size() == 2);
}

TEST_CASE("cpu::parallel_for stays on the caller for small ranges and nested calls",
          "[kernels][parallel]") {
  ThreadCountGuard guard(2);
  const auto caller = std::this_thread::get_id();
  bool same_thread = true;
  infill::kernels::cpu::parallel_for(0, 10, 100, [&](int64_t, int64_t) {
    same_thread = same_thread && std::this_thread::get_id() == caller;
  });
  REQUIRE(same_thread);

  std::atomic<int> inner_calls{0};
  std::atomic<int> inner_elements{0};
  infill::kernels::cpu::parallel_for(0, 2, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      infill::kernels::cpu::parallel_for(0, 100, 1, [&](int64_t b, int64_t e) {
        inner_calls++;
        inner_elements += static_cast<int>(e - b);
      });
    }
  });
  REQUIRE(inner_elements.load() == 200);
  REQUIRE(inner_calls.load() == 2);  // inside a parallel region each inner loop runs inline
}

TEST_CASE("cpu::parallel_for rethrows a worker's exception on the caller", "[kernels][parallel]") {
  ThreadCountGuard guard(2);
  REQUIRE_THROWS_AS(infill::kernels::cpu::parallel_for(0, 100, 1,
                                                       [](int64_t begin, int64_t) {
                                                         if (begin > 0) {
                                                           throw std::runtime_error("worker");
                                                         }
                                                       }),
                    std::runtime_error);
}
