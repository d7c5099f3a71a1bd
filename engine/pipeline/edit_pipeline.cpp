#include "pipeline/edit_pipeline.h"

#include <chrono>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "pipeline/prepare_run.h"

namespace infill {

namespace {

// Multiply-adds of one block for `rows` computed rows attending to `keys` keys, times two.
double block_flops(const DitConfig& cfg, double rows, double keys) {
  const double h = cfg.hidden_size, mlp = cfg.mlp_hidden();
  return 2.0 * rows * (h * 3 * h + h * h + 2 * h * mlp) + 4.0 * rows * keys * h;
}

}  // namespace

EditPipeline::EditPipeline(std::shared_ptr<const Model> model, std::shared_ptr<ActivationStore> store,
                           EditPipelineOptions options)
    : model_(std::move(model)), store_(std::move(store)), options_(options) {}

BlockCosts EditPipeline::block_costs(int64_t tokens, int64_t masked, double slab_read_ms) const {
  const DitConfig& cfg = model_->manifest.dit;
  const double ms_per_flop = 1.0 / (gflops_ * 1e6);
  BlockCosts c;
  for (int b = 0; b < cfg.depth; ++b) {
    c.load_ms.push_back(slab_read_ms);
    c.full_ms.push_back(block_flops(cfg, tokens, tokens) * ms_per_flop);
    c.masked_ms.push_back(block_flops(cfg, masked, tokens) * ms_per_flop);
  }
  return c;
}

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
  const DitConfig& cfg = model_->manifest.dit;
  const auto t0 = std::chrono::steady_clock::now();
  while (!run->done()) run->run_step();
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (ms > 0) {
    gflops_ = block_flops(cfg, run->tokens(), run->tokens()) * cfg.depth * run->steps() / (ms * 1e6);
  }
  std::shared_ptr<const ActivationEntry> result = run->entry();
  if (store_) INFILL_RETURN_IF_ERROR(store_->put(key, result));
  return result;
}

Result<CacheSource> EditPipeline::cache_source(const TemplateImage& tmpl, const EditParams& params,
                                               int64_t masked_tokens) {
  CacheSource source;
  const ActivationKey key = make_cache_key(*model_, tmpl, params.schedule);
  if (options_.stream_from_disk && store_ && store_->tier_of(key) == Tier::kDisk) {
    const auto layout = store_->layout_of(key);
    if (layout) {
      source.streamed = std::make_shared<StreamedKvSource>(store_, key, *layout);
      // Until reads are measured, assume 1 GB/s for the slab of one block.
      const double slab_ms = 2.0 * layout->slab_elements() * sizeof(uint16_t) / 1e6;
      const BlockCosts c = block_costs(layout->tokens, masked_tokens, slab_ms);
      const LoadPlan plan = plan_loads(c.load_ms, c.masked_ms, c.full_ms, LoadPlanShape::kRecomputePrefix);
      for (BlockLoadChoice choice : plan.choices) source.recompute_blocks += choice == BlockLoadChoice::kRecompute;
      return source;
    }
  }
  INFILL_ASSIGN_OR_RETURN(source.entry, prepare(tmpl, params.schedule));
  return source;
}

Result<EditOutput> EditPipeline::edit(std::shared_ptr<const TemplateImage> tmpl, const EditParams& params) {
  // An empty mask needs no model run, hence no cache entry.
  const bool any_masked = params.mask.defined() && (params.mask > 0).any().item<bool>();
  CacheSource source;
  if (params.cache == CacheMode::kUse && any_masked) {
    // The masked-token count only steers the load plan; an estimate from the mask suffices.
    const int64_t tokens = tmpl->latent.size(1) * tmpl->latent.size(2) /
                           (model_->manifest.dit.patch_size * model_->manifest.dit.patch_size);
    const double ratio = (params.mask > 0).to(at::kFloat).mean().item<double>();
    INFILL_ASSIGN_OR_RETURN(source, cache_source(*tmpl, params, static_cast<int64_t>(ratio * tokens) + 1));
  }
  INFILL_ASSIGN_OR_RETURN(std::unique_ptr<EditSession> session,
                          EditSession::create(model_, std::move(tmpl), params, std::move(source)));
  while (!session->done()) {
    INFILL_RETURN_IF_ERROR(session->apply(model_->dit.forward(session->segments())));
  }
  return session->finish();
}

}  // namespace infill
