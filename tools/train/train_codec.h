#pragma once
/// The training recipe of infill-tiny 2's codec decoder (engine/model/learned_decoder_codec.h):
/// the patch PCA encoder stays fixed (fitted by patch_pca_fit.h); a small convolutional
/// decoder learns to turn its latent back into the crop, through the shared training loop
/// (training_loop.h: AdamW, EMA, checkpoints, resume).
///
/// Why noisy latents: the decoder will decode latents that a diffusion model generated, whose
/// errors the PCA's patch decode shows as 8x8 squares. A share of every batch has Gaussian
/// noise of a random standard deviation added to its latent while the target stays the clean
/// crop, so the decoder learns to turn latent errors into smooth image errors.
///
/// TrainDecoder is the same network as the engine's decoder, written independently with
/// libtorch modules; its parameter names are the file's decoder names (without "decoder."),
/// so export is a rename-free copy. Tested against the engine's decode.

#include <cstdint>
#include <functional>
#include <string>

#include <torch/torch.h>

#include "common/status.h"
#include "loss_curve.h"
#include "model/learned_decoder_codec.h"
#include "model/patch_pca_codec.h"
#include "wallpaper_dataset.h"

namespace infill::train {

struct TrainDecoderImpl : torch::nn::Module {
  /// PyTorch's default conv initialisation. Throws c10::Error on an invalid config.
  explicit TrainDecoderImpl(const LearnedDecoderConfig& config);
  /// Codec latent [B, 4C, h, w] (normalised, 2x2-patchified) -> rgb [B, 3, 2f h, 2f w],
  /// not clamped (the engine clamps to [0, 1]; the loss sees the raw values).
  torch::Tensor forward(const torch::Tensor& latent);

  struct BlockImpl : torch::nn::Module {
    explicit BlockImpl(int width);
    torch::nn::Conv2d conv0{nullptr}, conv1{nullptr};
  };
  struct LevelImpl : torch::nn::Module {
    LevelImpl(int in_width, int width, int blocks, bool up);
    torch::nn::Conv2d up{nullptr};  // null at level 0
    std::vector<std::shared_ptr<BlockImpl>> blocks;
  };

  LearnedDecoderConfig cfg;
  torch::nn::Conv2d conv_in{nullptr}, conv_out{nullptr};
  std::vector<std::shared_ptr<LevelImpl>> levels;
};
TORCH_MODULE(TrainDecoder);

/// The engine codec of `pca` with `model`'s weights (float32, not rounded) and the latent
/// normalisation (scale, shift).
Result<LearnedDecoderCodec> to_engine_codec(const TrainDecoder& model, const PatchPcaCodec& pca,
                                            double scale, double shift);

/// Writes `model` with `pca` as one learned-decoder codec file (PCA F32, decoder F16) that
/// LearnedDecoderCodec::load reads.
Status export_codec(const TrainDecoder& model, const PatchPcaCodec& pca, double scale, double shift,
                    const std::string& path);

struct CodecTrainOptions {
  uint64_t seed = 1;
  int steps = 6000;
  int batch = 16;
  int crop = 128;  ///< training crop side in pixels (a multiple of the codec factor, 16)
  double lr = 2e-3;
  int warmup_steps = 100;
  double ema_decay = 0.999;
  /// Loss = L1(decode, crop) + gradient_weight * L1 of their horizontal and vertical pixel
  /// differences (which is where blocks and blur show).
  double gradient_weight = 0.5;
  double noise_share = 0.5;    ///< share of samples whose latent gets noise
  double noise_max_std = 0.5;  ///< noise std uniform in [0, this], in normalised latent units
  /// The latent normalisation: scale = 1 / std of the PCA latent over 256 training crops when
  /// 0, so that the transformer reads unit-std latents; shift = 0 (PCA latents are centred).
  double latent_scale = 0.0;
  LearnedDecoderConfig decoder;  ///< widths and blocks; the PCA's factor and channels override
  int checkpoint_every = 500;
  std::string work_dir;  ///< the checkpoint lives in work_dir/checkpoint
  /// Held-out evaluation at the end: this many crops of this side, and the noise std
  /// (normalised latent units) of the blockiness measure.
  int eval_crops = 32;
  int eval_crop = 256;
  double eval_noise_std = 0.3;
};

struct CodecTrainResult {
  TrainResult run;             ///< loss curves and training time (this process and earlier ones)
  double latent_scale = 1.0;   ///< as written to the file's metadata
  double held_out_psnr = 0.0;  ///< learned decoder, clean held-out latents, dB (mean per crop)
  double held_out_pca_psnr = 0.0;  ///< the PCA's patch decode of the same latents, dB
  /// Blockiness (image_metrics.h, periods 8 and 16) of decodes of held-out latents with noise
  /// of std eval_noise_std added, for the learned and the PCA decode, and of the clean crops.
  double blockiness8 = 0.0, blockiness16 = 0.0;
  double pca_blockiness8 = 0.0, pca_blockiness16 = 0.0;
  double crop_blockiness8 = 0.0, crop_blockiness16 = 0.0;
};

/// Trains (or resumes from options.work_dir/checkpoint) the decoder for `pca` on data.train,
/// writes the codec (EMA weights) to `codec_path` and evaluates the file on data.held_out.
/// Deterministic for a seed and thread count. `progress` receives one line per log interval.
/// Errors: invalid options or decoder config (naming the field), data.train or
/// data.held_out empty, the work dir or codec file cannot be written, a corrupt checkpoint.
Result<CodecTrainResult> train_codec(const PatchPcaCodec& pca, const Dataset& data,
                                     const CodecTrainOptions& options,
                                     const std::string& codec_path,
                                     const std::function<void(const std::string&)>& progress);

/// Mean PSNR (dB, per crop then averaged) of codec.decode(codec.encode(crops)) and of the
/// PCA decode of the same latents, crops [N, 3, S, S].
std::pair<double, double> held_out_psnr(const LearnedDecoderCodec& codec, const at::Tensor& crops);

}  // namespace infill::train
