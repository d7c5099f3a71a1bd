#include "pipeline/pinned_host_memory.h"

#include <algorithm>
#include <atomic>

#include <ATen/ATen.h>

namespace infill {

namespace {
std::atomic<int64_t> fallbacks{0};
}  // namespace

HostAllocator entry_allocator_for(const c10::Device& device) {
  if (device.is_cpu()) return {};
  return [](size_t bytes) -> HostBuffer {
    try {
      at::Tensor block = at::empty({static_cast<int64_t>(std::max<size_t>(bytes, 1))},
                                   at::TensorOptions().dtype(at::kByte).pinned_memory(true));
      void* data = block.data_ptr();
      // The tensor owns the memory (and hands it back to libtorch's pinned allocator).
      return HostBuffer(data, [block](void*) mutable { block.reset(); });
    } catch (const c10::Error&) {
      fallbacks.fetch_add(1, std::memory_order_relaxed);
      return allocate_plain_host(bytes);
    }
  };
}

int64_t pinned_fallbacks() { return fallbacks.load(std::memory_order_relaxed); }

}  // namespace infill
