#pragma once
/// at::parallel_for semantics on libtorch's own OpenMP thread pool.
///
/// at::parallel_for is a header template whose parallel branch only exists when the including
/// translation unit is compiled with -fopenmp; our targets are not (TORCH_CXX_FLAGS carries
/// only the ABI define), so there it silently runs serially. This helper forwards to
/// at::parallel_for when _OPENMP is defined and otherwise enters libtorch's libgomp directly
/// (GOMP_parallel, resolved at run time), so the kernels share the pool that
/// at::set_num_threads() sizes instead of competing with it. Without libgomp it runs serially.

#include <cstdint>

#include <ATen/Parallel.h>

namespace infill::kernels::cpu {

/// Calls `fn(chunk_begin, chunk_end)` over [begin, end) split into one contiguous chunk per
/// thread, using at most at::get_num_threads() threads and no more than (end - begin) / grain
/// (rounded up); runs inline when that is one thread or when already inside a parallel region.
/// The first exception thrown by `fn` is rethrown on the calling thread.
void parallel_for_erased(int64_t begin, int64_t end, int64_t grain,
                         void (*call)(const void* fn, int64_t chunk_begin, int64_t chunk_end),
                         const void* fn);

template <class F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& fn) {
#ifdef _OPENMP
  at::parallel_for(begin, end, grain, fn);
#else
  parallel_for_erased(
      begin, end, grain,
      [](const void* f, int64_t b, int64_t e) { (*static_cast<const F*>(f))(b, e); }, &fn);
#endif
}

}  // namespace infill::kernels::cpu
