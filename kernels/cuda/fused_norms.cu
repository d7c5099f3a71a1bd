// FLUX.2's row-wise normalisations, each one kernel (issue 39 item 3). A masked step on a GPU
// computes ~100-1000 rows, where libtorch's composition of a QK RMSNorm + RoPE (pow, mean, add,
// rsqrt, two multiplies, then the pair rotation's slices, four multiplies, two adds and a stack)
// is a dozen launches of tiny kernels per head group, and a LayerNorm + modulation three: the
// step is bound by launches, not by the GPU. Here each is one launch that reads its rows once.
//
// Rounding follows upstream FLUX.2 (flux2/src/flux2/math.py and modules): the RMSNorm computes
// in float32 and stores x * rrms in the compute type before multiplying by the scale (stored
// again); RoPE rotates in float32 and stores once. LayerNorm computes in float32 (as
// torch.nn.LayerNorm in bf16 does) and stores, the modulation then computes in float32 and
// stores once.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/fused_norms_launch.h"

namespace infill::kernels::cuda {
namespace {

template <class T>
__device__ __forceinline__ float to_float(T v);
template <>
__device__ __forceinline__ float to_float(float v) {
  return v;
}
template <>
__device__ __forceinline__ float to_float(__half v) {
  return __half2float(v);
}
template <>
__device__ __forceinline__ float to_float(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <class T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_float(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float(float v) {
  return __float2bfloat16_rn(v);
}

// v as a separate operation storing T would leave it.
template <class T>
__device__ __forceinline__ float stored(float v) {
  return to_float(from_float<T>(v));
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// The sum of every thread's v over the block (blockDim.x a multiple of 32, at most 1024),
// returned to all threads. `partial` holds 32 floats; the leading barrier lets a second call
// reuse it.
__device__ float block_sum(float v, float* partial) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  float total = lane < warps ? partial[lane] : 0.0f;
  return warp_sum(total);
}

constexpr int kWarpsPerNormBlock = 4;

// One warp per (row, head): the sum of squares over the head's channels, then each lane
// normalises and rotates its channel pairs (2p, 2p + 1).
template <class T, class Table>
__global__ void rms_norm_rope_kernel(const T* __restrict__ x, int64_t x_row_stride,
                                     const T* __restrict__ scale, const Table* __restrict__ cos,
                                     const Table* __restrict__ sin, int64_t table_row_stride,
                                     T* __restrict__ out, int64_t out_row_stride, int64_t rows,
                                     int heads, int head_dim, float eps) {
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarpsPerNormBlock + threadIdx.x / 32;
  if (item >= rows * heads) return;  // the whole warp: `item` is the same for its lanes
  const int lane = threadIdx.x % 32;
  const int64_t row = item / heads;
  const int head = static_cast<int>(item % heads);
  const T* xh = x + row * x_row_stride + static_cast<int64_t>(head) * head_dim;
  T* oh = out + row * out_row_stride + static_cast<int64_t>(head) * head_dim;
  float squares = 0.0f;
  for (int c = lane; c < head_dim; c += 32) {
    const float v = to_float(xh[c]);
    squares += v * v;
  }
  const float rrms = rsqrtf(warp_sum(squares) / static_cast<float>(head_dim) + eps);
  const Table* c_row = cos + row * table_row_stride;
  const Table* s_row = sin + row * table_row_stride;
  for (int p = lane; p < head_dim / 2; p += 32) {
    const float n0 = stored<T>(stored<T>(to_float(xh[2 * p]) * rrms) * to_float(scale[2 * p]));
    const float n1 =
        stored<T>(stored<T>(to_float(xh[2 * p + 1]) * rrms) * to_float(scale[2 * p + 1]));
    const float c = to_float(c_row[p]), s = to_float(s_row[p]);
    oh[2 * p] = from_float<T>(c * n0 - s * n1);
    oh[2 * p + 1] = from_float<T>(s * n0 + c * n1);
  }
}

// One block per row: mean, then variance about it (two passes over the row, which stays in
// L1/L2: more exact than E[x^2] - E[x]^2 for rows far from zero mean), then the normalised,
// modulated row.
template <class T>
__global__ void layer_norm_modulate_kernel(const T* x, int64_t x_row_stride,
                                           const T* __restrict__ shift, const T* __restrict__ scale,
                                           T* out, int64_t out_row_stride, int width, float eps) {
  __shared__ float partial[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * x_row_stride;
  T* orow = out + row * out_row_stride;
  float sum = 0.0f;
  for (int c = threadIdx.x; c < width; c += blockDim.x) sum += to_float(xr[c]);
  const float mean = block_sum(sum, partial) / static_cast<float>(width);
  float deviations = 0.0f;
  for (int c = threadIdx.x; c < width; c += blockDim.x) {
    const float d = to_float(xr[c]) - mean;
    deviations += d * d;
  }
  const float rstd = rsqrtf(block_sum(deviations, partial) / static_cast<float>(width) + eps);
  // Each thread reads and writes only its own channels after both reductions: out may be x.
  for (int c = threadIdx.x; c < width; c += blockDim.x) {
    const float normed = stored<T>((to_float(xr[c]) - mean) * rstd);
    orow[c] = from_float<T>(normed * (1.0f + to_float(scale[c])) + to_float(shift[c]));
  }
}

template <class T>
cudaError_t rms_norm_rope(const void* x, int64_t x_row_stride, const void* scale, const void* cos,
                          const void* sin, bool float_tables, int64_t table_row_stride, void* out,
                          int64_t out_row_stride, int64_t rows, int heads, int head_dim, float eps,
                          cudaStream_t stream) {
  const int64_t items = rows * heads;
  const unsigned blocks =
      static_cast<unsigned>((items + kWarpsPerNormBlock - 1) / kWarpsPerNormBlock);
  const unsigned threads = kWarpsPerNormBlock * 32;
  if (float_tables) {
    rms_norm_rope_kernel<T, float><<<blocks, threads, 0, stream>>>(
        static_cast<const T*>(x), x_row_stride, static_cast<const T*>(scale),
        static_cast<const float*>(cos), static_cast<const float*>(sin), table_row_stride,
        static_cast<T*>(out), out_row_stride, rows, heads, head_dim, eps);
  } else {
    rms_norm_rope_kernel<T, T><<<blocks, threads, 0, stream>>>(
        static_cast<const T*>(x), x_row_stride, static_cast<const T*>(scale),
        static_cast<const T*>(cos), static_cast<const T*>(sin), table_row_stride,
        static_cast<T*>(out), out_row_stride, rows, heads, head_dim, eps);
  }
  return cudaGetLastError();
}

template <class T>
cudaError_t layer_norm_modulate(const void* x, int64_t x_row_stride, const void* shift,
                                const void* scale, void* out, int64_t out_row_stride, int64_t rows,
                                int width, float eps, cudaStream_t stream) {
  // A thread per 8 channels up to 1024 threads (FLUX.2's 3072 and 4096: 384 and 512 threads).
  int threads = ((width + 7) / 8 + 31) / 32 * 32;
  threads = threads < 32 ? 32 : threads > 1024 ? 1024 : threads;
  layer_norm_modulate_kernel<T><<<static_cast<unsigned>(rows), threads, 0, stream>>>(
      static_cast<const T*>(x), x_row_stride, static_cast<const T*>(shift),
      static_cast<const T*>(scale), static_cast<T*>(out), out_row_stride, width, eps);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_rms_norm_rope(RowType type, const void* x, int64_t x_row_stride,
                                 const void* scale, const void* cos, const void* sin,
                                 bool float_tables, int64_t table_row_stride, void* out,
                                 int64_t out_row_stride, int64_t rows, int heads, int head_dim,
                                 float eps, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  switch (type) {
    case RowType::kFloat:
      return rms_norm_rope<float>(x, x_row_stride, scale, cos, sin, float_tables, table_row_stride,
                                  out, out_row_stride, rows, heads, head_dim, eps, stream);
    case RowType::kHalf:
      return rms_norm_rope<__half>(x, x_row_stride, scale, cos, sin, float_tables, table_row_stride,
                                   out, out_row_stride, rows, heads, head_dim, eps, stream);
    case RowType::kBFloat16:
      return rms_norm_rope<__nv_bfloat16>(x, x_row_stride, scale, cos, sin, float_tables,
                                          table_row_stride, out, out_row_stride, rows, heads,
                                          head_dim, eps, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_layer_norm_modulate(RowType type, const void* x, int64_t x_row_stride,
                                       const void* shift, const void* scale, void* out,
                                       int64_t out_row_stride, int64_t rows, int width, float eps,
                                       cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  switch (type) {
    case RowType::kFloat:
      return layer_norm_modulate<float>(x, x_row_stride, shift, scale, out, out_row_stride, rows,
                                        width, eps, stream);
    case RowType::kHalf:
      return layer_norm_modulate<__half>(x, x_row_stride, shift, scale, out, out_row_stride, rows,
                                         width, eps, stream);
    case RowType::kBFloat16:
      return layer_norm_modulate<__nv_bfloat16>(x, x_row_stride, shift, scale, out, out_row_stride,
                                                rows, width, eps, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace infill::kernels::cuda
