#include "trainer.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "colour_words.h"
#include "random_masks.h"
#include "recolour.h"
#include "train_dit.h"

namespace infill::train {

namespace fs = std::filesystem;

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
  std::vector<at::Tensor> masks;
  for (int i = 0; i < batch; ++i) masks.push_back(random_mask(mask_options, gen));
  b.masks = torch::stack(masks);
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

at::Generator step_generator(uint64_t seed, int64_t step) {
  return at::make_generator<at::CPUGeneratorImpl>(seed * 1000003ull + static_cast<uint64_t>(step));
}

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

struct RunState {
  int step = 0;
  double seconds = 0.0;
  std::vector<LossPoint> curve, held_out_curve;
};

nlohmann::json to_json(const std::vector<LossPoint>& curve) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& p : curve) a.push_back({p.step, p.loss, p.seconds});
  return a;
}
std::vector<LossPoint> from_json(const nlohmann::json& a) {
  std::vector<LossPoint> curve;
  for (const auto& p : a) curve.push_back({p[0].get<int>(), p[1].get<double>(), p[2].get<double>()});
  return curve;
}

Status save_checkpoint(const std::string& dir, const TrainDit& model, const TrainDit& ema,
                       const torch::optim::AdamW& optimizer, const RunState& state) {
  const std::string tmp = dir + "/checkpoint.tmp";
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) return io_error("cannot create " + tmp + ": " + ec.message());
  torch::save(model, tmp + "/model.pt");
  torch::save(ema, tmp + "/ema.pt");
  torch::save(optimizer, tmp + "/optimizer.pt");
  nlohmann::json j = {{"step", state.step}, {"seconds", state.seconds}, {"curve", to_json(state.curve)},
                      {"held_out_curve", to_json(state.held_out_curve)}};
  std::ofstream(tmp + "/state.json") << j.dump();
  // Replace the previous checkpoint only once the new one is complete.
  fs::remove_all(dir + "/checkpoint", ec);
  fs::rename(tmp, dir + "/checkpoint", ec);
  if (ec) return io_error("cannot move checkpoint into " + dir + ": " + ec.message());
  return {};
}

std::string format_duration(double seconds) {
  const int s = static_cast<int>(seconds);
  std::ostringstream out;
  out << s / 3600 << "h" << (s / 60) % 60 << "m" << s % 60 << "s";
  return out.str();
}

}  // namespace

Result<TrainResult> train_dit(const DitConfig& config, const Dataset& data, const LatentSpace& latents,
                              const TrainOptions& options, const std::string& dit_path,
                              const std::function<void(const std::string&)>& progress) {
  std::error_code ec;
  fs::create_directories(options.work_dir, ec);
  if (ec) return io_error("cannot create work dir " + options.work_dir + ": " + ec.message());
  torch::manual_seed(options.seed);
  TrainDit model(config), ema(config);
  {
    torch::NoGradGuard no_grad;
    auto src = model->parameters();
    auto dst = ema->parameters();
    for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
  }
  for (auto& p : ema->parameters()) p.set_requires_grad(false);
  torch::optim::AdamW optimizer(model->parameters(),
                                torch::optim::AdamWOptions(options.lr).betas({0.9, 0.99}).weight_decay(0.0));
  RunState state;
  const std::string ckpt = options.work_dir + "/checkpoint";
  if (fs::exists(ckpt + "/state.json")) {
    torch::load(model, ckpt + "/model.pt");
    torch::load(ema, ckpt + "/ema.pt");
    torch::load(optimizer, ckpt + "/optimizer.pt");
    std::ifstream in(ckpt + "/state.json");
    nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    if (j.is_discarded()) return corrupt_data(ckpt + "/state.json is not valid JSON; delete the checkpoint to restart");
    state.step = j["step"].get<int>();
    state.seconds = j["seconds"].get<double>();
    state.curve = from_json(j["curve"]);
    state.held_out_curve = from_json(j["held_out_curve"]);
    progress("resuming from step " + std::to_string(state.step) + " (" + ckpt + ")");
  }
  // A fixed held-out batch (no augmentation) tracks generalisation along the run.
  at::Generator held_gen = step_generator(options.seed ^ 0x5eedull, -1);
  const Batch held = make_batch(data.held_out, latents, config, 32, options.crop, options.halo_tokens, false, held_gen);

  const auto start = std::chrono::steady_clock::now();
  const double seconds_before = state.seconds;
  const int start_step = state.step;
  double loss_sum = 0.0;
  int loss_count = 0;
  constexpr int kLogEvery = 10;
  while (state.step < options.steps) {
    at::Generator gen = step_generator(options.seed, state.step);
    const bool small = state.step < options.small_steps;
    const Batch b = make_batch(data.train, latents, config, small ? options.small_batch : options.batch,
                               small ? options.small_crop : options.crop, options.halo_tokens, true, gen,
                               options.recolour_share);
    // Warm-up, then a constant rate, then a linear decay over the last fifth.
    double lr = options.lr * std::min(1.0, (state.step + 1.0) / options.warmup_steps);
    const double decay_from = 0.8 * options.steps;
    if (state.step > decay_from) lr *= 1.0 - 0.9 * (state.step - decay_from) / (options.steps - decay_from);
    for (auto& group : optimizer.param_groups()) static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
    optimizer.zero_grad();
    torch::Tensor loss = flow_loss(model, b, options.prompt_dropout, gen);
    loss.backward();
    torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
    optimizer.step();
    {
      torch::NoGradGuard no_grad;
      const double d = std::min(options.ema_decay, (1.0 + state.step) / (10.0 + state.step));
      auto src = model->parameters();
      auto dst = ema->parameters();
      for (size_t i = 0; i < src.size(); ++i) dst[i].mul_(d).add_(src[i].detach(), 1.0 - d);
    }
    loss_sum += loss.item<double>();
    ++loss_count;
    ++state.step;
    state.seconds = seconds_before + std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (state.step % kLogEvery == 0 || state.step == options.steps) {
      state.curve.push_back({state.step, loss_sum / loss_count, state.seconds});
      loss_sum = 0.0;
      loss_count = 0;
      const double per_step = (state.seconds - seconds_before) / (state.step - start_step);
      std::ostringstream line;
      line << "step " << state.step << "/" << options.steps << " loss " << state.curve.back().loss << " lr " << lr
           << " " << per_step << " s/step, elapsed " << format_duration(state.seconds) << ", ETA "
           << format_duration(per_step * (options.steps - state.step));
      progress(line.str());
    }
    if (state.step % options.checkpoint_every == 0 || state.step == options.steps) {
      torch::NoGradGuard no_grad;
      at::Generator eval_gen = step_generator(options.seed ^ 0xe7a1ull, state.step);
      const double held_loss = flow_loss(ema, held, 0.0, eval_gen).item<double>();
      state.held_out_curve.push_back({state.step, held_loss, state.seconds});
      progress("held-out loss (EMA weights) at step " + std::to_string(state.step) + ": " + std::to_string(held_loss));
      INFILL_RETURN_IF_ERROR(save_checkpoint(options.work_dir, model, ema, optimizer, state));
    }
  }
  INFILL_RETURN_IF_ERROR(export_dit(ema, dit_path));
  TrainResult result;
  result.curve = state.curve;
  result.held_out_curve = state.held_out_curve;
  result.seconds = state.seconds;
  return result;
}

}  // namespace infill::train
