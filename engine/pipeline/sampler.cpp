#include "pipeline/sampler.h"

#include <cmath>
#include <stdexcept>
#include <string>

#include <ATen/ATen.h>

namespace infill {

Result<SamplerKind> parse_sampler(std::string_view name) {
  if (name == "euler_rf") return SamplerKind::kEulerRF;
  if (name == "ddim") return SamplerKind::kDdim;
  return invalid_argument("sampler \"" + std::string(name) +
                          "\" is unknown; expected euler_rf or ddim");
}

const char* sampler_name(SamplerKind kind) {
  switch (kind) {
    case SamplerKind::kEulerRF:
      return "euler_rf";
    case SamplerKind::kDdim:
      return "ddim";
  }
  return "unknown";
}

double flux2_schedule_shift(int image_tokens, int steps) {
  // compute_empirical_mu of black-forest-labs/flux2 src/flux2/sampling.py: two lines in the
  // token count, for 10 and 200 steps, interpolated linearly in the step count; past 4300
  // tokens the 200-step line alone.
  constexpr double a1 = 8.73809524e-05, b1 = 1.89833333;
  constexpr double a2 = 0.00016927, b2 = 0.45666666;
  const double n = image_tokens;
  const double m200 = a2 * n + b2;
  if (image_tokens > 4300) return std::exp(m200);
  const double m10 = a1 * n + b1;
  const double a = (m200 - m10) / 190.0;
  const double b = m200 - 200.0 * a;
  return std::exp(a * steps + b);
}

Status validate_strength(double strength) {
  if (!std::isfinite(strength) || strength <= 0.0 || strength > 1.0) {
    return invalid_argument("strength " + std::to_string(strength) + " is outside (0, 1]");
  }
  return Status::success();
}

Sampler::Sampler(SamplerKind kind, Prediction prediction, int steps)
    : kind_(kind), prediction_(prediction), steps_(steps) {}

Result<Sampler> Sampler::make(SamplerKind kind, int steps, Prediction prediction, double shift) {
  if (steps < 1 || steps > kMaxSteps) {
    return invalid_argument("steps " + std::to_string(steps) + " is outside [1, " +
                            std::to_string(kMaxSteps) + "]");
  }
  Sampler s(kind, prediction, steps);
  switch (kind) {
    case SamplerKind::kEulerRF: {
      if (prediction != Prediction::kFlow) {
        return invalid_argument("sampler euler_rf needs a flow (velocity) model");
      }
      if (!std::isfinite(shift) || shift <= 0.0) {
        return invalid_argument("shift " + std::to_string(shift) + " must be finite and > 0");
      }
      s.levels_.resize(steps + 1);
      for (int i = 0; i <= steps; ++i) {
        const double t = 1.0 - static_cast<double>(i) / steps;
        s.levels_[i] = shift * t / (1.0 + (shift - 1.0) * t);
      }
      // Exact endpoints whatever the rounding of the shift formula.
      s.levels_.front() = 1.0;
      s.levels_.back() = 0.0;
      return s;
    }
    case SamplerKind::kDdim: {
      if (prediction != Prediction::kEpsilon) {
        return invalid_argument("sampler ddim needs an epsilon model");
      }
      if (shift != 1.0) {
        return invalid_argument("shift " + std::to_string(shift) +
                                " applies to euler_rf only; ddim needs 1");
      }
      // Linear betas as in ADM/DiT: linspace(1e-4, 0.02, 1000), alpha_bar = cumprod(1 - beta).
      std::vector<double> alpha_bar(kTrainTimesteps);
      double prod = 1.0;
      for (int t = 0; t < kTrainTimesteps; ++t) {
        const double beta = 1e-4 + (0.02 - 1e-4) * t / (kTrainTimesteps - 1);
        prod *= 1.0 - beta;
        alpha_bar[t] = prod;
      }
      s.timesteps_.resize(steps);
      s.levels_.resize(steps + 1);
      for (int i = 0; i < steps; ++i) {
        const double ratio = static_cast<double>(kTrainTimesteps) / steps;
        const int t = static_cast<int>(std::lround(kTrainTimesteps - i * ratio)) - 1;
        s.timesteps_[i] = t;
        s.levels_[i] = alpha_bar[t];
      }
      s.levels_.back() = 1.0;
      return s;
    }
  }
  return invalid_argument("sampler kind " + std::to_string(static_cast<int>(kind)) + " is unknown");
}

void Sampler::check_step(int i) const {
  if (i < 0 || i >= steps_) {
    throw std::out_of_range("sampler step " + std::to_string(i) + " is outside [0, " +
                            std::to_string(steps_) + ")");
  }
}

void Sampler::check_level(int level) const {
  if (level < 0 || level > steps_) {
    throw std::out_of_range("sampler level " + std::to_string(level) + " is outside [0, " +
                            std::to_string(steps_) + "]");
  }
}

double Sampler::model_timestep(int i) const {
  check_step(i);
  return kind_ == SamplerKind::kEulerRF ? levels_[i] * 1000.0 : static_cast<double>(timesteps_[i]);
}

double Sampler::signal_scale(int level) const {
  check_level(level);
  return kind_ == SamplerKind::kEulerRF ? 1.0 - levels_[level] : std::sqrt(levels_[level]);
}

double Sampler::noise_scale(int level) const {
  check_level(level);
  return kind_ == SamplerKind::kEulerRF ? levels_[level] : std::sqrt(1.0 - levels_[level]);
}

at::Tensor Sampler::add_noise(const at::Tensor& x0, const at::Tensor& noise, int level) const {
  check_level(level);
  if (level == steps_) return x0.clone();
  return x0 * signal_scale(level) + noise * noise_scale(level);
}

at::Tensor Sampler::step(const at::Tensor& x, const at::Tensor& prediction, int i) const {
  return step_to(x, prediction, i, i + 1);
}

at::Tensor Sampler::step_to(const at::Tensor& x, const at::Tensor& prediction, int i, int level) const {
  check_step(i);
  check_level(level);
  if (level <= i) {
    throw std::out_of_range("sampler step " + std::to_string(i) + " cannot land on level " + std::to_string(level));
  }
  if (kind_ == SamplerKind::kEulerRF) {
    return x + prediction * (levels_[level] - levels_[i]);
  }
  // DDIM, eta = 0: x_next = sqrt(a') x0_hat + sqrt(1 - a') eps, written as one affine
  // combination of x and eps so no intermediate tensor is needed.
  const double a = levels_[i];
  const double a_next = levels_[level];
  const double c_x = std::sqrt(a_next / a);
  const double c_eps = std::sqrt(1.0 - a_next) - c_x * std::sqrt(1.0 - a);
  return x * c_x + prediction * c_eps;
}

at::Tensor Sampler::predict_x0(const at::Tensor& x, const at::Tensor& prediction, int i) const {
  check_step(i);
  if (kind_ == SamplerKind::kEulerRF) {
    return x - prediction * levels_[i];
  }
  const double a = levels_[i];
  return (x - prediction * std::sqrt(1.0 - a)) * (1.0 / std::sqrt(a));
}

int Sampler::start_step(double strength) const {
  const long start = std::lround((1.0 - strength) * steps_);
  if (start < 0) return 0;
  if (start > steps_ - 1) return steps_ - 1;
  return static_cast<int>(start);
}

}  // namespace infill
