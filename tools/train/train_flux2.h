#pragma once
/// The FLUX.2 transformer as a trainable libtorch module, for the bundled model infill-tiny 2.
/// Parameter names are the upstream (BFL) checkpoint names that engine/model/flux2_transformer.h
/// loads, so export is a rename-free copy; the engine's forward (written for inference over
/// packed, partly cached segments) is tested against this module, an independent batched
/// implementation of the same maths (black-forest-labs/flux2 src/flux2/model.py).
///
/// Batch layout: every sample has the same sequence [text T, image N, reference N]:
///   txt [B, T, context_dim] text rows; img [B, 2N, in_channels + mask_channels] image rows
///   (noisy latent + mask cells) then reference rows (clean latent + zero cells);
///   ids: txt_ids [T, 4], img_ids [2N, 4] (t, h, w, l) position ids shared by the batch;
///   t [B] flow levels in [0, 1]. forward returns the prediction of the first N image rows:
///   [B, N, in_channels].

#include <string>

#include <torch/torch.h>

#include "common/status.h"
#include "model/flux2_transformer.h"

namespace infill::train {

struct TrainFlux2Impl : torch::nn::Module {
  explicit TrainFlux2Impl(const Flux2Config& config);
  torch::Tensor forward(const torch::Tensor& txt, const torch::Tensor& txt_ids, const torch::Tensor& img,
                        const torch::Tensor& img_ids, const torch::Tensor& t, int64_t predicted_rows);
  /// Linear layers as libtorch initialises them (Kaiming uniform); the modulation and the final
  /// projection zero, so every block starts as the identity and the first prediction is 0
  /// (adaLN-Zero, as DiT trains); QK norm scales one.
  void initialise();

  Flux2Config cfg;

  struct StreamImpl {  // one stream of a double block: "img_*" or "txt_*"
    torch::nn::Linear qkv{nullptr}, proj{nullptr}, mlp_in{nullptr}, mlp_out{nullptr};
    torch::Tensor q_scale, k_scale;
  };
  struct SingleImpl {
    torch::nn::Linear linear1{nullptr}, linear2{nullptr};
    torch::Tensor q_scale, k_scale;
  };
  torch::nn::Linear img_in{nullptr}, txt_in{nullptr}, time_in0{nullptr}, time_in1{nullptr};
  torch::nn::Linear mod_img{nullptr}, mod_txt{nullptr}, mod_single{nullptr}, final_ada{nullptr}, final_linear{nullptr};
  std::vector<std::pair<std::shared_ptr<StreamImpl>, std::shared_ptr<StreamImpl>>> doubles;  // (img, txt)
  std::vector<std::shared_ptr<SingleImpl>> singles;
};
TORCH_MODULE(TrainFlux2);

/// Writes the parameters (e.g. an EMA copy) under their checkpoint names as F16 safetensors,
/// the file Flux2Transformer::load reads.
Status export_flux2(const TrainFlux2& model, const std::string& path);

}  // namespace infill::train
