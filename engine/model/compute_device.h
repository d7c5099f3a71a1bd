#pragma once
/// The device a worker computes on: the CPU (a share of its cores) or one CUDA GPU. Parsed
/// from the names users write ("cpu", "cuda", "cuda:1") and checked against what this build's
/// libtorch and this machine offer, so that a request for a GPU on a machine or build without
/// one is an error naming the device, never a crash at the first forward.

#include <string>
#include <string_view>

#include <c10/core/Device.h>

#include "common/status.h"

namespace infill {

struct ComputeDevice {
  bool cuda = false;
  int index = 0;  ///< the CUDA device's ordinal; 0 for the CPU

  /// "cpu" or "cuda:N".
  std::string name() const;
  c10::Device torch_device() const;
  bool operator==(const ComputeDevice&) const = default;
};

/// "cpu", "cuda" (device 0) or "cuda:N"; invalid_argument naming the text otherwise.
Result<ComputeDevice> parse_compute_device(std::string_view text);

/// Ok when the device can run: the CPU always; a CUDA device when this build's libtorch has
/// CUDA and the device exists. Otherwise an error naming the device and why ("cuda:1: this
/// machine has 1 CUDA device", "cuda:0: this build's libtorch has no CUDA").
Status check_compute_device(const ComputeDevice& device);

/// The number of CUDA devices this process can use (0 without CUDA in libtorch or a driver).
int cuda_device_count();

/// For logs and benchmark JSON: "cpu (16 threads)", "cuda:0 (NVIDIA H200, 139.8 GiB)", or the
/// device's name with why it cannot run.
std::string describe_compute_device(const ComputeDevice& device);

}  // namespace infill
