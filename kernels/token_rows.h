#pragma once
/// Gather and scatter of token rows: the data movement of mask-aware computation.
/// All tensors are CPU float32 (or float16 where stated) with rows of `C` elements;
/// `index` is int64 [M] with values in [0, L). Multi-threaded over rows (at::parallel_for).

#include <ATen/core/Tensor.h>

namespace infill::kernels {

/// out[i, :] = src[index[i], :]. src [L, C] (row stride may exceed C), out [M, C] contiguous.
at::Tensor gather_rows(const at::Tensor& src, const at::Tensor& index);

/// dst[index[i], :] = rows[i, :]. dst [L, C] contiguous, rows [M, C] (row stride may exceed C).
/// Indices must be distinct (checked in debug builds).
void scatter_rows(at::Tensor& dst, const at::Tensor& index, const at::Tensor& rows);

}  // namespace infill::kernels
