#pragma once
/// Gather and scatter of token rows: the data movement of mask-aware computation.
/// Tensors are CPU float32 or float16 (copied as bytes) with rows of `C` contiguous elements
/// (stride(1) == 1; the row stride may exceed C, e.g. a column slice of a wider tensor);
/// `index` is a contiguous int64 [M] with values in [0, L). Multi-threaded over rows on
/// libtorch's intra-op pool (sized by at::set_num_threads); small copies stay on the calling
/// thread. Violations of these preconditions are programming errors and throw c10::Error
/// before anything is written.

#include <ATen/core/Tensor.h>

namespace infill::kernels {

/// out[i, :] = src[index[i], :]. src [L, C] (row stride may exceed C), out [M, C] contiguous.
/// Repeated indices are allowed.
at::Tensor gather_rows(const at::Tensor& src, const at::Tensor& index);

/// dst[index[i], :] = rows[i, :]. dst [L, C] and rows [M, C] (either row stride may exceed C),
/// same dtype. Indices must be distinct (checked in debug builds).
void scatter_rows(at::Tensor& dst, const at::Tensor& index, const at::Tensor& rows);

}  // namespace infill::kernels
