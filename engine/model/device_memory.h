#pragma once
/// What a CUDA device's memory holds, for `/metrics`, `/v1/metrics` and `infill-engine
/// --check`: the bytes this process's tensors take there and what libtorch's caching
/// allocator holds for them, and the device's own free and total bytes (every process's use).
/// A CPU device has no such figures: its memory is the process's resident set.
///
/// Torch-free header: the CUDA calls are in the source, compiled only against a CUDA libtorch
/// (INFILL_TORCH_CUDA). Thread-safe.

#include <cstdint>

#include "common/status.h"

namespace infill {

struct DeviceMemory {
  /// Bytes of this process's tensors on the device (the caching allocator's allocated bytes).
  int64_t allocated_bytes = 0;
  /// Bytes the caching allocator holds on the device: the tensors' blocks and the cached free
  /// ones it keeps for reuse (>= allocated_bytes). What this process uses there.
  int64_t reserved_bytes = 0;
  /// Free on the device now, as the driver says (every process's use counted).
  int64_t free_bytes = 0;
  /// The device's memory.
  int64_t total_bytes = 0;
  /// The most allocated_bytes has been since the process began or reset_cuda_memory_peak: what
  /// a load or a step needed at its height.
  int64_t peak_allocated_bytes = 0;
};

/// The memory of CUDA device `index` (call it once the device is in use: the driver's figures
/// make a CUDA context there). Errors name the device: a build or machine without CUDA
/// ("cuda:0: this build's libtorch has no CUDA ..."), a device that is not there, or the
/// driver's error.
Result<DeviceMemory> cuda_device_memory(int index);

/// Starts peak_allocated_bytes of CUDA device `index` again from what is allocated now. Errors
/// as cuda_device_memory's.
Status reset_cuda_memory_peak(int index);

}  // namespace infill
