#pragma once
/// The kernels' parallel loop: at::parallel_for on libtorch's OpenMP pool, so the kernels
/// share the threads that at::set_num_threads() sizes instead of competing with them.
///
/// at::parallel_for is a header template whose parallel branch exists only when the including
/// translation unit is compiled with OpenMP; infill_kernels is (kernels/CMakeLists.txt), and
/// this header refuses to compile otherwise rather than silently running serially.

#include <cstdint>

#include <ATen/Parallel.h>

#ifndef _OPENMP
#error "kernels/cpu/parallel.h needs OpenMP (link OpenMP::OpenMP_CXX): at::parallel_for would run serially"
#endif

namespace infill::kernels::cpu {

/// Calls `fn(chunk_begin, chunk_end)` over [begin, end) in chunks of at least `grain`;
/// runs inline for one chunk or inside a parallel region. An exception thrown by `fn` is
/// rethrown on the calling thread.
template <class F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& fn) {
  at::parallel_for(begin, end, grain, fn);
}

}  // namespace infill::kernels::cpu
