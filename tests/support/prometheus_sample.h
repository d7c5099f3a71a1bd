#pragma once
// Reading one sample of the Prometheus text format (GET /metrics) in tests.
#include <cmath>
#include <string>

namespace infill::test {

/// The value of the one sample whose line starts with `series` ("name{labels}"), or NaN.
inline double sample_value(const std::string& text, const std::string& series) {
  size_t at = 0;
  while ((at = text.find(series + " ", at)) != std::string::npos) {
    if (at == 0 || text[at - 1] == '\n') {
      const size_t end = text.find('\n', at);
      return std::stod(text.substr(at + series.size() + 1, end - at - series.size() - 1));
    }
    at += series.size();
  }
  return std::nan("");
}

}  // namespace infill::test
