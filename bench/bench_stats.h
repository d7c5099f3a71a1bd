#pragma once
// Order statistics the benchmark programs report (medians, P95, P99), one definition for all.
#include <algorithm>
#include <cstddef>
#include <vector>

namespace infill::bench {

/// The p-quantile (p in [0, 1]) with linear interpolation between the two nearest ranks;
/// 0 for an empty sample.
inline double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const double idx = p * double(v.size() - 1);
  const size_t lo = static_cast<size_t>(idx);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (idx - double(lo));
}

}  // namespace infill::bench
