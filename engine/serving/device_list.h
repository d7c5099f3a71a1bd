#pragma once
/// The devices of one engine, parsed from what users write (`--device`, the config's `device`):
/// "cpu", "cuda" (every visible GPU), "cuda:N", or a comma-separated list of those
/// ("cuda:0,cuda:1", "cpu,cpu"). Each device gets its own workers and its own copy of every
/// model (CPU devices share one copy: their memory is the process's). A GPU may be named
/// once; "cpu" any number of times: each CPU entry is a device of its own, with its share of
/// the cores (how this machine tests several devices).
///
/// Pure functions; thread-safe.

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "model/compute_device.h"

namespace infill {

struct EngineDevice {
  ComputeDevice device;
  /// Its name in messages, /health and /metrics: "cuda:1"; "cpu", or "cpu:K" (its position
  /// among the CPU entries) when the list names the CPU more than once.
  std::string label;
};

/// Checks the syntax only (no look at this machine): a non-empty comma-separated list of
/// cpu, cuda or cuda:N, spaces around entries allowed. Errors name the entry.
Status check_device_list(std::string_view text);

/// The devices of `text` on this machine: "cuda" expands to every visible GPU (none: an error
/// naming why, as check_compute_device says), each device is checked (check_compute_device),
/// and a GPU named twice is an error naming it.
Result<std::vector<EngineDevice>> resolve_device_list(std::string_view text);

/// The entries of `text` before expansion (for a thread count before the devices are
/// resolved): "cuda" counts as `cuda_devices`; 0 when the syntax is wrong.
int count_devices(std::string_view text, int cuda_devices);

}  // namespace infill
