// Device discovery and error reporting of the CUDA kernel library.
#include <cstring>
#include <exception>
#include <string>

#include "cuda_common.h"

namespace infill::kernels::cuda {
namespace {

thread_local std::string t_last_error;

}  // namespace

int fail(int code, const std::string& message) {
  try {
    t_last_error = message;
  } catch (const std::exception&) {
    t_last_error.clear();
  }
  return code;
}

int check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return INFILL_CUDA_OK;
  // Clear the sticky "last error" so later calls on this thread start clean.
  cudaGetLastError();
  return fail(INFILL_CUDA_ERR_RUNTIME, std::string(what) + " failed: " + cudaGetErrorString(err) +
                                           " (" + cudaGetErrorName(err) + ")");
}

}  // namespace infill::kernels::cuda

extern "C" int infill_cuda_abi_version(void) { return INFILL_CUDA_ABI_VERSION; }

extern "C" const char* infill_cuda_last_error(void) {
  return infill::kernels::cuda::t_last_error.c_str();
}

extern "C" int infill_cuda_device_count(char* name, int name_len) {
  using infill::kernels::cuda::check;
  int count = 0;
  // Without a driver the runtime reports cudaErrorInsufficientDriver or cudaErrorNoDevice.
  const int rc = check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  if (rc != INFILL_CUDA_OK) return rc;
  if (count > 0 && name != nullptr && name_len > 0) {
    cudaDeviceProp prop;
    const int prop_rc = check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    if (prop_rc != INFILL_CUDA_OK) return prop_rc;
    std::strncpy(name, prop.name, static_cast<size_t>(name_len) - 1);
    name[name_len - 1] = '\0';
  }
  return count;
}
