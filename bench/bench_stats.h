#pragma once
// Order statistics the benchmark programs report (medians, P95, P99), one definition for all.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <functional>
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

/// The median wall time of `repeats` calls of `fn`, in ms, after one warm-up call (oneDNN
/// primitive creation, the allocator's first requests).
inline double median_ms(int repeats, const std::function<void()>& fn) {
  fn();
  std::vector<double> ms;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return percentile(ms, 0.5);
}

}  // namespace infill::bench
