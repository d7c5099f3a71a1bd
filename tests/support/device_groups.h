#pragma once
// Sequence-parallel tests on CPU devices: a Gloo group of `ranks` members in this process, and
// a call run by every rank at once, a thread each. Without Gloo in this build (no libgloo-dev
// headers, or a CUDA libtorch) the tests exit with ctest's skip code (4), never pass.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "model/device_group.h"
#include "support/catch.h"

namespace infill::test {

/// `ranks` CPU members, or exits with 4 when this build has no Gloo.
inline std::vector<std::unique_ptr<DeviceGroup>> cpu_group_or_skip(int ranks, DeviceGroupOptions options = {}) {
  auto group = DeviceGroup::create(std::vector<ComputeDevice>(ranks), std::move(options));
  if (!group.ok() && group.status().message().find("no Gloo") != std::string::npos) {
    const std::string message = "SKIPPED: " + group.status().message();
    WARN(message);
    std::fprintf(stderr, "%s\n", message.c_str());
    std::exit(4);
  }
  REQUIRE(group.ok());
  return std::move(*group);
}

/// Runs `body(rank)` on every rank at once, a thread each; the message of each rank's
/// exception ("" where none was thrown).
inline std::vector<std::string> on_every_rank(int ranks, const std::function<void(int rank)>& body) {
  std::vector<std::string> errors(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (const std::exception& e) {
        errors[r] = e.what();
        if (errors[r].empty()) errors[r] = "exception";
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return errors;
}

}  // namespace infill::test
