#pragma once
/// One edit end to end on the calling thread: prepare a template's activation cache, then
/// run an edit that computes only its masked tokens. The serving layer drives EditSession
/// directly to batch many edits per step; this class is the single-request path used by the
/// headless tools, tests and benchmarks.

#include <memory>

#include "cache/activation_store.h"
#include "common/status.h"
#include "model/model.h"
#include "pipeline/edit_session.h"
#include "pipeline/template_image.h"

namespace infill {

class EditPipeline {
 public:
  /// `store` may be null: prepared entries are then returned but not kept.
  EditPipeline(std::shared_ptr<const Model> model, std::shared_ptr<ActivationStore> store);

  const Model& model() const { return *model_; }

  /// Runs the full denoising of the template with an empty mask and records, per step and
  /// per block, K and V of all tokens (fp16). Returns the stored entry if one exists already.
  Result<std::shared_ptr<const ActivationEntry>> prepare(const TemplateImage& tmpl, const ScheduleSpec& schedule);

  /// Edits the template. With CacheMode::kUse the template is prepared first when needed.
  Result<EditOutput> edit(std::shared_ptr<const TemplateImage> tmpl, const EditParams& params);

 private:
  std::shared_ptr<const Model> model_;
  std::shared_ptr<ActivationStore> store_;
};

}  // namespace infill
