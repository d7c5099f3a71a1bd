#pragma once
/// Samplers: the noise schedule and the update rule of one denoising run.
///
/// Step i = 0 is the noisiest. "Level" i in [0, steps] names the noise level at the START of
/// step i; level == steps is clean. Every method is elementwise, so tensors of any shape work
/// (whole latents [C, H, W], packed token rows [M, D], ...), in the caller's dtype and device:
/// schedule coefficients are computed in double and applied as scalars.
///
/// A Sampler is an immutable value: copyable, and safe to use from several threads at once.

#include <string_view>
#include <vector>

#include <ATen/core/Tensor.h>

#include "common/status.h"

namespace infill {

/// What the network predicts.
enum class Prediction {
  kFlow = 1,     ///< velocity v = noise - x0 (rectified flow)
  kEpsilon = 2,  ///< the noise epsilon (DDPM / ADM / DiT)
};

/// Sampler algorithms. Values only grow; 0 is never a real sampler.
enum class SamplerKind {
  kEulerRF = 1,  ///< Euler on the rectified-flow ODE; needs Prediction::kFlow
  kDdim = 2,     ///< deterministic DDIM (eta = 0); needs Prediction::kEpsilon
};

/// "euler_rf" -> kEulerRF, "ddim" -> kDdim; anything else is invalid_argument.
Result<SamplerKind> parse_sampler(std::string_view name);
/// Stable name ("euler_rf", "ddim"); the inverse of parse_sampler.
const char* sampler_name(SamplerKind kind);

/// The Euler RF `shift` of FLUX.2's schedule (upstream get_schedule: the time shift
/// exp(mu) / (exp(mu) + 1/t - 1), mu fitted empirically from the image token count and the
/// step count): exp(mu), so Sampler::make(kEulerRF, steps, kFlow, shift) gives the same
/// timesteps. `image_tokens` counts the generated image's tokens (not reference or text).
double flux2_schedule_shift(int image_tokens, int steps);

/// Checks an img2img strength: finite and in (0, 1].
Status validate_strength(double strength);

class Sampler {
 public:
  /// Maximum number of steps make() accepts (the training schedule has 1000 timesteps).
  static constexpr int kMaxSteps = 1000;
  /// Training timesteps of the DDPM schedule used by DDIM.
  static constexpr int kTrainTimesteps = 1000;

  /// Builds a schedule of `steps` steps.
  ///
  /// Euler RF: t_i = linspace(1, 0, steps + 1), shifted as t' = shift t / (1 + (shift - 1) t)
  /// (shift > 0; 1 = no shift). DDIM: the ADM/DiT linear beta schedule (1000 training steps,
  /// beta from 1e-4 to 0.02) with "trailing" timesteps t_i = round(1000 - i * 1000 / steps) - 1,
  /// so step 0 always runs at t = 999 (closest to pure noise, which img2img at strength 1 and
  /// text-to-image start from) and the last step lands on alpha_bar = 1. `shift` must be 1 for
  /// DDIM. Errors (invalid_argument): steps outside [1, 1000], prediction not matching the sampler,
  /// bad shift.
  static Result<Sampler> make(SamplerKind kind, int steps, Prediction prediction,
                              double shift = 1.0);

  SamplerKind kind() const { return kind_; }
  Prediction prediction() const { return prediction_; }
  int steps() const { return steps_; }

  /// The timestep the network is conditioned on at step i in [0, steps): Euler RF t_i * 1000
  /// (a real number), DDIM the integer training timestep.
  double model_timestep(int i) const;

  /// Coefficients of the forward process at `level` in [0, steps]:
  /// x_level = signal_scale(level) * x0 + noise_scale(level) * noise.
  /// Euler RF: (1 - t, t); DDIM: (sqrt(abar), sqrt(1 - abar)); level == steps gives (1, 0).
  double signal_scale(int level) const;
  double noise_scale(int level) const;

  /// x0 noised to `level` in [0, steps]; level == steps returns a copy of x0. Shapes and dtypes
  /// of x0 and noise must match.
  at::Tensor add_noise(const at::Tensor& x0, const at::Tensor& noise, int level) const;

  /// One update: x at level i -> x at level i + 1, given the network's `prediction` at step i.
  at::Tensor step(const at::Tensor& x, const at::Tensor& prediction, int i) const;
  /// As step(), but lands on `level` in (i, steps] instead of i + 1: the same update over a
  /// longer interval (Euler along the predicted velocity; DDIM through the predicted clean
  /// sample). Lets an overloaded scheduler drop steps of a request without restarting it.
  at::Tensor step_to(const at::Tensor& x, const at::Tensor& prediction, int i, int level) const;

  /// The clean sample implied by `prediction` at step i (for previews).
  at::Tensor predict_x0(const at::Tensor& x, const at::Tensor& prediction, int i) const;

  /// First step to run for img2img at `strength` (validate it with validate_strength first):
  /// round((1 - strength) * steps), clamped to [0, steps - 1] so that at least one step runs.
  /// Strength 1 starts at 0 (pure noise).
  int start_step(double strength) const;

 private:
  Sampler(SamplerKind kind, Prediction prediction, int steps);
  void check_step(int i) const;
  void check_level(int level) const;

  SamplerKind kind_;
  Prediction prediction_;
  int steps_;
  // Euler RF: sigma t at each level [steps + 1]. DDIM: alpha_bar at each level [steps + 1]
  // (the last entry is 1).
  std::vector<double> levels_;
  // DDIM only: training timestep of each step [steps].
  std::vector<int> timesteps_;
};

}  // namespace infill
