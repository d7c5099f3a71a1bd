#pragma once
/// The prepare run of a template: the full denoising with an empty mask, one step at a time,
/// recording every step's and block's K/V (fp16) into a new activation cache entry. The one
/// implementation of the prepare job: a serving worker runs it a step per slice between edit
/// steps, EditPipeline runs it to the end.
///
/// With an empty mask every latent pixel is reset each step, so the input of step i is the
/// template noised to level i with the template's fixed noise: no sampler update is needed and
/// the inputs of unmasked tokens in later edits equal these exactly.
/// Threading: used by one thread at a time; the entry is complete (and immutable) once done().

#include <cstdint>
#include <memory>
#include <optional>

#include <ATen/core/Tensor.h>

#include "cache/activation_entry.h"
#include "common/status.h"
#include "model/model.h"
#include "pipeline/cached_kv.h"
#include "pipeline/edit_session.h"
#include "pipeline/sampler.h"
#include "pipeline/template_image.h"

namespace infill {

class PrepareRun {
 public:
  /// Validates the schedule and allocates the entry (make_cache_key(...) names it).
  static Result<std::unique_ptr<PrepareRun>> create(std::shared_ptr<const Model> model,
                                                    std::shared_ptr<const TemplateImage> tmpl,
                                                    const ScheduleSpec& schedule);

  const ActivationKey& key() const { return key_; }
  const TemplateImage& template_image() const { return *tmpl_; }
  /// Tokens of the template's grid (every one is computed at every step).
  int64_t tokens() const { return ids_.size(0); }
  int steps() const { return sampler_->steps(); }
  int step() const { return step_; }
  bool done() const { return step_ >= sampler_->steps(); }

  /// Runs the next step's forward, recording its K/V. Precondition: !done(). A model error
  /// throws (c10::Error); the run is then unusable.
  void run_step();
  /// The entry; complete once done().
  std::shared_ptr<const ActivationEntry> entry() const { return entry_; }

 private:
  PrepareRun() = default;
  std::shared_ptr<const Model> model_;
  std::shared_ptr<const TemplateImage> tmpl_;
  ActivationKey key_;
  std::optional<Sampler> sampler_;
  std::shared_ptr<ActivationEntry> entry_;
  std::unique_ptr<EntryKvSink> sink_;
  at::Tensor noise_, no_mask_, ids_;
  int grid_h_ = 0, grid_w_ = 0, step_ = 0;
};

}  // namespace infill
