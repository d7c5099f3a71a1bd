#pragma once
/// The optimisation loop every network of the bundled models trains with: AdamW with warm-up,
/// a constant rate and a linear decay over the last fifth, gradient clipping, an EMA of the
/// weights (the exported ones), a loss curve, a held-out loss of the EMA weights at every
/// checkpoint, and checkpoints that a later run resumes from. Every step draws its randomness
/// from a generator seeded with (seed, step), so a resumed run continues exactly as the
/// uninterrupted one would have (for the same thread count).

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "common/status.h"
#include "loss_curve.h"

namespace infill::train {

struct LoopOptions {
  uint64_t seed = 1;
  int steps = 1000;
  double lr = 4e-4;
  int warmup_steps = 150;
  double ema_decay = 0.999;
  double weight_decay = 0.0;
  double grad_clip = 1.0;
  int checkpoint_every = 200;
  int log_every = 10;
  std::string work_dir;  ///< the checkpoint lives in work_dir/checkpoint
  std::string name;      ///< what is trained, in progress lines ("transformer", "decoder")
  /// A later stage of the same network: the checkpoint folder of the stage before, whose
  /// weights and EMA weights this run starts from (with a fresh optimizer and schedule) when
  /// work_dir holds no checkpoint of its own. "" = start from the module's initialisation.
  std::string init_from;
};

/// The loop options of a recipe's own options (any struct with the fields seed, steps, lr,
/// warmup_steps, ema_decay, checkpoint_every and work_dir), naming what is trained.
template <class RecipeOptions>
LoopOptions loop_options_of(const RecipeOptions& o, const std::string& name) {
  LoopOptions loop;
  loop.seed = o.seed;
  loop.steps = o.steps;
  loop.lr = o.lr;
  loop.warmup_steps = o.warmup_steps;
  loop.ema_decay = o.ema_decay;
  loop.checkpoint_every = o.checkpoint_every;
  loop.work_dir = o.work_dir;
  loop.name = name;
  return loop;
}

/// The generator of step `step` of a run seeded with `seed`.
at::Generator step_generator(uint64_t seed, int64_t step);

/// The training loss of step `step` of `model` (with gradients), drawing from `gen`.
using StepLoss = std::function<torch::Tensor(torch::nn::Module& model, int step, at::Generator& gen)>;
/// The held-out loss of the EMA weights at `step` (called without gradients).
using HeldOutLoss = std::function<double(torch::nn::Module& ema, int step)>;

/// Trains `model` (resuming from options.work_dir/checkpoint when one exists) and leaves the
/// EMA weights in `ema` (same architecture). `progress` receives one line per log interval.
/// Errors: the work dir cannot be written, the checkpoint is corrupt (naming the file).
Result<TrainResult> run_training(const std::shared_ptr<torch::nn::Module>& model,
                                const std::shared_ptr<torch::nn::Module>& ema, const LoopOptions& options,
                                const StepLoss& step_loss, const HeldOutLoss& held_out_loss,
                                const std::function<void(const std::string&)>& progress);

}  // namespace infill::train
