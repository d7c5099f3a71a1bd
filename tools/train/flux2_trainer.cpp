#include "flux2_trainer.h"

#include <torch/torch.h>

#include "colour_words.h"
#include "pipeline/flux2_sequence.h"
#include "random_masks.h"
#include "recolour.h"
#include "train_flux2.h"
#include "trainer.h"
#include "training_loop.h"

namespace infill::train {

namespace {

// [B, C, h, w] -> [B, h * w, C] token rows, row-major as the engine's latent_to_tokens.
torch::Tensor to_tokens(const torch::Tensor& latent) { return latent.flatten(2).transpose(1, 2).contiguous(); }

// Velocity MSE on the masked tokens of one batch, at levels and noise drawn from `gen`.
torch::Tensor flow_loss(TrainFlux2& model, const Flux2Batch& b, at::Generator& gen) {
  const int64_t B = b.target_latent.size(0), N = b.target_latent.size(1);
  torch::Tensor t = torch::sigmoid(at::randn({B}, gen));  // logit-normal levels
  torch::Tensor noise = at::randn(b.target_latent.sizes(), gen);
  torch::Tensor tt = t.view({B, 1, 1});
  torch::Tensor noisy = (1 - tt) * b.target_latent + tt * noise;
  torch::Tensor img = torch::cat({torch::cat({noisy, b.mask_cells}, 2),
                                  torch::cat({b.reference_latent, torch::zeros_like(b.mask_cells)}, 2)},
                                 1);
  const torch::Tensor txt_ids = flux2_text_ids(b.text.size(1));
  const torch::Tensor img_ids = torch::cat({flux2_grid_ids(b.grid, b.grid, 0), flux2_grid_ids(b.grid, b.grid, kFlux2ReferenceTime)});
  torch::Tensor pred = model->forward(b.text, txt_ids, img, img_ids, t, N);
  torch::Tensor w = b.masked_tokens.unsqueeze(2).expand_as(pred);
  return ((pred - (noise - b.target_latent)).pow(2) * w).sum() / w.sum().clamp_min(1.0);
}

}  // namespace

uint64_t caption_decision(uint64_t draw, uint64_t salt) { return (draw ^ salt) * 0x9E3779B97F4A7C15ull; }

bool within_share(uint64_t decision, double share) { return double(decision >> 11) * 0x1.0p-53 < share; }

Result<Flux2Batch> make_flux2_batch(const std::vector<SourceImage>& images, const LatentCodec& codec, const Flux2Config& config,
                                    const Flux2TrainText& text, int batch, int crop, bool augment, at::Generator& gen,
                                    double recolour_share, double prompt_dropout, double distractor_share) {
  torch::NoGradGuard no_grad;
  Flux2Batch b;
  const int f = codec.factor();
  CropOptions crop_options;
  crop_options.size = crop;
  crop_options.augment = augment;
  b.templates = random_crops(images, batch, crop_options, gen);
  MaskOptions mask_options;
  mask_options.size = crop;
  b.masks = random_masks(mask_options, batch, gen);
  const at::Tensor recolour_draw = at::rand({batch}, gen);
  const at::Tensor recolour_word = at::randint(kColourWords, {batch}, gen);
  const at::Tensor drop_draw = at::rand({batch}, gen);
  const at::Tensor caption_draw = at::randint(0, int64_t{1} << 62, {batch}, gen);
  std::vector<at::Tensor> targets, cells, rows;
  for (int i = 0; i < batch; ++i) {
    const bool recolour = recolour_draw[i].item<double>() < recolour_share;
    targets.push_back(recolour ? recolour_masked_region(b.templates[i], b.masks[i],
                                                        static_cast<int>(recolour_word[i].item<int64_t>()))
                               : b.templates[i]);
    b.words.push_back(describe_colour(masked_mean_colour(targets.back(), b.masks[i])));
    const bool dropped = drop_draw[i].item<double>() < prompt_dropout;
    const uint64_t draw = static_cast<uint64_t>(caption_draw[i].item<int64_t>());
    std::string caption = dropped ? std::string() : text.caption(b.words.back(), draw);
    if (!dropped && distractor_share > 0 && text.distract) {
      const uint64_t decision = caption_decision(draw, 0xd15d15d15ull);
      if (within_share(decision, distractor_share)) caption = text.distract(caption, decision);
    }
    b.captions.push_back(std::move(caption));
    INFILL_ASSIGN_OR_RETURN(at::Tensor encoded, text.encode(b.captions.back()));
    rows.push_back(encoded);
    cells.push_back(flux2_mask_rows(b.masks[i], f, config.mask_cells()));
  }
  b.targets = torch::stack(targets);
  b.target_latent = to_tokens(codec.encode(b.targets));
  b.reference_latent = to_tokens(codec.encode(b.templates));
  b.mask_cells = torch::stack(cells);
  b.masked_tokens = (torch::max_pool2d(b.masks.unsqueeze(1), f, f).flatten(1) > 0.5).to(torch::kFloat);
  b.text = torch::stack(rows);
  b.grid = crop / f;
  if (b.target_latent.size(2) != config.in_channels) {
    return invalid_argument("the codec's latent has " + std::to_string(b.target_latent.size(2)) +
                            " channels, the transformer reads " + std::to_string(config.in_channels));
  }
  return b;
}

Result<TrainResult> train_flux2(const Flux2Config& config, const Dataset& data, const LatentCodec& codec,
                                const Flux2TrainText& text, const Flux2TrainOptions& options, const std::string& path,
                                const std::function<void(const std::string&)>& progress) {
  torch::manual_seed(options.seed);
  TrainFlux2 model(config), ema(config);
  // A fixed held-out batch (no augmentation) tracks generalisation along the run.
  at::Generator held_gen = step_generator(options.seed ^ 0x5eedull, -1);
  INFILL_ASSIGN_OR_RETURN(const Flux2Batch held, make_flux2_batch(data.held_out, codec, config, text, 24, options.crop,
                                                                  false, held_gen, options.recolour_share, 0.0));
  LoopOptions loop = loop_options_of(options, "transformer");
  loop.init_from = options.init_from;
  auto step_loss = [&](torch::nn::Module&, int step, at::Generator& gen) {
    const bool small = step < options.small_steps;
    auto b = make_flux2_batch(data.train, codec, config, text, small ? options.small_batch : options.batch,
                              small ? options.small_crop : options.crop, true, gen, options.recolour_share,
                              options.prompt_dropout, options.distractor_share);
    // The text encoder failing is not a training problem: stop with its error.
    TORCH_CHECK(b.ok(), "training batch: ", b.status().message());
    return flow_loss(model, *b, gen);
  };
  auto held_out_loss = [&](torch::nn::Module&, int step) {
    at::Generator eval_gen = step_generator(options.seed ^ 0xe7a1ull, step);
    return flow_loss(ema, held, eval_gen).item<double>();
  };
  TrainResult result;
  try {
    INFILL_ASSIGN_OR_RETURN(result, run_training(model.ptr(), ema.ptr(), loop, step_loss, held_out_loss, progress));
  } catch (const c10::Error& e) {
    return invalid_argument(std::string("training the transformer stopped: ") + e.what_without_backtrace());
  }
  INFILL_RETURN_IF_ERROR(export_flux2(ema, path));
  return result;
}

}  // namespace infill::train
