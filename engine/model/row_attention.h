#pragma once
/// Softmax attention over token rows on whichever device the rows live: the engine's fused
/// CPU kernel for float32 on the CPU, libtorch's scaled-dot-product attention (flash or
/// memory-efficient kernels) on a CUDA device, plain matmul-softmax-matmul elsewhere.
/// Shared by every model family so that each picks the same kernel for the same device.

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace infill {

/// q [M, heads * d] attends to k, v [L, heads * d] (same device and dtype as q; rows may be
/// strided) -> [M, heads * d] in q's dtype, on q's device. kernels::masked_attention_reference
/// (plain ATen ops, any device and dtype) is the baseline it is checked and measured against.
at::Tensor row_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t heads,
                         double scale);

}  // namespace infill
