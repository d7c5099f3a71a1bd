#pragma once
// Runs a shell command for a test and returns its exit status and combined output: how a test
// hands the project's output to a real third-party checker (promtool, an OpenAPI validator).
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "support/catch.h"

namespace infill::test {

struct CommandOutput {
  int exit_code = -1;  ///< -1 when the command did not exit normally
  std::string output;  ///< stdout and stderr together (append 2>&1 to the command for stderr)
};

inline CommandOutput run_command(const std::string& command) {
  CommandOutput r;
  std::FILE* p = ::popen(command.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf{};
  size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  const int status = ::pclose(p);
  if (status != -1 && WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  return r;
}

/// Returns when `tool` is on PATH; otherwise reports it and exits with ctest's skip code 4
/// (scripts/setup.sh installs every tool the tests use, so CI never skips).
inline void require_tool_or_skip(const std::string& tool, const std::string& package) {
  if (run_command("command -v " + tool + " >/dev/null 2>&1").exit_code == 0) return;
  const std::string message = "SKIPPED: " + tool + " not found (Debian package " + package + ", installed by scripts/setup.sh)";
  WARN(message);
  std::fprintf(stderr, "%s\n", message.c_str());
  std::exit(4);
}

/// Returns when the file at `path` (a data file of Debian package `package`) exists;
/// otherwise reports it and exits with ctest's skip code 4, as require_tool_or_skip.
inline void require_package_file_or_skip(const std::string& path, const std::string& package) {
  if (std::filesystem::exists(path)) return;
  const std::string message = "SKIPPED: " + path + " not found (Debian package " + package + ", installed by scripts/setup.sh)";
  WARN(message);
  std::fprintf(stderr, "%s\n", message.c_str());
  std::exit(4);
}

}  // namespace infill::test
