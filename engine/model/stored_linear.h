#pragma once
/// y = x W^T for a weight kept in its stored dtype (bf16 / fp16) while x computes in another
/// (float32 on the CPU), without holding a converted copy of the model.
///
/// The layer is converted into a scratch buffer that belongs to the calling thread and is
/// reused by every later call (it grows to the largest layer: 340 MB for klein 4B's widest),
/// then multiplied in one GEMM. Converting with a fresh allocation each time (W.to(float))
/// cost more than the GEMM of a mask-aware step: the kernel zero-fills every new page of a
/// large allocation, about 15 GB per klein 4B forward. Converting in cache-sized chunks and
/// multiplying each at once was measured too, and was slower than this at every row count
/// from 49 to 400 (OpenBLAS, 2 cores: the narrow GEMMs run below speed).
/// Same dtype, or a device other than the CPU: a plain at::linear.

#include <ATen/core/Tensor.h>

namespace infill {

/// x [M, in] or [in] (any dtype W converts to), w [out, in] -> [M, out] or [out] in x's dtype.
/// Results equal at::linear(x, W.to(x.dtype())).
at::Tensor stored_linear(const at::Tensor& x, const at::Tensor& w);

}  // namespace infill
