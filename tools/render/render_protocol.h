#pragma once
/// infill-render's output protocol, the contract with farm managers (docs/farm.md):
///   stdout: "Progress: NN%" once per change of the whole-run percentage, "Saved: PATH" after
///           each output is renamed into place, "Skipped: PATH" for an output already up to
///           date; every line flushed at once.
///   stderr: "Error: ..." and nothing else on failure.
/// Threading: used by the runner's thread only.

#include <ostream>
#include <string>

namespace infill::render {

class RenderProtocol {
 public:
  RenderProtocol(std::ostream& out, std::ostream& err) : out_(out), err_(err) {}

  /// `fraction` in [0, 1] of the run; prints when the integer percentage changes (floor, so
  /// 100% only when everything is done).
  void progress(double fraction);
  void saved(const std::string& path);
  void skipped(const std::string& path);
  void error(const std::string& message);

 private:
  std::ostream& out_;
  std::ostream& err_;
  int last_percent_ = -1;
};

}  // namespace infill::render
