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

/// The median wall times, in ms, of `fns` timed in turns: one warm-up call of each, then
/// `repeats` rounds in which each runs once, the order rotating from round to round. The
/// machine's drift over minutes (other load, clocks, the page cache, the allocator) then falls
/// on every function alike, so a ratio of two medians compares like with like; timed one
/// after the other, a baseline measured first can come out slower than its variant.
inline std::vector<double> interleaved_medians_ms(int repeats, const std::vector<std::function<void()>>& fns) {
  for (const std::function<void()>& fn : fns) fn();
  std::vector<std::vector<double>> ms(fns.size());
  for (int r = 0; r < repeats; ++r) {
    for (size_t k = 0; k < fns.size(); ++k) {
      const size_t i = (k + static_cast<size_t>(r)) % fns.size();
      const auto t0 = std::chrono::steady_clock::now();
      fns[i]();
      ms[i].push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  std::vector<double> medians;
  for (const std::vector<double>& v : ms) medians.push_back(percentile(v, 0.5));
  return medians;
}

}  // namespace infill::bench
