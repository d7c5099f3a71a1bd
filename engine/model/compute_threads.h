#pragma once
/// Sets the number of threads libtorch and our kernels compute with.
///
/// Debian's libtorch defaults to hardware_concurrency() / 2 (it assumes hyper-threads), which
/// on a 2-core machine without SMT halves the speed, so every binary calls this at start-up.

namespace infill {

/// `threads` <= 0 means one per hardware thread. Returns the number in effect.
int set_compute_threads(int threads);

}  // namespace infill
