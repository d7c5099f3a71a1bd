#include "pipeline/edit_pipeline.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

namespace infill {

EditPipeline::EditPipeline(std::shared_ptr<const Model> model, std::shared_ptr<ActivationStore> store)
    : model_(std::move(model)), store_(std::move(store)) {}

Result<std::shared_ptr<const ActivationEntry>> EditPipeline::prepare(const TemplateImage& tmpl,
                                                                     const ScheduleSpec& schedule) {
  const ActivationKey key = make_cache_key(*model_, tmpl, schedule);
  if (store_) {
    auto cached = store_->get(key);
    if (cached.ok()) return cached.value();
  }
  INFILL_ASSIGN_OR_RETURN(Sampler sampler, make_model_sampler(*model_, schedule));
  c10::InferenceMode guard;
  const DitConfig& cfg = model_->manifest.dit;
  const Dit& dit = model_->dit;
  const int grid_h = static_cast<int>(tmpl.latent.size(1)) / cfg.patch_size;
  const int grid_w = static_cast<int>(tmpl.latent.size(2)) / cfg.patch_size;
  auto entry = std::make_shared<ActivationEntry>(
      ActivationLayout{sampler.steps(), cfg.depth, grid_h * grid_w, cfg.hidden_size});
  const at::Tensor noise = template_noise(tmpl, resolve_schedule(*model_, schedule).template_seed);
  const at::Tensor no_mask = at::zeros({tmpl.latent.size(1), tmpl.latent.size(2)}, at::kFloat);
  const at::Tensor ids = at::arange(static_cast<int64_t>(grid_h) * grid_w, at::kLong);
  EntryKvSink sink(*entry, 0);
  for (int step = 0; step < sampler.steps(); ++step) {
    // With an empty mask every latent pixel is reset each step, so the input of step i is
    // the template noised to level i: no sampler update is needed.
    const at::Tensor noisy = sampler.add_noise(tmpl.latent, noise, step);
    DitSegment seg;
    seg.tokens = dit.patchify(model_input(*model_, noisy, tmpl.latent, no_mask));
    seg.token_ids = ids;
    seg.grid_h = grid_h;
    seg.grid_w = grid_w;
    seg.cond = dit.conditioning(sampler.model_timestep(step), at::Tensor());
    seg.null_cond = seg.cond;
    seg.full_blocks = cfg.depth;
    seg.carry_rows = ids.narrow(0, 0, 1);  // the prediction is not needed
    sink.set_step(step);
    seg.sink = &sink;
    DitSegment segs[] = {seg};
    (void)dit.forward(segs);
  }
  std::shared_ptr<const ActivationEntry> result = entry;
  if (store_) INFILL_RETURN_IF_ERROR(store_->put(key, result));
  return result;
}

Result<EditOutput> EditPipeline::edit(std::shared_ptr<const TemplateImage> tmpl, const EditParams& params) {
  std::shared_ptr<const ActivationEntry> entry;
  // An empty mask needs no model run, hence no cache entry.
  const bool any_masked = params.mask.defined() && (params.mask > 0).any().item<bool>();
  if (params.cache == CacheMode::kUse && any_masked) {
    INFILL_ASSIGN_OR_RETURN(entry, prepare(*tmpl, params.schedule));
  }
  INFILL_ASSIGN_OR_RETURN(std::unique_ptr<EditSession> session,
                          EditSession::create(model_, std::move(tmpl), params, std::move(entry)));
  while (!session->done()) {
    DitSegment segs[] = {session->segment()};
    session->apply(model_->dit.forward(segs));
  }
  return session->finish();
}

}  // namespace infill
