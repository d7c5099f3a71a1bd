// Masked attention on the GPU: one thread block per (query, head), online softmax over key
// tiles staged in shared memory. Simple rather than fast: it is the correctness baseline for
// a tuned kernel and the GPU path's fallback.
#include <cmath>
#include <cstdint>
#include <string>

#include "cuda_common.h"

namespace infill::kernels::cuda {
namespace {

constexpr int kThreads = 64;
constexpr int kMaxKeyTile = 64;
constexpr size_t kSharedBytes = 48 * 1024;  // available without opting in to more

// Shared memory: q [d] (scaled), acc [d], k tile [tile, d], v tile [tile, d], p [tile].
__global__ void attention_kernel(const float* q, const float* k, const float* v, float* out,
                                 int64_t keys, int heads, int d, float scale, int tile) {
  extern __shared__ float smem[];
  float* qs = smem;
  float* acc = qs + d;
  float* ks = acc + d;
  float* vs = ks + static_cast<int64_t>(tile) * d;
  float* ps = vs + static_cast<int64_t>(tile) * d;

  const int64_t query = blockIdx.x;
  const int head = blockIdx.y;
  const int64_t width = static_cast<int64_t>(heads) * d;
  const float* qrow = q + query * width + static_cast<int64_t>(head) * d;
  for (int c = threadIdx.x; c < d; c += blockDim.x) {
    qs[c] = qrow[c] * scale;
    acc[c] = 0.0f;
  }
  float m_run = -INFINITY;
  float l_run = 0.0f;
  __syncthreads();

  for (int64_t k0 = 0; k0 < keys; k0 += tile) {
    const int n = static_cast<int>(keys - k0 < tile ? keys - k0 : tile);
    for (int i = threadIdx.x; i < n * d; i += blockDim.x) {
      const int j = i / d;
      const int c = i % d;
      const int64_t at = (k0 + j) * width + static_cast<int64_t>(head) * d + c;
      ks[i] = k[at];
      vs[i] = v[at];
    }
    __syncthreads();
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
      float s = 0.0f;
      for (int c = 0; c < d; ++c) s += qs[c] * ks[j * d + c];
      ps[j] = s;
    }
    __syncthreads();
    // Every thread derives the same max and sum from shared memory, in the same order.
    float tile_max = -INFINITY;
    for (int j = 0; j < n; ++j) tile_max = fmaxf(tile_max, ps[j]);
    const float m_new = fmaxf(m_run, tile_max);
    const float alpha = m_run == -INFINITY ? 0.0f : expf(m_run - m_new);
    __syncthreads();  // all maxima are read before scores become probabilities
    for (int j = threadIdx.x; j < n; j += blockDim.x) ps[j] = expf(ps[j] - m_new);
    __syncthreads();
    float sum = 0.0f;
    for (int j = 0; j < n; ++j) sum += ps[j];
    l_run = l_run * alpha + sum;
    m_run = m_new;
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
      float a = acc[c] * alpha;
      for (int j = 0; j < n; ++j) a += ps[j] * vs[j * d + c];
      acc[c] = a;
    }
    __syncthreads();  // the next tile overwrites ks, vs and ps
  }

  const float inv = 1.0f / l_run;
  float* orow = out + query * width + static_cast<int64_t>(head) * d;
  for (int c = threadIdx.x; c < d; c += blockDim.x) orow[c] = acc[c] * inv;
}

}  // namespace
}  // namespace infill::kernels::cuda

extern "C" int infill_cuda_masked_attention(const float* q, int64_t q_row_stride, const float* k,
                                            int64_t k_row_stride, const float* v,
                                            int64_t v_row_stride, int64_t m, int64_t l,
                                            int64_t heads, int64_t head_dim, float scale,
                                            float* out) {
  namespace kc = infill::kernels::cuda;
  using kc::DeviceBuffer;
  using kc::fail;
  try {
    const int64_t width = heads * head_dim;
    if (m < 0 || l < 1 || heads < 1 || head_dim < 1 || heads > 65535 || m > 2147483647 ||
        q_row_stride < width || k_row_stride < width || v_row_stride < width) {
      return fail(INFILL_CUDA_ERR_INVALID_ARGUMENT,
                  "masked_attention: expected m >= 0, l >= 1, 1 <= heads <= 65535, head_dim >= 1 "
                  "and row strides >= heads * head_dim, got m " +
                      std::to_string(m) + ", l " + std::to_string(l) + ", heads " +
                      std::to_string(heads) + ", head_dim " + std::to_string(head_dim));
    }
    // Largest key tile whose shared memory fits the default 48 KiB.
    const int64_t per_key = 2 * head_dim + 1;
    const int64_t budget = static_cast<int64_t>(kc::kSharedBytes / sizeof(float)) - 2 * head_dim;
    const int64_t tile = budget / per_key < kc::kMaxKeyTile ? budget / per_key : kc::kMaxKeyTile;
    if (tile < 1) {
      return fail(INFILL_CUDA_ERR_INVALID_ARGUMENT,
                  "masked_attention: head_dim " + std::to_string(head_dim) +
                      " is too large for one key tile in 48 KiB of shared memory");
    }
    if (m == 0) return INFILL_CUDA_OK;

    const size_t row = static_cast<size_t>(width) * sizeof(float);
    DeviceBuffer d_q, d_k, d_v, d_out;
    INFILL_CUDA_TRY(d_q.allocate(row * static_cast<size_t>(m)), "cudaMalloc(q)");
    INFILL_CUDA_TRY(d_k.allocate(row * static_cast<size_t>(l)), "cudaMalloc(k)");
    INFILL_CUDA_TRY(d_v.allocate(row * static_cast<size_t>(l)), "cudaMalloc(v)");
    INFILL_CUDA_TRY(d_out.allocate(row * static_cast<size_t>(m)), "cudaMalloc(out)");
    INFILL_CUDA_TRY(
        cudaMemcpy2D(d_q.as<void>(), row, q, static_cast<size_t>(q_row_stride) * sizeof(float), row,
                     static_cast<size_t>(m), cudaMemcpyHostToDevice),
        "cudaMemcpy2D(q)");
    INFILL_CUDA_TRY(
        cudaMemcpy2D(d_k.as<void>(), row, k, static_cast<size_t>(k_row_stride) * sizeof(float), row,
                     static_cast<size_t>(l), cudaMemcpyHostToDevice),
        "cudaMemcpy2D(k)");
    INFILL_CUDA_TRY(
        cudaMemcpy2D(d_v.as<void>(), row, v, static_cast<size_t>(v_row_stride) * sizeof(float), row,
                     static_cast<size_t>(l), cudaMemcpyHostToDevice),
        "cudaMemcpy2D(v)");
    const size_t shared = static_cast<size_t>(2 * head_dim + tile * per_key) * sizeof(float);
    const dim3 grid(static_cast<unsigned>(m), static_cast<unsigned>(heads));
    kc::attention_kernel<<<grid, kc::kThreads, shared>>>(
        d_q.as<float>(), d_k.as<float>(), d_v.as<float>(), d_out.as<float>(), l,
        static_cast<int>(heads), static_cast<int>(head_dim), scale, static_cast<int>(tile));
    INFILL_CUDA_TRY(cudaGetLastError(), "attention_kernel launch");
    INFILL_CUDA_TRY(
        cudaMemcpy(out, d_out.as<void>(), row * static_cast<size_t>(m), cudaMemcpyDeviceToHost),
        "cudaMemcpy(out)");
    return INFILL_CUDA_OK;
  } catch (const std::exception& e) {
    return fail(INFILL_CUDA_ERR_RUNTIME, std::string("masked_attention: ") + e.what());
  }
}
