#pragma once
// Where tests find data outside their binary: the shared test data (../shared: reference
// tensors, real pretrained weights, which the project must not copy) and the source tree (the
// bundled models). Each is compiled in and may be overridden by an environment variable of the
// same name, so that a binary built on one machine runs on another (scripts/gpu_check.sh
// --prebuilt sets both). Catch-free, so tools built beside the tests (infill-test-flux2) use it.
#include <cstdlib>
#include <string>

namespace infill::test {

/// The shared test data folder: the environment variable `INFILL_SHARED_DIR` when it is set and
/// not empty, else the folder compiled in (CMake's `INFILL_SHARED_DIR`, default ../shared
/// beside the source tree).
inline std::string shared_dir() {
  const char* from_env = std::getenv("INFILL_SHARED_DIR");
  if (from_env != nullptr && from_env[0] != '\0') return from_env;
  return INFILL_SHARED_DIR;
}

/// `relative` under the shared folder, e.g. "testdata/flux2/flux2_ae.safetensors".
inline std::string shared_path(const std::string& relative) {
  return shared_dir() + "/" + relative;
}

/// `relative` under the source tree, e.g. "resources/models/infill-tiny-2": the environment
/// variable `INFILL_SOURCE_DIR` when it is set and not empty, else the tree compiled in.
inline std::string source_path(const std::string& relative) {
  const char* from_env = std::getenv("INFILL_SOURCE_DIR");
  const std::string dir = from_env != nullptr && from_env[0] != '\0' ? from_env : INFILL_SOURCE_DIR;
  return dir + "/" + relative;
}

}  // namespace infill::test
