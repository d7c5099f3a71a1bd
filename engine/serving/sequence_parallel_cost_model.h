#pragma once
/// Step time of one whole-sequence denoising step run in Ulysses sequence parallel over
/// `degree` devices, for the round planner (round_planner.h) and the sequence-parallel
/// simulator (sequence_parallel_simulator.h). Pure C++, no libtorch.
///
/// The model, with L = tokens + text_tokens (the whole sequence, as a FLUX forward sees it):
///
///   single(L)  = fixed_ms + ms_per_token * L + ms_per_token_squared * L^2
///   step(L, d) = fixed_ms + (single(L) - fixed_ms) / d + all_to_all(L, d)
///   all_to_all(L, 1) = 0
///   all_to_all(L, d) = all_to_alls_per_step * (all_to_all_latency_ms
///                        + bytes_per_element * (L / d) * hidden * (d - 1) / d / link_bytes_per_ms)
///
/// fixed_ms does not shrink with the degree: every device holds all the weights and reads
/// them once per step, and launches the same kernels. The compute (linear layers and
/// attention) splits evenly over the degree, as Ulysses gives each device L / d rows for the
/// linear layers and heads / d heads for attention. Each all-to-all moves, over the group,
/// L x hidden elements x (d - 1) / d (what leaves each device); each device sends its 1/d of
/// that over its own link, so its time is that share over link_bytes_per_ms, plus a fixed
/// latency per collective. Ulysses runs four per attention layer (Q, K, V to head-split, the
/// output back to row-split).
///
/// Guided steps (classifier-free guidance: every step is two forwards of the same L rows, the
/// conditional and the unconditional half, whose predictions are then combined). Attention
/// does not cross the halves, so two sequences packed in one forward cost twice one
/// sequence's linear work and twice its attention (2 L^2, not (2L)^2); weights are read and
/// kernels launched once, and each all-to-all moves twice the rows at one latency:
///
///   packed(L, d) = fixed_ms + 2 (single(L) - fixed_ms) / d
///                  + all_to_alls_per_step * (all_to_all_latency_ms + 2 x bytes(L, d) / link)
///                = 2 step(L, d) - fixed_ms - all_to_alls_per_step * all_to_all_latency_ms
///                  (d > 1; at d = 1, 2 step(L, 1) - fixed_ms)
///   split(L, d)  = step(L, d) + exchange(L)     each half on its own d devices at once
///   exchange(L)  = all_to_all_latency_ms + 4 * tokens * prediction_channels / link_bytes_per_ms
///
/// with bytes(L, d) the per-device bytes of one all-to-all above. A split step runs on 2 d
/// devices; each device then needs the other half's prediction (float32, image rows x
/// prediction_channels) to combine them: one exchange. Split at d is never slower than packed
/// at 2 d (the same compute per device, fewer rows in each all-to-all), and needs 2 d free
/// devices rather than d.
///
/// Immutable; safe to share between threads for reading.

#include <cstdint>
#include <functional>

#include "common/status.h"

namespace infill {

/// Predicted milliseconds of one step of a `tokens`-token request at `degree` devices. The
/// round planner and the simulator take any such function; SequenceParallelCostModel::function
/// gives one.
using StepMsFunction = std::function<double(int64_t tokens, int degree)>;

/// Predicted milliseconds of one step of a guided `tokens`-token request (two forwards of its
/// sequence): `split` false, both halves packed in one forward over `degree` devices; true,
/// each half at once on its own `degree` devices (2 x degree in all), then their predictions
/// exchanged. SequenceParallelCostModel::guided_function gives one.
using GuidedStepMsFunction = std::function<double(int64_t tokens, int degree, bool split)>;

struct SequenceParallelCoefficients {
  int64_t text_tokens = 0;           ///< added to every request's tokens (the prompt's rows)
  double fixed_ms = 0;               ///< per step at any degree (weight reads, launches)
  double ms_per_token = 0;           ///< one device's linear layers, per sequence row
  double ms_per_token_squared = 0;   ///< one device's attention, per row squared
  int64_t hidden = 0;                ///< model width: an all-to-all moves rows x hidden elements
  int heads = 0;                     ///< attention heads: a degree must divide them
  int all_to_alls_per_step = 0;      ///< 4 per attention layer
  double all_to_all_latency_ms = 0;  ///< fixed cost of one all-to-all
  double bytes_per_element = 2;      ///< bf16
  double link_bytes_per_ms = 0;      ///< what one device's all-to-all moves per ms
  /// Channels of a step's prediction per image token (float32): what a split guided step's
  /// halves exchange. 0 = the exchange costs its latency only.
  int64_t prediction_channels = 0;
};

class SequenceParallelCostModel {
 public:
  /// Errors name the coefficient at fault: negative or non-finite values, hidden, heads or
  /// link_bytes_per_ms not positive, a single-device step that is not positive.
  static Result<SequenceParallelCostModel> create(const SequenceParallelCoefficients& c);

  /// FLUX.1-dev-sized transformer (hidden 3072, 24 heads, 19 double + 38 single blocks, 6.45B
  /// weights a row passes through: 12.9 GFLOP per row; attention 4 x 3072 x 57 FLOP per row
  /// pair; 512 text rows) on one H100 SXM per device, NVLink between them. Calibrated on one
  /// published figure: xDiT's FLUX.1-dev at 1024px, 28 steps, one H100, PyTorch without
  /// torch.compile, 6.71 s, i.e. 240 ms a step at 4096 image tokens (text encoding and VAE
  /// decode counted as steps, a few percent). fixed_ms 8 (24 GB of bf16 weights at
  /// 3.35 TB/s, 7.1 ms, plus launches); the compute rate that makes 4608 rows take 232 ms
  /// (about 320 TFLOP/s, a third of the H100's dense bf16 peak) gives the per-row
  /// coefficients. All-to-all: 20 us each, 200 GB/s per device (NVLink 4 moves 450 GB/s a
  /// direction; all-to-all reaches less). Prediction: 64 channels. Not measured here.
  static SequenceParallelCostModel flux1_dev_h100();
  /// FLUX.2 [klein] 4B-sized (hidden 3072, 24 heads, 5 double + 20 single blocks, about 3.9B
  /// weights, 512 text rows, a 128-channel prediction) on the same H100 and at the same
  /// compute rate as flux1_dev_h100.
  static SequenceParallelCostModel flux2_klein_4b_h100();

  /// step(tokens + text_tokens, degree) as in the header comment. degree >= 1.
  double step_ms(int64_t tokens, int degree) const;
  /// The communication part of step_ms (0 at degree 1).
  double all_to_all_ms(int64_t tokens, int degree) const;
  /// A guided step, packed(L, degree) or split(L, degree) as in the header comment.
  /// degree >= 1; a split step runs on 2 x degree devices.
  double guided_step_ms(int64_t tokens, int degree, bool split) const;
  /// What a split guided step's halves exchange: exchange(L) in the header comment.
  double guidance_exchange_ms(int64_t tokens) const;
  /// step_ms as a StepMsFunction (holds a copy of the model).
  StepMsFunction function() const;
  /// guided_step_ms as a GuidedStepMsFunction (holds a copy of the model).
  GuidedStepMsFunction guided_function() const;

  const SequenceParallelCoefficients& coefficients() const { return c_; }

 private:
  explicit SequenceParallelCostModel(const SequenceParallelCoefficients& c) : c_(c) {}
  SequenceParallelCoefficients c_;
};

}  // namespace infill
