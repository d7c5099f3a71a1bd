#include "model/compute_device.h"

#include <charconv>

#include <cstdio>

#include <ATen/Parallel.h>
#include <torch/cuda.h>
#ifdef INFILL_TORCH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

namespace infill {

std::string ComputeDevice::name() const { return cuda ? "cuda:" + std::to_string(index) : "cpu"; }

c10::Device ComputeDevice::torch_device() const {
  return cuda ? c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(index)) : c10::Device(c10::kCPU);
}

Result<ComputeDevice> parse_compute_device(std::string_view text) {
  const auto bad = [&] {
    return invalid_argument("device \"" + std::string(text) + "\": expected cpu, cuda or cuda:N");
  };
  if (text == "cpu") return ComputeDevice{};
  if (text == "cuda") return ComputeDevice{true, 0};
  constexpr std::string_view kCuda = "cuda:";
  if (text.substr(0, kCuda.size()) != kCuda) return bad();
  const std::string_view digits = text.substr(kCuda.size());
  int index = -1;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
  if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size() || index < 0 || index > 255) {
    return bad();
  }
  return ComputeDevice{true, index};
}

// torch::cuda is libtorch's public C++ API for this, stable from 1.13 to 2.x.
int cuda_device_count() { return torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0; }

std::string describe_compute_device(const ComputeDevice& device) {
  if (!device.cuda) return "cpu (" + std::to_string(at::get_num_threads()) + " threads)";
  if (const Status usable = check_compute_device(device); !usable.ok()) return usable.message();
#ifdef INFILL_TORCH_CUDA
  const auto* properties = at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(device.index));
  char memory[32];
  std::snprintf(memory, sizeof(memory), "%.1f GiB", static_cast<double>(properties->totalGlobalMem) / (1 << 30));
  return device.name() + " (" + properties->name + ", " + memory + ")";
#else
  return device.name();
#endif
}

Status check_compute_device(const ComputeDevice& device) {
  if (!device.cuda) return {};
  if (!torch::cuda::is_available()) {
    return Status(ErrorCode::kUnimplemented,
                  device.name() + ": this build's libtorch has no CUDA, or no CUDA driver answers (build the "
                                  "cuda preset against a CUDA libtorch)");
  }
  const int count = cuda_device_count();
  if (device.index >= count) {
    return out_of_range(device.name() + ": this machine has " + std::to_string(count) + " CUDA device" +
                        (count == 1 ? "" : "s"));
  }
  return {};
}

}  // namespace infill
