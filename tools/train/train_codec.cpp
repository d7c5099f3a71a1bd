#include "train_codec.h"

#include <cmath>
#include <sstream>

#include "image_metrics.h"
#include "training_loop.h"

namespace infill::train {

namespace {

torch::nn::Conv2d conv3x3(int in, int out) {
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).padding(1));
}

// L1 of the pixels plus `gradient_weight` times L1 of the horizontal and vertical neighbour
// differences. pred and target [B, 3, S, S].
torch::Tensor decoder_loss(const torch::Tensor& pred, const torch::Tensor& target,
                           double gradient_weight) {
  const auto dx = [](const torch::Tensor& t) {
    return t.narrow(3, 1, t.size(3) - 1) - t.narrow(3, 0, t.size(3) - 1);
  };
  const auto dy = [](const torch::Tensor& t) {
    return t.narrow(2, 1, t.size(2) - 1) - t.narrow(2, 0, t.size(2) - 1);
  };
  torch::Tensor loss = (pred - target).abs().mean();
  if (gradient_weight > 0) {
    loss = loss + gradient_weight *
                      ((dx(pred) - dx(target)).abs().mean() + (dy(pred) - dy(target)).abs().mean());
  }
  return loss;
}

// Per-crop PSNR (dB, peak 1) of decoded [N, 3, S, S] against crops, averaged.
double mean_psnr(const at::Tensor& decoded, const at::Tensor& crops) {
  const at::Tensor mse = (decoded - crops).pow(2).flatten(1).mean(1).clamp_min(1e-12);
  return (-10.0 * at::log10(mse)).mean().item<double>();
}

double mean_blockiness(const at::Tensor& images, int period) {
  double sum = 0.0;
  for (int64_t i = 0; i < images.size(0); ++i) sum += blockiness(images[i], period);
  return sum / static_cast<double>(images.size(0));
}

Status check_options(const CodecTrainOptions& o, int factor) {
  const auto fail = [](const std::string& what) {
    return invalid_argument("codec training options: " + what);
  };
  if (o.steps < 1 || o.batch < 1 || o.checkpoint_every < 1 || o.warmup_steps < 1 ||
      o.eval_crops < 1) {
    return fail("steps, batch, checkpoint_every, warmup_steps and eval_crops must be positive");
  }
  if (o.crop < factor || o.crop % factor != 0 || o.eval_crop < factor ||
      o.eval_crop % factor != 0) {
    return fail("crop " + std::to_string(o.crop) + " and eval_crop " + std::to_string(o.eval_crop) +
                " must be positive multiples of the codec factor " + std::to_string(factor));
  }
  if (!(o.lr > 0) || !(o.noise_share >= 0 && o.noise_share <= 1) || !(o.noise_max_std >= 0) ||
      !(o.gradient_weight >= 0) || !(o.latent_scale >= 0) || !(o.eval_noise_std >= 0)) {
    return fail(
        "lr must be positive, noise_share in [0, 1], noise_max_std, gradient_weight, latent_scale "
        "and "
        "eval_noise_std not negative");
  }
  if (o.work_dir.empty()) return fail("work_dir is empty (the checkpoint lives there)");
  return {};
}

}  // namespace

TrainDecoderImpl::BlockImpl::BlockImpl(int width) {
  conv0 = register_module("conv0", conv3x3(width, width));
  conv1 = register_module("conv1", conv3x3(width, width));
}

TrainDecoderImpl::LevelImpl::LevelImpl(int in_width, int width, int block_count, bool with_up) {
  if (with_up) up = register_module("up", conv3x3(in_width, width));
  auto list = register_module("blocks", std::make_shared<torch::nn::Module>());
  for (int j = 0; j < block_count; ++j) {
    blocks.push_back(list->register_module(std::to_string(j), std::make_shared<BlockImpl>(width)));
  }
}

TrainDecoderImpl::TrainDecoderImpl(const LearnedDecoderConfig& config) : cfg(config) {
  const Status valid = cfg.validate();
  TORCH_CHECK(valid.ok(), valid.message());
  // Names as in the codec file: conv_in, levels.<k>.up, levels.<k>.blocks.<j>.conv0/1, conv_out.
  conv_in = register_module("conv_in", conv3x3(cfg.pca_channels, cfg.widths[0]));
  auto list = register_module("levels", std::make_shared<torch::nn::Module>());
  for (size_t k = 0; k < cfg.widths.size(); ++k) {
    levels.push_back(list->register_module(
        std::to_string(k), std::make_shared<LevelImpl>(k == 0 ? cfg.widths[0] : cfg.widths[k - 1],
                                                       cfg.widths[k], cfg.blocks[k], k > 0)));
  }
  conv_out = register_module("conv_out", conv3x3(cfg.widths.back(), 3));
}

torch::Tensor TrainDecoderImpl::forward(const torch::Tensor& latent) {
  // pixel_shuffle's channel c*4 + dy*2 + dx -> (c, 2y + dy, 2x + dx) is the codec's unpatchify.
  torch::Tensor x = torch::relu(conv_in(torch::pixel_shuffle(latent, 2)));
  for (const auto& level : levels) {
    if (level->up)
      x = torch::relu(level->up(torch::upsample_nearest2d(x, {2 * x.size(2), 2 * x.size(3)})));
    for (const auto& block : level->blocks)
      x = torch::relu(block->conv1(torch::relu(block->conv0(x))) + x);
  }
  return conv_out(x);
}

Result<LearnedDecoderCodec> to_engine_codec(const TrainDecoder& model, const PatchPcaCodec& pca,
                                            double scale, double shift) {
  std::vector<std::pair<std::string, at::Tensor>> weights;
  for (const auto& item : model->named_parameters())
    weights.emplace_back(item.key(), item.value().detach());
  return LearnedDecoderCodec::from_parts(pca, scale, shift, weights, "trained decoder");
}

Status export_codec(const TrainDecoder& model, const PatchPcaCodec& pca, double scale, double shift,
                    const std::string& path) {
  INFILL_ASSIGN_OR_RETURN(LearnedDecoderCodec codec, to_engine_codec(model, pca, scale, shift));
  return codec.save(path);
}

std::pair<double, double> held_out_psnr(const LearnedDecoderCodec& codec, const at::Tensor& crops) {
  c10::InferenceMode guard;
  const at::Tensor z = codec.encode(crops);
  return {mean_psnr(codec.decode(z), crops), mean_psnr(codec.decode_pca(z), crops)};
}

Result<CodecTrainResult> train_codec(const PatchPcaCodec& pca, const Dataset& data,
                                     const CodecTrainOptions& options,
                                     const std::string& codec_path,
                                     const std::function<void(const std::string&)>& progress) {
  LearnedDecoderConfig config = options.decoder;
  config.pca_factor = pca.factor();
  config.pca_channels = pca.latent_channels();
  INFILL_RETURN_IF_ERROR(config.validate());
  INFILL_RETURN_IF_ERROR(check_options(options, 2 * config.pca_factor));
  if (data.train.empty() || data.held_out.empty()) {
    return invalid_argument("codec training needs training and held-out images (got " +
                            std::to_string(data.train.size()) + " and " +
                            std::to_string(data.held_out.size()) + ")");
  }
  CodecTrainResult result;
  CropOptions train_crops;
  train_crops.size = options.crop;
  CropOptions held_crops = train_crops;
  held_crops.augment = false;

  // The latent normalisation, a pure function of the seed and the data (so a resumed run
  // finds the same value).
  result.latent_scale = options.latent_scale;
  if (result.latent_scale == 0.0) {
    torch::NoGradGuard no_grad;
    at::Generator gen = step_generator(options.seed ^ 0x5ca1eull, -1);
    const double latent_sd =
        pca.encode(random_crops(data.train, 256, train_crops, gen)).std().item<double>();
    if (!(latent_sd > 0))
      return invalid_argument("codec training: the PCA latent of the training crops is constant");
    result.latent_scale = 1.0 / latent_sd;
  }
  const double scale = result.latent_scale, shift = 0.0;

  torch::manual_seed(options.seed);
  TrainDecoder model(config), ema(config);
  // Encoding goes through the engine codec, exactly as the transformer's training data will.
  INFILL_ASSIGN_OR_RETURN(const LearnedDecoderCodec encoder,
                          to_engine_codec(model, pca, scale, shift));
  const auto encode = [&](const at::Tensor& crops) { return encoder.encode(crops); };

  // A fixed held-out batch (clean latents) for the loop's held-out loss curve.
  at::Generator held_gen = step_generator(options.seed ^ 0x5eedull, -1);
  const torch::Tensor held_target = random_crops(data.held_out, 16, held_crops, held_gen).clone();
  const torch::Tensor held_latent = encode(held_target);

  const LoopOptions loop = loop_options_of(options, "decoder");
  auto step_loss = [&](torch::nn::Module&, int, at::Generator& gen) {
    // Crops come from InferenceMode; a clone is an ordinary tensor that autograd may keep.
    const torch::Tensor target = random_crops(data.train, options.batch, train_crops, gen).clone();
    torch::Tensor latent = encode(target);
    const int64_t b = latent.size(0);
    const torch::Tensor noisy = (at::rand({b}, gen) < options.noise_share).to(torch::kFloat);
    const torch::Tensor noise_std = at::rand({b}, gen) * options.noise_max_std * noisy;
    latent = latent + at::randn(latent.sizes(), gen) * noise_std.view({b, 1, 1, 1});
    return decoder_loss(model->forward(latent), target, options.gradient_weight);
  };
  auto held_out_loss = [&](torch::nn::Module&, int) {
    return decoder_loss(ema->forward(held_latent), held_target, options.gradient_weight)
        .item<double>();
  };
  try {
    INFILL_ASSIGN_OR_RETURN(
        result.run, run_training(model.ptr(), ema.ptr(), loop, step_loss, held_out_loss, progress));
  } catch (const c10::Error& e) {
    return invalid_argument(std::string("training the decoder stopped: ") +
                            e.what_without_backtrace());
  }

  // The shipped file, read back, is what gets evaluated.
  INFILL_RETURN_IF_ERROR(export_codec(ema, pca, scale, shift, codec_path));
  INFILL_ASSIGN_OR_RETURN(const LearnedDecoderCodec codec, LearnedDecoderCodec::load(codec_path));
  c10::InferenceMode guard;
  at::Generator eval_gen = step_generator(options.seed ^ 0xe7a1ull, -1);
  CropOptions eval_crops = held_crops;
  eval_crops.size = options.eval_crop;
  const at::Tensor crops = random_crops(data.held_out, options.eval_crops, eval_crops, eval_gen);
  std::tie(result.held_out_psnr, result.held_out_pca_psnr) = held_out_psnr(codec, crops);
  const at::Tensor z = codec.encode(crops);
  const at::Tensor noisy = z + at::randn(z.sizes(), eval_gen) * options.eval_noise_std;
  const at::Tensor learned = codec.decode(noisy), patches = codec.decode_pca(noisy);
  result.blockiness8 = mean_blockiness(learned, 8);
  result.blockiness16 = mean_blockiness(learned, 16);
  result.pca_blockiness8 = mean_blockiness(patches, 8);
  result.pca_blockiness16 = mean_blockiness(patches, 16);
  result.crop_blockiness8 = mean_blockiness(crops, 8);
  result.crop_blockiness16 = mean_blockiness(crops, 16);
  std::ostringstream line;
  line << "decoder: held-out PSNR " << result.held_out_psnr << " dB (PCA patch decode "
       << result.held_out_pca_psnr << " dB); blockiness of noisy latents (std "
       << options.eval_noise_std << ") 8/16: " << result.blockiness8 << "/" << result.blockiness16
       << " (PCA " << result.pca_blockiness8 << "/" << result.pca_blockiness16 << ", clean crops "
       << result.crop_blockiness8 << "/" << result.crop_blockiness16 << ")";
  progress(line.str());
  return result;
}

}  // namespace infill::train
