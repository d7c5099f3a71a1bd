#pragma once
// Test data in ../shared (reference tensors, real pretrained weights), which the project must
// not copy. A test that needs it and finds it missing exits with ctest's skip code (4, the
// SKIP_RETURN_CODE of every suite), so it is reported as skipped, never as passed.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <string>

#include "support/catch.h"
#include "support/data_dirs.h"

namespace infill::test {

/// Returns when every path exists; otherwise reports the first missing one and exits with 4.
inline void require_shared_or_skip(std::initializer_list<std::string> paths) {
  for (const std::string& path : paths) {
    if (std::filesystem::exists(path)) continue;
    const std::string message = "SKIPPED: shared test data " + path + " not found";
    WARN(message);
    // Also straight to stderr: Catch's report may not be flushed before exit.
    std::fprintf(stderr, "%s\n", message.c_str());
    std::exit(4);
  }
}

}  // namespace infill::test
