#include "training_loop.h"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/remove_tree.h"

namespace infill::train {

namespace fs = std::filesystem;

at::Generator step_generator(uint64_t seed, int64_t step) {
  return at::make_generator<at::CPUGeneratorImpl>(seed * 1000003ull + static_cast<uint64_t>(step));
}

namespace {

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

Status save_checkpoint(const std::string& dir, const std::shared_ptr<torch::nn::Module>& model,
                       const std::shared_ptr<torch::nn::Module>& ema, const torch::optim::AdamW& optimizer,
                       const RunState& state) {
  const std::string tmp = dir + "/checkpoint.tmp";
  std::error_code ec;
  remove_tree(tmp);
  fs::create_directories(tmp, ec);
  if (ec) return io_error("cannot create " + tmp + ": " + ec.message());
  torch::save(model, tmp + "/model.pt");
  torch::save(ema, tmp + "/ema.pt");
  torch::save(optimizer, tmp + "/optimizer.pt");
  nlohmann::json j = {{"step", state.step}, {"seconds", state.seconds}, {"curve", to_json(state.curve)},
                      {"held_out_curve", to_json(state.held_out_curve)}};
  std::ofstream(tmp + "/state.json") << j.dump();
  // Replace the previous checkpoint only once the new one is complete.
  remove_tree(dir + "/checkpoint");
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

Result<TrainResult> run_training(const std::shared_ptr<torch::nn::Module>& model,
                                const std::shared_ptr<torch::nn::Module>& ema, const LoopOptions& options,
                                const StepLoss& step_loss, const HeldOutLoss& held_out_loss,
                                const std::function<void(const std::string&)>& progress) {
  std::error_code ec;
  fs::create_directories(options.work_dir, ec);
  if (ec) return io_error("cannot create work dir " + options.work_dir + ": " + ec.message());
  {
    torch::NoGradGuard no_grad;
    auto src = model->parameters();
    auto dst = ema->parameters();
    for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
  }
  for (auto& p : ema->parameters()) p.set_requires_grad(false);
  torch::optim::AdamW optimizer(
      model->parameters(), torch::optim::AdamWOptions(options.lr).betas({0.9, 0.99}).weight_decay(options.weight_decay));
  RunState state;
  const std::string ckpt = options.work_dir + "/checkpoint";
  if (fs::exists(ckpt + "/state.json")) {
    std::ifstream in(ckpt + "/state.json");
    nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.contains("step")) {
      return corrupt_data(ckpt + "/state.json is not a training state; delete " + ckpt + " to restart");
    }
    try {
      torch::load(model, ckpt + "/model.pt");
      torch::load(ema, ckpt + "/ema.pt");
      torch::load(optimizer, ckpt + "/optimizer.pt");
    } catch (const c10::Error& e) {
      return corrupt_data(ckpt + " does not fit this " + options.name + " (" + e.what_without_backtrace() +
                          "); delete it to restart");
    }
    state.step = j["step"].get<int>();
    state.seconds = j["seconds"].get<double>();
    state.curve = from_json(j["curve"]);
    state.held_out_curve = from_json(j["held_out_curve"]);
    progress(options.name + ": resuming from step " + std::to_string(state.step) + " (" + ckpt + ")");
  } else if (!options.init_from.empty()) {
    if (!fs::exists(options.init_from + "/model.pt") || !fs::exists(options.init_from + "/ema.pt"))
      return not_found(options.name + " starts from the stage before, but " + options.init_from +
                       " holds no model.pt and ema.pt (run that stage first)");
    try {
      torch::load(model, options.init_from + "/model.pt");
      torch::load(ema, options.init_from + "/ema.pt");
    } catch (const c10::Error& e) {
      return corrupt_data(options.init_from + " does not fit this " + options.name + " (" + e.what_without_backtrace() + ")");
    }
    progress(options.name + ": starting from the weights in " + options.init_from);
  }

  const auto start = std::chrono::steady_clock::now();
  const double seconds_before = state.seconds;
  const int start_step = state.step;
  double loss_sum = 0.0;
  int loss_count = 0;
  while (state.step < options.steps) {
    at::Generator gen = step_generator(options.seed, state.step);
    // Warm-up, then a constant rate, then a linear decay over the last fifth.
    double lr = options.lr * std::min(1.0, (state.step + 1.0) / options.warmup_steps);
    const double decay_from = 0.8 * options.steps;
    if (state.step > decay_from) lr *= 1.0 - 0.9 * (state.step - decay_from) / (options.steps - decay_from);
    for (auto& group : optimizer.param_groups()) static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
    optimizer.zero_grad();
    torch::Tensor loss = step_loss(*model, state.step, gen);
    loss.backward();
    torch::nn::utils::clip_grad_norm_(model->parameters(), options.grad_clip);
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
    if (state.step % options.log_every == 0 || state.step == options.steps) {
      state.curve.push_back({state.step, loss_sum / loss_count, state.seconds});
      loss_sum = 0.0;
      loss_count = 0;
      const double per_step = (state.seconds - seconds_before) / (state.step - start_step);
      std::ostringstream line;
      line << options.name << ": step " << state.step << "/" << options.steps << " loss " << state.curve.back().loss
           << " lr " << lr << " " << per_step << " s/step, elapsed " << format_duration(state.seconds) << ", ETA "
           << format_duration(per_step * (options.steps - state.step));
      progress(line.str());
    }
    if (state.step % options.checkpoint_every == 0 || state.step == options.steps) {
      double held = 0.0;
      {
        torch::NoGradGuard no_grad;
        held = held_out_loss(*ema, state.step);
      }
      state.held_out_curve.push_back({state.step, held, state.seconds});
      progress(options.name + ": held-out loss (EMA weights) at step " + std::to_string(state.step) + ": " +
               std::to_string(held));
      INFILL_RETURN_IF_ERROR(save_checkpoint(options.work_dir, model, ema, optimizer, state));
    }
  }
  return TrainResult{state.curve, state.held_out_curve, state.seconds};
}

}  // namespace infill::train
