#pragma once
/// How fast this machine's bus brings a cache entry from pinned host memory to a GPU. The
/// worker's load plan weighs, per block, copying its cached K/V to the device against
/// recomputing the block on every token (cache/load_plan.h); on an H200 the copy ran at
/// 38-49 GB/s, on a machine whose GPU sits behind a narrow link or shares it, much less.

#include <c10/core/Device.h>

namespace infill {

/// Bytes per millisecond of a copy from pinned host memory to `device`: the median of three
/// timed, synchronised copies of 64 MiB after one untimed. 0 for the CPU (entries are read
/// where they are). Throws c10::Error when the device cannot take the buffer.
double measure_host_to_device_bytes_per_ms(const c10::Device& device);

}  // namespace infill
