#pragma once
// Host-side helpers shared by the .cu files: per-thread error message, an owning device
// buffer and CUDA-error checking that turns failures into INFILL_CUDA_ERR_RUNTIME.

#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "infill_cuda_abi.h"

namespace infill::kernels::cuda {

/// Records `message` as the calling thread's last error and returns `code`.
int fail(int code, const std::string& message);

/// Records the CUDA error of `what` (when err != cudaSuccess) and returns
/// INFILL_CUDA_ERR_RUNTIME; returns INFILL_CUDA_OK otherwise.
int check(cudaError_t err, const char* what);

/// Device memory freed on scope exit. Not copyable.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  /// Allocates `bytes` (at least 1) bytes; returns a CUDA error code like cudaMalloc.
  cudaError_t allocate(size_t bytes) { return cudaMalloc(&ptr_, bytes == 0 ? 1 : bytes); }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
};

}  // namespace infill::kernels::cuda

#define INFILL_CUDA_TRY(expr, what)                                             \
  do {                                                                          \
    const int infill_cuda_rc_ = ::infill::kernels::cuda::check((expr), (what)); \
    if (infill_cuda_rc_ != INFILL_CUDA_OK) return infill_cuda_rc_;              \
  } while (0)
