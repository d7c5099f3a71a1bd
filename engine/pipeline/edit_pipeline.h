#pragma once
/// One edit end to end on the calling thread: prepare a template's activation cache, then
/// run an edit that computes only its masked tokens. The serving layer drives EditSession
/// directly to batch many edits per step; this class is the single-request path used by the
/// headless tools, tests and benchmarks.

#include <memory>
#include <vector>

#include "cache/activation_store.h"
#include "cache/load_plan.h"
#include "common/status.h"
#include "model/model.h"
#include "pipeline/edit_session.h"
#include "pipeline/template_image.h"

namespace infill {

struct EditPipelineOptions {
  /// When the template's entry is only in the disk tier, stream its slabs during the edit
  /// (overlapped with compute, leading blocks recomputed by the load plan) instead of
  /// promoting the whole entry to RAM first.
  bool stream_from_disk = true;
};

/// Predicted per-block costs of one step, the inputs of the load plan.
struct BlockCosts {
  std::vector<double> load_ms, masked_ms, full_ms;
};

class EditPipeline {
 public:
  /// `store` may be null: prepared entries are then returned but not kept.
  EditPipeline(std::shared_ptr<const Model> model, std::shared_ptr<ActivationStore> store,
               EditPipelineOptions options = {});

  const Model& model() const { return *model_; }

  /// Runs the full denoising of the template with an empty mask and records, per step and
  /// per block, K and V of all tokens (fp16). Returns the stored entry if one exists already.
  Result<std::shared_ptr<const ActivationEntry>> prepare(const TemplateImage& tmpl, const ScheduleSpec& schedule);

  /// Edits the template. With CacheMode::kUse the template is prepared first when needed.
  Result<EditOutput> edit(std::shared_ptr<const TemplateImage> tmpl, const EditParams& params);

  /// Cost estimates for a grid of `tokens` with `masked` masked tokens, from the compute
  /// rate measured on this pipeline's full forwards and `slab_read_ms` per block.
  BlockCosts block_costs(int64_t tokens, int64_t masked, double slab_read_ms) const;

 private:
  Result<CacheSource> cache_source(const TemplateImage& tmpl, const EditParams& params, int64_t masked_tokens);

  std::shared_ptr<const Model> model_;
  std::shared_ptr<ActivationStore> store_;
  EditPipelineOptions options_;
  double gflops_ = 40.0;  // updated from measured full forwards (prepare)
};

}  // namespace infill
