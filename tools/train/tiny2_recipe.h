#pragma once
/// The recipe of the bundled model infill-tiny 2, end to end: data, codec (patch PCA encoder
/// fitted in closed form + a learned convolutional decoder), text side (a byte-level BPE
/// tokenizer trained on the caption corpus + a small Qwen3-architecture encoder with fixed
/// seeded weights), and the FLUX.2 transformer trained on the engine's codec and text rows.
/// Writes a model folder in the diffusers layout the engine loads (model/flux2_folder.h).
/// Every stage is deterministic for a seed and thread count and resumes from its checkpoint
/// under the work directory, so the recipe may span several runs.

#include <cstdint>
#include <functional>
#include <string>

#include "common/status.h"

namespace infill::train {

struct Tiny2Options {
  std::string out;       ///< the model folder to write
  std::string work_dir;  ///< checkpoints: work_dir/decoder, work_dir/transformer, work_dir/transformer-distractors,
                         ///< work_dir/transformer-capitals
  uint64_t seed = 1;
  int threads = 2;
  // Codec.
  int pca_channels = 8;  ///< 8x8 patches -> 8 channels; tokens are 2x2 of them (32 channels)
  int decoder_steps = 4000;
  // Text.
  int vocab_size = 1024;
  int max_sequence_length = 40;  ///< text rows per prompt (chat wrapper + caption; the longest held-out caption takes 33)
  int text_hidden = 128;
  int text_layers = 3;
  // Transformer.
  int hidden = 192;
  int heads = 3;
  int double_blocks = 2;
  int single_blocks = 4;
  int transformer_steps = 3200;
  int small_steps = 2200;
  double lr = 4e-4;
  /// Share of crops whose masked region is recoloured: only the prompt tells their colour.
  double recolour_share = 0.7;
  /// A second transformer stage from the first one's final weights: large crops, captions
  /// with distractor words (add_distractors) in `distractor_share` of them, its own warm-up
  /// and decay; 0 steps = none.
  int distractor_steps = 600;
  double distractor_share = 0.6;
  double distractor_lr = 2e-4;
  /// A third transformer stage from the last one's final weights: as the second, but with a
  /// `capitals_share` of its captions, distractor words included, in capitals ("MAKE IT
  /// PURPLE"), which the first two show in one caption of ten; 0 steps = none.
  int capitals_steps = 240;
  double capitals_share = 0.4;
  double capitals_lr = 1.5e-4;
  /// Stop after this stage ("codec", "text", "transformer"); empty runs every stage.
  std::string stop_after;
};

/// Runs (or resumes) every stage and writes the folder. `progress` receives log lines.
Status make_infill_tiny2(const Tiny2Options& options, const std::function<void(const std::string&)>& progress);

}  // namespace infill::train
