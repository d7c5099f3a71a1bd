#pragma once
/// The training loop of infill-tiny's DiT: rectified-flow inpainting with prompt dropout for
/// classifier-free guidance, AdamW, an EMA of the weights, checkpoints every few hundred
/// steps. Every batch is drawn from a generator seeded with (seed, step), so a run resumed
/// from a checkpoint continues exactly as the uninterrupted run would have.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "common/status.h"
#include "model/latent_codec.h"
#include "model/manifest.h"
#include "loss_curve.h"
#include "wallpaper_dataset.h"

namespace infill::train {

struct TrainOptions {
  uint64_t seed = 1;
  int steps = 2400;
  int batch = 16;
  int crop = 256;
  /// The first `small_steps` steps train on small crops (a quarter of the tokens, so about
  /// three times the samples per second), the rest on `crop`-sized ones.
  int small_steps = 1500;
  int small_batch = 48;
  int small_crop = 128;
  double lr = 4e-4;
  int warmup_steps = 150;
  double ema_decay = 0.999;
  double prompt_dropout = 0.1;  ///< share of samples trained with the null prompt (CFG)
  int halo_tokens = 1;          ///< prompted tokens = masked tokens dilated by this (engine default)
  /// Share of training samples whose masked region is recoloured to a random colour word
  /// (recolour.h), so that the prompt, not the context, decides the region's colour.
  double recolour_share = 0.5;
  int checkpoint_every = 200;
  std::string work_dir;         ///< checkpoints and the loss log live here
};

/// Latents as the DiT sees them: (codec latent - shift) * scale.
struct LatentSpace {
  const LatentCodec* codec = nullptr;
  double scale = 1.0;
  double shift = 0.0;
};

/// Trains (or resumes) the DiT described by `config` and writes the EMA weights to
/// `dit_path` (F16 safetensors). `progress` receives one line per log interval.
Result<TrainResult> train_dit(const DitConfig& config, const Dataset& data, const LatentSpace& latents,
                              const TrainOptions& options, const std::string& dit_path,
                              const std::function<void(const std::string&)>& progress);

/// One training sample batch (exposed for tests and the benchmark's held-out edits).
struct Batch {
  at::Tensor crops;     ///< [B, 3, S, S] pixels
  at::Tensor masks;     ///< [B, S, S] pixel masks 0/1
  at::Tensor latents;   ///< [B, C, s, s] scaled latents
  at::Tensor latent_masks;  ///< [B, 1, s, s]
  at::Tensor prompts;   ///< [B, V] multi-hot words describing the masked region
  at::Tensor prompted;  ///< bool [B, L] tokens receiving the prompt
};
/// `recolour_share` of the samples get their masked region recoloured (recolour.h) before
/// they are encoded and labelled.
Batch make_batch(const std::vector<SourceImage>& images, const LatentSpace& latents, const DitConfig& config,
                 int batch, int crop, int halo_tokens, bool augment, at::Generator& gen, double recolour_share = 0.0);

/// Mean RGB of `crop` [3, S, S] under `mask` [S, S] (weights), or of the whole crop when the
/// mask is empty.
std::array<double, 3> masked_mean_colour(const at::Tensor& crop, const at::Tensor& mask);

}  // namespace infill::train
