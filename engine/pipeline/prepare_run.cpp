#include "pipeline/prepare_run.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

namespace infill {

Result<std::unique_ptr<PrepareRun>> PrepareRun::create(std::shared_ptr<const Model> model,
                                                       std::shared_ptr<const TemplateImage> tmpl,
                                                       const ScheduleSpec& schedule) {
  INFILL_ASSIGN_OR_RETURN(Sampler sampler, make_model_sampler(*model, schedule));
  std::unique_ptr<PrepareRun> run(new PrepareRun());
  c10::InferenceMode guard;
  const DitConfig& cfg = model->manifest.dit;
  run->key_ = make_cache_key(*model, *tmpl, schedule);
  run->grid_h_ = static_cast<int>(tmpl->latent.size(1)) / cfg.patch_size;
  run->grid_w_ = static_cast<int>(tmpl->latent.size(2)) / cfg.patch_size;
  const int64_t tokens = int64_t{run->grid_h_} * run->grid_w_;
  run->entry_ = std::make_shared<ActivationEntry>(
      ActivationLayout{sampler.steps(), cfg.depth, static_cast<int>(tokens), cfg.hidden_size});
  run->sink_ = std::make_unique<EntryKvSink>(*run->entry_, 0);
  run->noise_ = template_noise(*tmpl, resolve_schedule(*model, schedule).template_seed);
  run->no_mask_ = at::zeros({tmpl->latent.size(1), tmpl->latent.size(2)}, at::kFloat);
  run->ids_ = at::arange(tokens, at::kLong);
  run->sampler_.emplace(std::move(sampler));
  run->model_ = std::move(model);
  run->tmpl_ = std::move(tmpl);
  return run;
}

void PrepareRun::run_step() {
  TORCH_CHECK(!done(), "prepare run of template ", tmpl_->id, " has no step left");
  c10::InferenceMode guard;
  const Dit& dit = model_->dit;
  const at::Tensor noisy = sampler_->add_noise(tmpl_->latent, noise_, step_);
  DitSegment seg;
  seg.tokens = dit.patchify(model_input(*model_, noisy, tmpl_->latent, no_mask_));
  seg.token_ids = ids_;
  seg.grid_h = grid_h_;
  seg.grid_w = grid_w_;
  seg.cond = dit.conditioning(sampler_->model_timestep(step_), at::Tensor());
  seg.null_cond = seg.cond;
  seg.full_blocks = model_->manifest.dit.depth;
  seg.carry_rows = ids_.narrow(0, 0, 1);  // the prediction is not needed
  sink_->set_step(step_);
  seg.sink = sink_.get();
  DitSegment segs[] = {seg};
  (void)dit.forward(segs);
  ++step_;
}

}  // namespace infill
