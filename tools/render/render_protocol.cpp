#include "render_protocol.h"

#include <algorithm>
#include <cmath>

namespace infill::render {

void RenderProtocol::progress(double fraction) {
  // A hair of tolerance so that n/n of items summed as floats still reads 100.
  const int percent = std::clamp(static_cast<int>(std::floor(fraction * 100.0 + 1e-9)), 0, 100);
  if (percent == last_percent_) return;
  last_percent_ = percent;
  out_ << "Progress: " << percent << "%" << std::endl;
}

void RenderProtocol::saved(const std::string& path) { out_ << "Saved: " << path << std::endl; }

void RenderProtocol::skipped(const std::string& path) { out_ << "Skipped: " << path << " (up to date)" << std::endl; }

void RenderProtocol::error(const std::string& message) { err_ << "Error: " << message << std::endl; }

}  // namespace infill::render
