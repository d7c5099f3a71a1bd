#include "model/device_memory.h"

#include <exception>
#include <string>

#include "model/compute_device.h"
#ifdef INFILL_TORCH_CUDA
#include <ATen/Context.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/util/Exception.h>
#endif

namespace infill {

Result<DeviceMemory> cuda_device_memory(int index) {
  const ComputeDevice device{true, index};
  INFILL_RETURN_IF_ERROR(check_compute_device(device));
#ifdef INFILL_TORCH_CUDA
  // The caching allocator's figures are its own bookkeeping (no device call); the free and
  // total bytes come from cudaMemGetInfo on that device (getMemoryInfo sets and restores the
  // calling thread's current device).
  const auto d = static_cast<c10::DeviceIndex>(index);
  namespace allocator = c10::cuda::CUDACachingAllocator;
  try {
    // The allocator knows the devices once CUDA is initialised (the first CUDA tensor does it).
    at::globalContext().lazyInitDevice(at::kCUDA);
    const c10::CachingDeviceAllocator::DeviceStats stats = allocator::getDeviceStats(d);
    const auto aggregate = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    DeviceMemory m;
    m.allocated_bytes = stats.allocated_bytes[aggregate].current;
    m.reserved_bytes = stats.reserved_bytes[aggregate].current;
    m.peak_allocated_bytes = stats.allocated_bytes[aggregate].peak;
    const auto [free_now, total] = allocator::get()->getMemoryInfo(d);
    m.free_bytes = static_cast<int64_t>(free_now);
    m.total_bytes = static_cast<int64_t>(total);
    return m;
  } catch (const c10::Error& e) {
    return Status(ErrorCode::kInternal,
                  device.name() + ": reading its memory failed: " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    return Status(ErrorCode::kInternal, device.name() + ": reading its memory failed: " + e.what());
  }
#else
  // check_compute_device refused already: this libtorch has no CUDA.
  return Status(ErrorCode::kUnimplemented, device.name() + ": this build's libtorch has no CUDA");
#endif
}

Status reset_cuda_memory_peak(int index) {
  const ComputeDevice device{true, index};
  INFILL_RETURN_IF_ERROR(check_compute_device(device));
#ifdef INFILL_TORCH_CUDA
  try {
    at::globalContext().lazyInitDevice(at::kCUDA);
    c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(index));
    return {};
  } catch (const c10::Error& e) {
    return Status(ErrorCode::kInternal, device.name() + ": resetting its memory peak failed: " + e.what_without_backtrace());
  }
#else
  return Status(ErrorCode::kUnimplemented, device.name() + ": this build's libtorch has no CUDA");
#endif
}

}  // namespace infill
