#pragma once
/// What the adapter store's memory tiers hold and how they serve (pipeline/adapter_store.h),
/// apart from the store so that the service's metrics need no libtorch header. Torch-free.

#include <cstddef>
#include <cstdint>

namespace infill {

struct AdapterTierStats {
  int64_t bytes = 0;   ///< adapters held
  int64_t budget = 0;
  size_t adapters = 0;
  uint64_t hits = 0;
  /// Host tier: reads of a file; device tier: copies from the host tier.
  uint64_t misses = 0;
  uint64_t evictions = 0;
};

struct AdapterStoreStats {
  size_t files = 0;
  AdapterTierStats host;
  /// All zero for models on the CPU, which read the host form itself.
  AdapterTierStats device;
};

}  // namespace infill
