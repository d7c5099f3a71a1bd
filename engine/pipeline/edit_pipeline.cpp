#include "pipeline/edit_pipeline.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "pipeline/prepare_run.h"

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
  // The run lives only inside this call, so it may borrow the caller's template.
  const std::shared_ptr<const TemplateImage> borrowed(&tmpl, [](const TemplateImage*) {});
  INFILL_ASSIGN_OR_RETURN(std::unique_ptr<PrepareRun> run, PrepareRun::create(model_, borrowed, schedule));
  while (!run->done()) run->run_step();
  std::shared_ptr<const ActivationEntry> result = run->entry();
  if (store_) INFILL_RETURN_IF_ERROR(store_->put(key, result));
  return result;
}

Result<EditOutput> EditPipeline::edit(std::shared_ptr<const TemplateImage> tmpl, const EditParams& params) {
  // An empty mask needs no model run, hence no cache entry.
  const bool any_masked = params.mask.defined() && (params.mask > 0).any().item<bool>();
  CacheSource source;
  if (params.cache == CacheMode::kUse && any_masked) {
    INFILL_ASSIGN_OR_RETURN(source.entry, prepare(*tmpl, params.schedule));
  }
  INFILL_ASSIGN_OR_RETURN(std::unique_ptr<EditSession> session,
                          EditSession::create(model_, std::move(tmpl), params, std::move(source)));
  while (!session->done()) {
    INFILL_RETURN_IF_ERROR(session->apply(model_->dit.forward(session->segments())));
  }
  return session->finish();
}

}  // namespace infill
