#pragma once
/// The inpainting DiT of infill-tiny as a trainable libtorch module. Parameter names are the
/// DiT checkpoint names that engine/model/dit.h loads, so export is a rename-free copy; the
/// engine's forward (written for inference with packed masked tokens) is tested against
/// this module, an independent implementation of the same maths.
///
/// Batch layout: x [B, C_in, h, w] model input (noisy latent, masked template latent, mask),
/// t [B] model timesteps (flow level * 1000), y [B, V] multi-hot prompt (zeros = null
/// prompt), prompted bool [B, L] tokens that receive the prompt (the rest get the null one).

#include <string>

#include <torch/torch.h>

#include "model/manifest.h"

namespace infill::train {

struct TrainDitImpl : torch::nn::Module {
  explicit TrainDitImpl(const DitConfig& config);
  /// Returns the velocity prediction [B, C, h, w].
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& t, const torch::Tensor& y,
                        const torch::Tensor& prompted);
  /// DiT initialisation: Xavier-uniform linears, zero adaLN and zero final layer.
  void initialise();

  DitConfig cfg;
  torch::nn::Conv2d x_proj{nullptr};
  torch::nn::Linear t_mlp0{nullptr}, t_mlp2{nullptr}, y_mlp0{nullptr}, y_mlp2{nullptr};
  struct BlockImpl : torch::nn::Module {
    BlockImpl(int hidden, int mlp_hidden);
    torch::nn::Linear qkv{nullptr}, proj{nullptr}, fc1{nullptr}, fc2{nullptr}, ada{nullptr};
  };
  std::vector<std::shared_ptr<BlockImpl>> blocks;
  torch::nn::Linear final_ada{nullptr}, final_linear{nullptr};
  torch::Tensor positions;  // [L, H] buffer for the training grid; recomputed per grid
};
TORCH_MODULE(TrainDit);

/// Exports parameters (e.g. an EMA copy) under their checkpoint names as an F16 safetensors
/// file that Dit::load reads.
Status export_dit(const TrainDit& model, const std::string& path);

}  // namespace infill::train
