#include "kernels/cpu/parallel.h"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <exception>

namespace infill::kernels::cpu {
namespace {

using GompParallelFn = void (*)(void (*)(void*), void*, unsigned, unsigned);
using OmpIntFn = int (*)();

struct Gomp {
  GompParallelFn parallel = nullptr;
  OmpIntFn thread_num = nullptr;
  OmpIntFn num_threads = nullptr;
};

// libtorch_cpu links libgomp, so its symbols are in the process once libtorch is loaded.
const Gomp& gomp() {
  static const Gomp g = [] {
    Gomp r;
    r.parallel = reinterpret_cast<GompParallelFn>(dlsym(RTLD_DEFAULT, "GOMP_parallel"));
    r.thread_num = reinterpret_cast<OmpIntFn>(dlsym(RTLD_DEFAULT, "omp_get_thread_num"));
    r.num_threads = reinterpret_cast<OmpIntFn>(dlsym(RTLD_DEFAULT, "omp_get_num_threads"));
    if (!r.parallel || !r.thread_num || !r.num_threads) r = Gomp{};
    return r;
  }();
  return g;
}

struct Job {
  int64_t begin;
  int64_t end;
  int64_t threads;
  void (*call)(const void*, int64_t, int64_t);
  const void* fn;
  std::atomic_flag failed = ATOMIC_FLAG_INIT;
  std::exception_ptr error;
};

void run_chunk(void* data) {
  auto& job = *static_cast<Job*>(data);
  const int64_t threads = std::min<int64_t>(job.threads, gomp().num_threads());
  const int64_t tid = gomp().thread_num();
  const int64_t chunk = (job.end - job.begin + threads - 1) / threads;
  const int64_t b = job.begin + tid * chunk;
  if (b >= job.end) return;
  try {
    at::internal::ThreadIdGuard guard(static_cast<int>(tid));
    job.call(job.fn, b, std::min(job.end, b + chunk));
  } catch (...) {
    if (!job.failed.test_and_set()) job.error = std::current_exception();
  }
}

}  // namespace

void parallel_for_erased(int64_t begin, int64_t end, int64_t grain,
                         void (*call)(const void*, int64_t, int64_t), const void* fn) {
  if (begin >= end) return;
  at::internal::lazy_init_num_threads();
  const int64_t range = end - begin;
  int64_t threads = at::get_num_threads();
  if (grain > 0) threads = std::min(threads, (range + grain - 1) / grain);
  if (threads <= 1 || range <= 1 || at::in_parallel_region() || !gomp().parallel) {
    call(fn, begin, end);
    return;
  }
  Job job{begin, end, threads, call, fn};
  gomp().parallel(&run_chunk, &job, static_cast<unsigned>(threads), 0);
  if (job.error) std::rethrow_exception(job.error);
}

}  // namespace infill::kernels::cpu
