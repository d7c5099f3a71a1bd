#pragma once
/// Per-step latency model of the denoiser, calibrated at start-up by linear regression:
///   ms ~ c0 + c1 * tokens + c2 * batch_size + c3 * attention_work
/// and persisted as JSON so a restart with the same model and thread count can skip calibration.
///
/// Immutable after fit/from_json; safe to share between threads for reading.

#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace infill {

/// One timed denoising step.
struct StepSample {
  double tokens;          ///< packed masked tokens in the batch
  double batch_size;      ///< requests in the batch
  double attention_work;  ///< sum over requests of masked_tokens * total_tokens
  double ms;              ///< measured step latency
};

class StepCostModel {
 public:
  /// Quality of the model on a set of (held-out) samples.
  struct FitReport {
    double r2 = 0.0;    ///< coefficient of determination (1 = perfect)
    double mape = 0.0;  ///< mean absolute percentage error, in percent
    size_t train = 0;   ///< samples the model was fitted on
    size_t test = 0;    ///< samples evaluated
  };

  /// Ordinary least squares on [1, tokens, batch_size, attention_work] through the normal
  /// equations (columns scaled to unit max, tiny ridge for stability). Errors: fewer than 4
  /// samples, non-finite or negative values, or no feature that varies across the samples.
  static Result<StepCostModel> fit(const std::vector<StepSample>& samples);

  /// Predicted step latency; clamped at 0.
  double predict_ms(double tokens, double batch_size, double attention_work) const;

  /// R^2 and MAPE over `samples` (points with ms <= 0 are left out of the MAPE).
  /// Error if `samples` is empty.
  Result<FitReport> evaluate(const std::vector<StepSample>& samples) const;

  /// [intercept, per token, per request, per attention unit].
  const std::array<double, 4>& coefficients() const { return coef_; }
  size_t train_samples() const { return train_; }

  /// Identifies what the calibration is valid for; stored in the JSON.
  const std::string& fingerprint() const { return fingerprint_; }
  void set_fingerprint(std::string fingerprint) { fingerprint_ = std::move(fingerprint); }
  /// "<model_id>/threads=<n>": the fingerprint a caller compares against a loaded file.
  static std::string make_fingerprint(std::string_view model_id, int threads);

  /// {"format":"infill-step-cost","version":1,"fingerprint":...,"coefficients":[4],"train":n}
  std::string to_json() const;
  /// Inverse of to_json; errors name the missing or malformed field.
  static Result<StepCostModel> from_json(std::string_view text);
  /// Made-up but plausible coefficients (0.5 ms + 0.01 ms per token + 0.05 ms per request +
  /// 0.0001 ms per unit of attention work), for when no calibration is wanted: tests, --check,
  /// and single-worker runs where only the ordering of one class of requests depends on it.
  static StepCostModel plausible();

 private:
  std::array<double, 4> coef_{};
  size_t train_ = 0;
  std::string fingerprint_;
};

}  // namespace infill
