#pragma once
// Tests that need a CUDA device. Without one (a CPU libtorch, no driver, no GPU) they exit
// with ctest's skip code (4), so a machine without a GPU reports them skipped, never passed.
// scripts/gpu_check.sh runs them on a GPU machine.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "model/compute_device.h"
#include "support/catch.h"

namespace infill::test {

/// cuda:0, or exits with 4 naming why there is none.
inline ComputeDevice require_cuda_or_skip() {
  const ComputeDevice cuda{true, 0};
  const Status usable = check_compute_device(cuda);
  if (usable.ok()) return cuda;
  const std::string message = "SKIPPED: no CUDA device: " + usable.message();
  WARN(message);
  std::fprintf(stderr, "%s\n", message.c_str());
  std::exit(4);
}

}  // namespace infill::test
