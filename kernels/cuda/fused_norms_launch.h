#pragma once
/// Launchers of the fused row norms (kernels/cuda/fused_norms.cu) on plain pointers, so that
/// nvcc compiles the kernels without libtorch's headers and the wrapper that checks tensors
/// (kernels/fused_norms.cpp) is ordinary C++. Each launch is asynchronous on `stream` and
/// returns the launch's error (cudaSuccess, or why it could not start). Strides are in
/// elements; every row's channels are contiguous. CUDA builds only.

#include <cstdint>

#include <cuda_runtime_api.h>

namespace infill::kernels::cuda {

/// The element types the kernels are instantiated for.
enum class RowType { kFloat, kHalf, kBFloat16 };

/// out [rows, heads * head_dim] = RoPE(RMSNorm(x) * scale) per head: x's and out's rows at their
/// row strides (out must not overlap x), scale [head_dim], cos and sin [rows, head_dim / 2] at
/// table_row_stride, of x's type or float32 (`float_tables`: upstream keeps its RoPE tables in
/// float32).
cudaError_t launch_rms_norm_rope(RowType type, const void* x, int64_t x_row_stride,
                                 const void* scale, const void* cos, const void* sin,
                                 bool float_tables, int64_t table_row_stride, void* out,
                                 int64_t out_row_stride, int64_t rows, int heads, int head_dim,
                                 float eps, cudaStream_t stream);

/// out's rows = LayerNorm(x's rows) * (1 + scale) + shift: x and out [rows, width] at their row
/// strides (out may be x), shift and scale [width].
cudaError_t launch_layer_norm_modulate(RowType type, const void* x, int64_t x_row_stride,
                                       const void* shift, const void* scale, void* out,
                                       int64_t out_row_stride, int64_t rows, int width, float eps,
                                       cudaStream_t stream);

}  // namespace infill::kernels::cuda
