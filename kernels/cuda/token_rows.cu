// Gather / scatter of token rows on the GPU (host pointers in and out, see infill_cuda_abi.h).
#include <cstdint>
#include <string>
#include <vector>

#include "cuda_common.h"

namespace infill::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// One block per listed row; T is the copy unit (4-byte words when every row and stride is
// word-aligned, else bytes).
template <class T>
__global__ void gather_kernel(const T* src, int64_t row_units, const int64_t* index, T* out) {
  const int64_t i = blockIdx.x;
  const T* from = src + index[i] * row_units;
  T* to = out + i * row_units;
  for (int64_t u = threadIdx.x; u < row_units; u += blockDim.x) to[u] = from[u];
}

template <class T>
__global__ void scatter_kernel(T* dst, int64_t row_units, const int64_t* index, const T* rows) {
  const int64_t i = blockIdx.x;
  const T* from = rows + i * row_units;
  T* to = dst + index[i] * row_units;
  for (int64_t u = threadIdx.x; u < row_units; u += blockDim.x) to[u] = from[u];
}

int check_index(const int64_t* index, int64_t m, int64_t rows, const char* rows_name) {
  for (int64_t i = 0; i < m; ++i) {
    if (index[i] < 0 || index[i] >= rows) {
      return fail(INFILL_CUDA_ERR_INVALID_ARGUMENT, "index[" + std::to_string(i) +
                                                        "] = " + std::to_string(index[i]) +
                                                        " is outside [0, " + std::to_string(rows) +
                                                        ") (the rows of " + rows_name + ")");
    }
  }
  return INFILL_CUDA_OK;
}

int check_shape(int64_t rows, int64_t stride_bytes, int64_t row_bytes, int64_t m,
                const char* name) {
  if (rows < 0 || m < 0 || row_bytes < 0 || stride_bytes < row_bytes) {
    return fail(INFILL_CUDA_ERR_INVALID_ARGUMENT,
                std::string(name) +
                    ": expected rows, m, row_bytes >= 0 and a row stride of at "
                    "least row_bytes, got rows " +
                    std::to_string(rows) + ", stride " + std::to_string(stride_bytes) +
                    ", row_bytes " + std::to_string(row_bytes) + ", m " + std::to_string(m));
  }
  return INFILL_CUDA_OK;
}

}  // namespace
}  // namespace infill::kernels::cuda

using infill::kernels::cuda::DeviceBuffer;
using infill::kernels::cuda::fail;

extern "C" int infill_cuda_gather_rows(const void* src, int64_t src_rows,
                                       int64_t src_row_stride_bytes, int64_t row_bytes,
                                       const int64_t* index, int64_t m, void* out) {
  namespace kc = infill::kernels::cuda;
  try {
    if (const int rc = kc::check_shape(src_rows, src_row_stride_bytes, row_bytes, m, "src"))
      return rc;
    if (const int rc = kc::check_index(index, m, src_rows, "src")) return rc;
    if (m == 0 || row_bytes == 0) return INFILL_CUDA_OK;
    const size_t row = static_cast<size_t>(row_bytes);
    DeviceBuffer d_src, d_index, d_out;
    INFILL_CUDA_TRY(d_src.allocate(row * static_cast<size_t>(src_rows)), "cudaMalloc(src)");
    INFILL_CUDA_TRY(d_index.allocate(sizeof(int64_t) * static_cast<size_t>(m)),
                    "cudaMalloc(index)");
    INFILL_CUDA_TRY(d_out.allocate(row * static_cast<size_t>(m)), "cudaMalloc(out)");
    INFILL_CUDA_TRY(
        cudaMemcpy2D(d_src.as<void>(), row, src, static_cast<size_t>(src_row_stride_bytes), row,
                     static_cast<size_t>(src_rows), cudaMemcpyHostToDevice),
        "cudaMemcpy2D(src)");
    INFILL_CUDA_TRY(cudaMemcpy(d_index.as<void>(), index, sizeof(int64_t) * static_cast<size_t>(m),
                               cudaMemcpyHostToDevice),
                    "cudaMemcpy(index)");
    // Device buffers are packed, so word copies only need row_bytes to be a multiple of 4.
    if (row_bytes % 4 == 0) {
      kc::gather_kernel<uint32_t><<<static_cast<unsigned>(m), kc::kThreads>>>(
          d_src.as<uint32_t>(), row_bytes / 4, d_index.as<int64_t>(), d_out.as<uint32_t>());
    } else {
      kc::gather_kernel<uint8_t><<<static_cast<unsigned>(m), kc::kThreads>>>(
          d_src.as<uint8_t>(), row_bytes, d_index.as<int64_t>(), d_out.as<uint8_t>());
    }
    INFILL_CUDA_TRY(cudaGetLastError(), "gather_kernel launch");
    INFILL_CUDA_TRY(
        cudaMemcpy(out, d_out.as<void>(), row * static_cast<size_t>(m), cudaMemcpyDeviceToHost),
        "cudaMemcpy(out)");
    return INFILL_CUDA_OK;
  } catch (const std::exception& e) {
    return fail(INFILL_CUDA_ERR_RUNTIME, std::string("gather_rows: ") + e.what());
  }
}

extern "C" int infill_cuda_scatter_rows(void* dst, int64_t dst_rows, int64_t dst_row_stride_bytes,
                                        int64_t row_bytes, const int64_t* index, int64_t m,
                                        const void* rows, int64_t rows_row_stride_bytes) {
  namespace kc = infill::kernels::cuda;
  try {
    if (const int rc = kc::check_shape(dst_rows, dst_row_stride_bytes, row_bytes, m, "dst"))
      return rc;
    if (const int rc = kc::check_shape(m, rows_row_stride_bytes, row_bytes, m, "rows")) return rc;
    if (const int rc = kc::check_index(index, m, dst_rows, "dst")) return rc;
    {
      std::vector<char> seen(static_cast<size_t>(dst_rows), 0);
      for (int64_t i = 0; i < m; ++i) {
        if (seen[static_cast<size_t>(index[i])]++) {
          return fail(INFILL_CUDA_ERR_INVALID_ARGUMENT,
                      "index must be distinct, " + std::to_string(index[i]) + " appears twice");
        }
      }
    }
    if (m == 0 || row_bytes == 0) return INFILL_CUDA_OK;
    const size_t row = static_cast<size_t>(row_bytes);
    DeviceBuffer d_dst, d_index, d_rows;
    INFILL_CUDA_TRY(d_dst.allocate(row * static_cast<size_t>(dst_rows)), "cudaMalloc(dst)");
    INFILL_CUDA_TRY(d_index.allocate(sizeof(int64_t) * static_cast<size_t>(m)),
                    "cudaMalloc(index)");
    INFILL_CUDA_TRY(d_rows.allocate(row * static_cast<size_t>(m)), "cudaMalloc(rows)");
    INFILL_CUDA_TRY(
        cudaMemcpy2D(d_dst.as<void>(), row, dst, static_cast<size_t>(dst_row_stride_bytes), row,
                     static_cast<size_t>(dst_rows), cudaMemcpyHostToDevice),
        "cudaMemcpy2D(dst)");
    INFILL_CUDA_TRY(
        cudaMemcpy2D(d_rows.as<void>(), row, rows, static_cast<size_t>(rows_row_stride_bytes), row,
                     static_cast<size_t>(m), cudaMemcpyHostToDevice),
        "cudaMemcpy2D(rows)");
    INFILL_CUDA_TRY(cudaMemcpy(d_index.as<void>(), index, sizeof(int64_t) * static_cast<size_t>(m),
                               cudaMemcpyHostToDevice),
                    "cudaMemcpy(index)");
    if (row_bytes % 4 == 0) {
      kc::scatter_kernel<uint32_t><<<static_cast<unsigned>(m), kc::kThreads>>>(
          d_dst.as<uint32_t>(), row_bytes / 4, d_index.as<int64_t>(), d_rows.as<uint32_t>());
    } else {
      kc::scatter_kernel<uint8_t><<<static_cast<unsigned>(m), kc::kThreads>>>(
          d_dst.as<uint8_t>(), row_bytes, d_index.as<int64_t>(), d_rows.as<uint8_t>());
    }
    INFILL_CUDA_TRY(cudaGetLastError(), "scatter_kernel launch");
    INFILL_CUDA_TRY(cudaMemcpy2D(dst, static_cast<size_t>(dst_row_stride_bytes), d_dst.as<void>(),
                                 row, row, static_cast<size_t>(dst_rows), cudaMemcpyDeviceToHost),
                    "cudaMemcpy2D(dst back)");
    return INFILL_CUDA_OK;
  } catch (const std::exception& e) {
    return fail(INFILL_CUDA_ERR_RUNTIME, std::string("scatter_rows: ") + e.what());
  }
}
