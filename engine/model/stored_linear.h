#pragma once
/// y = x W^T for a weight kept in its stored dtype (bf16 / fp16) while x computes in another
/// (float32 on the CPU), without materialising a converted copy of the model.
///
/// Few rows (a mask-aware step: tens to hundreds of masked tokens): W is converted in chunks
/// of output rows small enough to stay in cache and each chunk is multiplied at once, on
/// libtorch's intra-op threads; converting the whole layer first would write and read its
/// float copy through memory (about 1.4 GB per klein 4B block), several times the GEMM's
/// own cost. Many rows (a full step): the layer is converted once into a per-thread scratch
/// buffer reused across calls (no allocation, no page faults) and multiplied in one GEMM.
/// Same dtype: a plain at::linear. Results equal at::linear(x, W.to(x.dtype())) up to the
/// GEMM's summation order.

#include <ATen/core/Tensor.h>

namespace infill {

/// x [M, in] or [in] (any dtype W converts to), w [out, in] -> [M, out] or [out] in x's dtype.
at::Tensor stored_linear(const at::Tensor& x, const at::Tensor& w);

}  // namespace infill
