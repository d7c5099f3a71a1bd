#pragma once
/// The training recipe of infill-tiny 2's FLUX.2 transformer: rectified-flow inpainting as the
/// engine edits with it (engine/pipeline/flux2_edit_session.h). Per sample: a crop (the
/// template), a random mask, the target (the crop, or with its masked region recoloured), a
/// caption of the target region's colour words encoded by the frozen text encoder; the
/// sequence is [text, noisy target latent + mask cells, template latent as reference tokens
/// (t = 10) + zero cells]; the loss is the velocity's MSE on the masked tokens. Captions are
/// dropped (the empty prompt) for a share of samples, for classifier-free guidance.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "common/status.h"
#include "loss_curve.h"
#include "model/flux2_transformer.h"
#include "model/latent_codec.h"
#include "wallpaper_dataset.h"

namespace infill::train {

struct Flux2TrainOptions {
  uint64_t seed = 1;
  int steps = 3000;
  int batch = 12;
  int crop = 256;
  /// The first `small_steps` steps train on small crops (a quarter of the image tokens), the
  /// rest on `crop`-sized ones.
  int small_steps = 2000;
  int small_batch = 32;
  int small_crop = 128;
  double lr = 4e-4;
  int warmup_steps = 150;
  double ema_decay = 0.999;
  double prompt_dropout = 0.1;  ///< share of samples trained with the empty prompt
  double recolour_share = 0.5;  ///< share of samples whose masked region is recoloured
  int checkpoint_every = 200;
  std::string work_dir;         ///< the checkpoint lives in work_dir/checkpoint
  std::string init_from;        ///< LoopOptions::init_from: an earlier stage's checkpoint folder
  /// Share of captions given distractor words (Flux2TrainText::distract); 0 = none.
  double distractor_share = 0.0;
};

/// The frozen text side the transformer learns to read.
struct Flux2TrainText {
  /// Text rows [T, context_dim] of a prompt (the engine's encoder: same rows as at run time).
  std::function<Result<at::Tensor>(const std::string& prompt)> encode;
  /// A caption naming `words` (colour_words.h indices), phrasing picked by `draw`.
  std::function<std::string(const std::vector<int>& words, uint64_t draw)> caption;
  /// The caption with distractor words added, picked by `draw` (used with distractor_share).
  std::function<std::string(const std::string& caption, uint64_t draw)> distract;
};

/// A value mixed from a caption's own draw and `salt`: each decision about a caption (distractor
/// words, capitals) is taken from its own salt, independent of the others and of the batch
/// generator, so a stage that adds one consumes the generator exactly as before.
uint64_t caption_decision(uint64_t draw, uint64_t salt);

/// Whether a caption_decision value falls in the first `share` of [0, 1).
bool within_share(uint64_t decision, double share);

/// One batch in the engine's token layout.
struct Flux2Batch {
  at::Tensor templates;  ///< [B, 3, S, S] crops as the designer's template
  at::Tensor targets;    ///< [B, 3, S, S] what the edit should give (recoloured or not)
  at::Tensor masks;      ///< [B, S, S] 0/1
  at::Tensor target_latent;     ///< [B, N, C] target latent tokens
  at::Tensor reference_latent;  ///< [B, N, C] template latent tokens
  at::Tensor mask_cells;        ///< [B, N, mask_channels]
  at::Tensor masked_tokens;     ///< [B, N] float 0/1: tokens touching the mask (the loss's)
  at::Tensor text;              ///< [B, T, context_dim]
  std::vector<std::string> captions;  ///< "" where the prompt was dropped
  std::vector<std::vector<int>> words;  ///< the target region's colour words
  int64_t grid = 0;             ///< tokens per side (S / codec factor)
};

Result<Flux2Batch> make_flux2_batch(const std::vector<SourceImage>& images, const LatentCodec& codec, const Flux2Config& config,
                                    const Flux2TrainText& text, int batch, int crop, bool augment, at::Generator& gen,
                                    double recolour_share, double prompt_dropout, double distractor_share = 0.0);

/// Trains (or resumes) the transformer described by `config` and writes the EMA weights to
/// `path` (F16 safetensors under upstream names). `progress` receives one line per log interval.
Result<TrainResult> train_flux2(const Flux2Config& config, const Dataset& data, const LatentCodec& codec,
                                const Flux2TrainText& text, const Flux2TrainOptions& options, const std::string& path,
                                const std::function<void(const std::string&)>& progress);

}  // namespace infill::train
