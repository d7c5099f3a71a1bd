#include "serving/device_fault.h"

#include <array>

namespace infill {

DeviceFault classify_device_fault(std::string_view error) {
  // The CUDA runtime's texts of the sticky errors (cudaErrorIllegalAddress,
  // cudaErrorAssert, cudaErrorLaunchFailure, cudaErrorMisalignedAddress,
  // cudaErrorIllegalInstruction, cudaErrorHardwareStackError, cudaErrorECCUncorrectable,
  // cudaErrorLaunchTimeout), as libtorch quotes them after "CUDA error: ".
  static constexpr std::array<std::string_view, 8> kSticky = {
      "illegal memory access", "device-side assert triggered", "unspecified launch failure", "misaligned address",
      "an illegal instruction", "hardware stack error",        "uncorrectable ECC error",    "the launch timed out"};
  const bool cuda = error.find("CUDA") != std::string_view::npos || error.find("cuda") != std::string_view::npos;
  if (cuda) {
    for (std::string_view sticky : kSticky)
      if (error.find(sticky) != std::string_view::npos) return DeviceFault::kLost;
  }
  if (error.find("out of memory") != std::string_view::npos) return DeviceFault::kOutOfMemory;
  return DeviceFault::kNone;
}

const char* device_fault_name(DeviceFault fault) {
  switch (fault) {
    case DeviceFault::kNone: return "none";
    case DeviceFault::kOutOfMemory: return "out_of_memory";
    case DeviceFault::kLost: return "lost";
  }
  return "none";
}

}  // namespace infill
