#pragma once
/// What a failed forward's error means for the device it ran on. Out of device memory fails
/// the step's requests and the device goes on (the allocator has freed the step's tensors). A
/// sticky CUDA error (an illegal memory access, a device-side assert, a launch failure, an
/// uncorrectable ECC error) poisons the process's CUDA context: every later call on that
/// device fails, and nothing short of a new process recovers it, so the worker takes itself
/// out of service. Any other error is the request's own. Torch-free.

#include <string_view>

namespace infill {

enum class DeviceFault {
  kNone = 0,         ///< not a device fault: only the step's requests fail
  kOutOfMemory = 1,  ///< the step's requests fail; the device goes on
  kLost = 2,         ///< the device's context is unusable for the rest of the process
};

/// Classifies the text of a failed forward's exception (libtorch's c10::Error messages carry
/// the CUDA runtime's error string).
DeviceFault classify_device_fault(std::string_view error);

/// "none", "out_of_memory", "lost".
const char* device_fault_name(DeviceFault fault);

}  // namespace infill
