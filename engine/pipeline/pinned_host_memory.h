#pragma once
/// Page-locked ("pinned") host memory for the cache entries of a worker that computes on a
/// GPU. A GPU copies from pinned memory by DMA on a stream of its own, so the next blocks'
/// cached K/V cross the bus while the current block computes (pipeline/device_kv_prefetch.h);
/// from pageable memory the driver stages every copy through a pinned buffer of its own while
/// the host waits (an H200 read 786 MB of klein 4B's K/V per step at about 8 GB/s that way: 107 ms for a masked step that computes in 10 ms).

#include <cstdint>

#include <c10/core/Device.h>

#include "cache/host_memory.h"

namespace infill {

/// What a worker on `device` allocates its cache entries from: pinned memory through
/// libtorch's pinned allocator on a GPU, plain memory (an empty allocator) on the CPU. A
/// pinned allocation that fails (the driver's limit on page-locked memory) falls back to
/// plain memory: the entry still serves edits, its copies are only slower.
///
/// libtorch's caching host allocator (2.x) rounds every pinned allocation up to a power of two
/// and keeps freed blocks for reuse instead of returning them to the system; the RAM tier's
/// budget counts the entries' own bytes.
HostAllocator entry_allocator_for(const c10::Device& device);

/// Pinned allocations that fell back to plain memory so far in this process.
int64_t pinned_fallbacks();

}  // namespace infill
