#pragma once
/// Where the bytes of a cache entry live in host memory. Plain memory by default; on a worker
/// that computes on a GPU, page-locked ("pinned") memory (pipeline/pinned_host_memory.h), from
/// which the GPU copies by DMA while it computes, instead of the driver staging every copy
/// through a pinned buffer of its own with the host waiting. Torch-free: the cache layer only
/// sees an allocation function.

#include <cstddef>
#include <functional>
#include <memory>

namespace infill {

/// `bytes` bytes of host memory, 64-byte aligned, released when the last owner lets go.
using HostBuffer = std::shared_ptr<void>;
/// Allocates a HostBuffer; throws std::bad_alloc when it cannot.
using HostAllocator = std::function<HostBuffer(size_t bytes)>;

/// Plain host memory (std::aligned_alloc).
HostBuffer allocate_plain_host(size_t bytes);

}  // namespace infill
