#pragma once
// What machine a benchmark ran on, for the "machine" field of its JSON.
#include <fstream>
#include <string>
#include <thread>

#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>

#include "common/blas_kernel.h"

namespace infill::bench {

/// `gpu`: the GPU a benchmark computed on, or "none used".
inline nlohmann::json machine_info(const std::string& gpu = "none used") {
  std::string cpu = "unknown";
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  }
  return {{"cpu", cpu},
          {"hardware_threads", std::thread::hardware_concurrency()},
          {"torch_threads", at::get_num_threads()},
          {"blas", describe(blas_kernel_choice())},
          {"gpu", gpu}};
}

}  // namespace infill::bench
