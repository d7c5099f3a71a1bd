#pragma once
/// One edit end to end on the calling thread, from the pieces the worker drives (PrepareRun,
/// EditSession, Dit::forward): prepare a template's activation cache, then run an edit that
/// computes only its masked tokens. The shipped path is the serving worker, which batches
/// edits, slices prepares and streams disk-tier entries under the load plan; this class is
/// the one-request reference that tests and benchmarks compare the worker against.

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

  /// Edits the template. With CacheMode::kUse the template is prepared first when needed
  /// (an entry in the disk tier is read whole: streaming is the worker's).
  Result<EditOutput> edit(std::shared_ptr<const TemplateImage> tmpl, const EditParams& params);

 private:
  std::shared_ptr<const Model> model_;
  std::shared_ptr<ActivationStore> store_;
};

}  // namespace infill
