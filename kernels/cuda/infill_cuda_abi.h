#pragma once
/* C ABI of libinfill_kernels_cuda.so, the CUDA kernel library that kernels/cuda_kernels.cpp
 * loads with dlopen. Plain C types only, so the library and its loader share no C++ ABI.
 *
 * All data pointers are HOST pointers: each call copies its inputs to the device, runs the
 * kernel, copies the result back and frees its device memory (the engine's libtorch is
 * CPU-only, so there are no device tensors to hand over). Calls are synchronous and may be
 * made from any thread. Functions return 0 on success or a negative INFILL_CUDA_ERR_* code;
 * infill_cuda_last_error() then describes the failure for the calling thread. */

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define INFILL_CUDA_ABI_VERSION 1

#define INFILL_CUDA_OK 0
#define INFILL_CUDA_ERR_INVALID_ARGUMENT (-1)
#define INFILL_CUDA_ERR_RUNTIME (-2)

/* INFILL_CUDA_ABI_VERSION of the library. */
int infill_cuda_abi_version(void);

/* Number of CUDA devices (>= 0), or a negative code when the runtime cannot answer (no
 * driver, ...). When at least one device exists and name != NULL, writes device 0's name,
 * NUL-terminated and truncated to name_len bytes. */
int infill_cuda_device_count(char* name, int name_len);

/* Message of the calling thread's last failure ("" if none). Owned by the library; valid
 * until the thread's next call. */
const char* infill_cuda_last_error(void);

/* out[i] = src[index[i]] for rows of row_bytes bytes. src holds src_rows rows, row i at
 * src + i * src_row_stride_bytes; index has m entries in [0, src_rows); out is m * row_bytes
 * bytes, rows packed. */
int infill_cuda_gather_rows(const void* src, int64_t src_rows, int64_t src_row_stride_bytes,
                            int64_t row_bytes, const int64_t* index, int64_t m, void* out);

/* dst[index[i]] = rows[i] for rows of row_bytes bytes; index entries must be distinct and in
 * [0, dst_rows). dst row i at dst + i * dst_row_stride_bytes, rows row i at
 * rows + i * rows_row_stride_bytes. */
int infill_cuda_scatter_rows(void* dst, int64_t dst_rows, int64_t dst_row_stride_bytes,
                             int64_t row_bytes, const int64_t* index, int64_t m, const void* rows,
                             int64_t rows_row_stride_bytes);

/* out = softmax(q k^T * scale) v per head. q [m, heads * head_dim] with row stride
 * q_row_stride floats, k and v [l, heads * head_dim] with their row strides, out
 * [m, heads * head_dim] packed. l >= 1. */
int infill_cuda_masked_attention(const float* q, int64_t q_row_stride, const float* k,
                                 int64_t k_row_stride, const float* v, int64_t v_row_stride,
                                 int64_t m, int64_t l, int64_t heads, int64_t head_dim, float scale,
                                 float* out);

#ifdef __cplusplus
}
#endif
