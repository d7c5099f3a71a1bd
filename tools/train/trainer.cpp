#include "trainer.h"

#include <torch/torch.h>

#include "colour_words.h"
#include "random_masks.h"
#include "recolour.h"
#include "train_dit.h"
#include "training_loop.h"

namespace infill::train {

std::array<double, 3> masked_mean_colour(const at::Tensor& crop, const at::Tensor& mask) {
  torch::NoGradGuard no_grad;
  const double total = mask.sum().item<double>();
  at::Tensor m = total > 0 ? (crop * mask.unsqueeze(0)).flatten(1).sum(1) / total : crop.flatten(1).mean(1);
  return {m[0].item<double>(), m[1].item<double>(), m[2].item<double>()};
}

Batch make_batch(const std::vector<SourceImage>& images, const LatentSpace& latents, const DitConfig& config,
                 int batch, int crop, int halo_tokens, bool augment, at::Generator& gen, double recolour_share) {
  torch::NoGradGuard no_grad;
  Batch b;
  CropOptions crop_options;
  crop_options.size = crop;
  crop_options.augment = augment;
  b.crops = random_crops(images, batch, crop_options, gen);
  MaskOptions mask_options;
  mask_options.size = crop;
  b.masks = random_masks(mask_options, batch, gen);
  if (recolour_share > 0) {
    const at::Tensor draw = at::rand({batch}, gen);
    const at::Tensor words = at::randint(kColourWords, {batch}, gen);
    std::vector<at::Tensor> crops;
    for (int i = 0; i < batch; ++i) {
      crops.push_back(draw[i].item<double>() < recolour_share
                          ? recolour_masked_region(b.crops[i], b.masks[i], static_cast<int>(words[i].item<int64_t>()))
                          : b.crops[i]);
    }
    b.crops = torch::stack(crops);
  }
  const int f = latents.codec->factor();
  b.latents = (latents.codec->encode(b.crops) - latents.shift) * latents.scale;
  b.latent_masks = torch::max_pool2d(b.masks.unsqueeze(1), f, f);
  const int p = config.patch_size;
  at::Tensor tokens = torch::max_pool2d(b.latent_masks, p, p);
  if (halo_tokens > 0) tokens = torch::max_pool2d(tokens, 2 * halo_tokens + 1, 1, halo_tokens);
  b.prompted = tokens.flatten(1) > 0.5;
  b.prompts = torch::zeros({batch, config.conditioning_dim});
  for (int i = 0; i < batch; ++i) {
    for (int word : describe_colour(masked_mean_colour(b.crops[i], b.masks[i]))) b.prompts[i][word] = 1.0f;
  }
  return b;
}

namespace {

// Rectified-flow inpainting loss of one batch: MSE of the velocity on masked latent pixels.
torch::Tensor flow_loss(TrainDit& model, const Batch& b, double prompt_dropout, at::Generator& gen) {
  const int64_t n = b.latents.size(0);
  torch::Tensor t = torch::sigmoid(at::randn({n}, gen));  // logit-normal levels
  torch::Tensor noise = at::randn(b.latents.sizes(), gen);
  torch::Tensor tt = t.view({n, 1, 1, 1});
  torch::Tensor noisy = (1 - tt) * b.latents + tt * noise;
  torch::Tensor known = b.latents * (1 - b.latent_masks);
  torch::Tensor input = torch::cat({noisy, known, b.latent_masks}, 1);
  torch::Tensor keep = (at::rand({n, 1}, gen) >= prompt_dropout).to(torch::kFloat);
  torch::Tensor pred = model->forward(input, t * 1000.0, b.prompts * keep, b.prompted);
  torch::Tensor target = noise - b.latents;
  torch::Tensor w = b.latent_masks.expand_as(pred);
  return ((pred - target).pow(2) * w).sum() / w.sum().clamp_min(1.0);
}

}  // namespace

Result<TrainResult> train_dit(const DitConfig& config, const Dataset& data, const LatentSpace& latents,
                              const TrainOptions& options, const std::string& dit_path,
                              const std::function<void(const std::string&)>& progress) {
  torch::manual_seed(options.seed);
  TrainDit model(config), ema(config);
  // A fixed held-out batch (no augmentation) tracks generalisation along the run.
  at::Generator held_gen = step_generator(options.seed ^ 0x5eedull, -1);
  const Batch held = make_batch(data.held_out, latents, config, 32, options.crop, options.halo_tokens, false, held_gen);
  const LoopOptions loop = loop_options_of(options, "DiT");
  auto step_loss = [&](torch::nn::Module&, int step, at::Generator& gen) {
    const bool small = step < options.small_steps;
    const Batch b = make_batch(data.train, latents, config, small ? options.small_batch : options.batch,
                               small ? options.small_crop : options.crop, options.halo_tokens, true, gen,
                               options.recolour_share);
    return flow_loss(model, b, options.prompt_dropout, gen);
  };
  auto held_out_loss = [&](torch::nn::Module&, int step) {
    at::Generator eval_gen = step_generator(options.seed ^ 0xe7a1ull, step);
    return flow_loss(ema, held, 0.0, eval_gen).item<double>();
  };
  INFILL_ASSIGN_OR_RETURN(TrainResult result,
                          run_training(model.ptr(), ema.ptr(), loop, step_loss, held_out_loss, progress));
  INFILL_RETURN_IF_ERROR(export_dit(ema, dit_path));
  return result;
}

}  // namespace infill::train
