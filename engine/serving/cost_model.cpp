#include "serving/cost_model.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <nlohmann/json.hpp>

namespace infill {
namespace {

constexpr int kFeatures = 4;
constexpr const char* kFormat = "infill-step-cost";
constexpr int kVersion = 1;

std::array<double, kFeatures> features(const StepSample& s) {
  return {1.0, s.tokens, s.batch_size, s.attention_work};
}

bool finite_sample(const StepSample& s) {
  return std::isfinite(s.tokens) && std::isfinite(s.batch_size) &&
         std::isfinite(s.attention_work) && std::isfinite(s.ms) && s.tokens >= 0 &&
         s.batch_size >= 0 && s.attention_work >= 0 && s.ms >= 0;
}

}  // namespace

Result<StepCostModel> StepCostModel::fit(const std::vector<StepSample>& samples) {
  if (samples.size() < kFeatures) {
    return invalid_argument("cost model fit got " + std::to_string(samples.size()) +
                            " samples, expected at least 4");
  }
  std::array<double, kFeatures> scale{1.0, 0.0, 0.0, 0.0};
  std::array<double, kFeatures> lo{}, hi{};
  lo.fill(INFINITY);
  hi.fill(-INFINITY);
  for (size_t i = 0; i < samples.size(); ++i) {
    if (!finite_sample(samples[i])) {
      return invalid_argument("cost model sample " + std::to_string(i) +
                              " has a negative or non-finite value, expected finite values >= 0");
    }
    const auto x = features(samples[i]);
    for (int j = 0; j < kFeatures; ++j) {
      scale[j] = std::max(scale[j], std::abs(x[j]));
      lo[j] = std::min(lo[j], x[j]);
      hi[j] = std::max(hi[j], x[j]);
    }
  }
  bool any_varies = false;
  for (int j = 1; j < kFeatures; ++j) any_varies = any_varies || hi[j] > lo[j];
  if (!any_varies) {
    return invalid_argument(
        "cost model samples are degenerate: tokens, batch_size and attention_work are constant "
        "across all samples, expected at least one to vary");
  }
  for (double& s : scale) s = s > 0 ? s : 1.0;

  // Columns scaled to unit max so attention_work (~tokens^2) does not swamp the others.
  double ata[kFeatures][kFeatures] = {};
  double aty[kFeatures] = {};
  for (const StepSample& s : samples) {
    auto x = features(s);
    for (int j = 0; j < kFeatures; ++j) x[j] /= scale[j];
    for (int r = 0; r < kFeatures; ++r) {
      aty[r] += x[r] * s.ms;
      for (int c = 0; c < kFeatures; ++c) ata[r][c] += x[r] * x[c];
    }
  }
  double trace = 0;
  for (int j = 0; j < kFeatures; ++j) trace += ata[j][j];
  // The ridge only matters for collinear columns (e.g. constant batch size == intercept).
  const double ridge = 1e-9 * trace / kFeatures;
  for (int j = 0; j < kFeatures; ++j) ata[j][j] += ridge;

  // Gaussian elimination with partial pivoting; the ridged matrix is SPD.
  for (int col = 0; col < kFeatures; ++col) {
    int piv = col;
    for (int r = col + 1; r < kFeatures; ++r) {
      if (std::abs(ata[r][col]) > std::abs(ata[piv][col])) piv = r;
    }
    if (!(std::abs(ata[piv][col]) > 0)) {
      return invalid_argument("cost model samples are degenerate: normal equations are singular");
    }
    if (piv != col) {
      for (int c = 0; c < kFeatures; ++c) std::swap(ata[col][c], ata[piv][c]);
      std::swap(aty[col], aty[piv]);
    }
    for (int r = col + 1; r < kFeatures; ++r) {
      const double f = ata[r][col] / ata[col][col];
      for (int c = col; c < kFeatures; ++c) ata[r][c] -= f * ata[col][c];
      aty[r] -= f * aty[col];
    }
  }
  StepCostModel model;
  for (int r = kFeatures - 1; r >= 0; --r) {
    double v = aty[r];
    for (int c = r + 1; c < kFeatures; ++c) v -= ata[r][c] * model.coef_[c];
    model.coef_[r] = v / ata[r][r];
  }
  for (int j = 0; j < kFeatures; ++j) {
    if (!std::isfinite(model.coef_[j])) {
      return invalid_argument("cost model samples are degenerate: coefficient " +
                              std::to_string(j) + " is not finite");
    }
  }
  // Undo the column scaling; coef_ above were solved for x / scale.
  for (int j = 0; j < kFeatures; ++j) model.coef_[j] /= scale[j];
  model.train_ = samples.size();
  return model;
}

double StepCostModel::predict_ms(double tokens, double batch_size, double attention_work) const {
  const double ms =
      coef_[0] + coef_[1] * tokens + coef_[2] * batch_size + coef_[3] * attention_work;
  return std::max(0.0, ms);
}

Result<StepCostModel::FitReport> StepCostModel::evaluate(
    const std::vector<StepSample>& samples) const {
  if (samples.empty()) return invalid_argument("cost model evaluate got 0 samples, expected >= 1");
  double mean = 0;
  for (const StepSample& s : samples) mean += s.ms;
  mean /= static_cast<double>(samples.size());
  double ss_res = 0, ss_tot = 0, ape = 0;
  size_t ape_n = 0;
  for (const StepSample& s : samples) {
    const double p = predict_ms(s.tokens, s.batch_size, s.attention_work);
    ss_res += (s.ms - p) * (s.ms - p);
    ss_tot += (s.ms - mean) * (s.ms - mean);
    if (s.ms > 0) {
      ape += std::abs(s.ms - p) / s.ms;
      ++ape_n;
    }
  }
  FitReport report;
  // Constant targets: R^2 is 1 when reproduced exactly, else 0 (no variance to explain).
  report.r2 = ss_tot > 0 ? 1.0 - ss_res / ss_tot : (ss_res == 0 ? 1.0 : 0.0);
  report.mape = ape_n > 0 ? 100.0 * ape / static_cast<double>(ape_n) : 0.0;
  report.train = train_;
  report.test = samples.size();
  return report;
}

std::string StepCostModel::make_fingerprint(std::string_view model_id, int threads) {
  return std::string(model_id) + "/threads=" + std::to_string(threads);
}

std::string StepCostModel::to_json() const {
  nlohmann::json j;
  j["format"] = kFormat;
  j["version"] = kVersion;
  j["fingerprint"] = fingerprint_;
  j["coefficients"] = coef_;
  j["train"] = train_;
  return j.dump(2);
}

Result<StepCostModel> StepCostModel::from_json(std::string_view text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return corrupt_data("cost model JSON does not parse as an object");
  }
  if (!j.contains("format") || !j["format"].is_string() || j["format"] != kFormat) {
    return corrupt_data(std::string("cost model JSON field 'format' is missing or wrong, expected '") +
                        kFormat + "'");
  }
  if (!j.contains("version") || !j["version"].is_number_integer() || j["version"] != kVersion) {
    return corrupt_data("cost model JSON field 'version' is missing or not 1");
  }
  if (!j.contains("fingerprint") || !j["fingerprint"].is_string()) {
    return corrupt_data("cost model JSON field 'fingerprint' is missing or not a string");
  }
  const auto& c = j.contains("coefficients") ? j["coefficients"] : nlohmann::json();
  if (!c.is_array() || c.size() != kFeatures) {
    return corrupt_data("cost model JSON field 'coefficients' must be an array of 4 numbers");
  }
  StepCostModel model;
  for (int i = 0; i < kFeatures; ++i) {
    if (!c[i].is_number() || !std::isfinite(c[i].get<double>())) {
      return corrupt_data("cost model JSON coefficients[" + std::to_string(i) +
                          "] is not a finite number");
    }
    model.coef_[i] = c[i].get<double>();
  }
  if (!j.contains("train") || !j["train"].is_number_unsigned()) {
    return corrupt_data("cost model JSON field 'train' is missing or not a non-negative integer");
  }
  model.train_ = j["train"].get<size_t>();
  model.fingerprint_ = j["fingerprint"].get<std::string>();
  return model;
}

StepCostModel StepCostModel::plausible() {
  std::vector<StepSample> s;
  for (double t : {4.0, 16.0, 64.0})
    for (double b : {1.0, 2.0, 4.0})
      for (double a : {50.0, 500.0, 4000.0}) s.push_back({t, b, a, 0.5 + 0.01 * t + 0.05 * b + 0.0001 * a});
  auto m = fit(s);
  // 27 exact, well-spread samples: the fit cannot fail.
  assert(m.ok());
  return *m;
}

}  // namespace infill
