#include "pipeline/flux2_prepare_run.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "pipeline/edit_session.h"
#include "pipeline/flux2_sequence.h"
#include "pipeline/pinned_host_memory.h"

namespace infill {

Result<Sampler> flux2_sampler(const TemplateImage& tmpl, int steps) {
  const int image_tokens = static_cast<int>(tmpl.latent.size(1) * tmpl.latent.size(2));
  return Sampler::make(SamplerKind::kEulerRF, steps, Prediction::kFlow, flux2_schedule_shift(image_tokens, steps));
}

int64_t Flux2PrepareRun::tokens() const {
  return (text_.size(0) + clean_.size(0) + reference_.size(0)) * (null_sink_ ? 2 : 1);
}

double Flux2PrepareRun::attention_pairs() const {
  const double sequence = static_cast<double>(text_.size(0) + clean_.size(0) + reference_.size(0));
  return sequence * sequence * (null_sink_ ? 2 : 1);
}

Result<std::unique_ptr<Flux2PrepareRun>> Flux2PrepareRun::create(std::shared_ptr<const Flux2Transformer> model,
                                                                 std::shared_ptr<const TemplateImage> tmpl,
                                                                 at::Tensor text, int steps, uint64_t template_seed,
                                                                 double guidance, at::Tensor null_text, AdapterSet adapters,
                                                                 std::vector<at::Tensor> references,
                                                                 std::shared_ptr<AdapterLoad> adapter_load,
                                                                 int adapters_from_step) {
  const Flux2Config& cfg = model->config();
  if (tmpl->latent.size(0) != cfg.in_channels) {
    return invalid_argument("template latent has " + std::to_string(tmpl->latent.size(0)) + " channels, the model reads " +
                            std::to_string(cfg.in_channels));
  }
  if (!text.defined() || text.dim() != 2 || text.size(1) != cfg.context_dim) {
    return invalid_argument("prepare text rows must be [L, " + std::to_string(cfg.context_dim) + "]");
  }
  if (null_text.defined() && !null_text.sizes().equals(text.sizes())) {
    return invalid_argument("prepare null_text rows must have the prompt's shape [" + std::to_string(text.size(0)) + ", " +
                            std::to_string(cfg.context_dim) + "] (classifier-free guidance pairs them row for row)");
  }
  c10::InferenceMode guard;
  std::unique_ptr<Flux2PrepareRun> run(new Flux2PrepareRun());
  INFILL_ASSIGN_OR_RETURN(Sampler sampler, flux2_sampler(*tmpl, steps));
  run->sampler_.emplace(sampler);
  const int64_t h = tmpl->latent.size(1), w = tmpl->latent.size(2);
  run->text_ = text.to(at::kFloat).contiguous();
  run->text_ids_ = flux2_text_ids(text.size(0));
  run->clean_ = latent_to_tokens(tmpl->latent);
  run->noise_ = latent_to_tokens(template_noise(*tmpl, template_seed));
  // The prepare run sees no mask: every image token is unmasked, as an edit's cached tokens are.
  run->no_mask_rows_ = at::zeros({run->clean_.size(0), cfg.mask_channels}, at::kFloat);
  for (size_t i = 0; i < references.size(); ++i) {
    if (!references[i].defined() || references[i].dim() != 3 || references[i].size(0) != cfg.in_channels)
      return invalid_argument("reference image " + std::to_string(i) + " is not a latent of this model (expected [" +
                              std::to_string(cfg.in_channels) + ", h, w])");
  }
  Flux2ReferenceRows refs = flux2_reference_rows(tmpl->latent, references, cfg.mask_channels);
  run->reference_ = std::move(refs.rows);
  run->image_ids_ = at::cat({flux2_grid_ids(h, w, 0), refs.ids});
  run->guidance_ = guidance;
  ActivationLayout layout;
  layout.steps = steps;
  layout.blocks = null_text.defined() ? 2 * cfg.depth() : cfg.depth();
  layout.tokens = static_cast<int>(run->tokens());
  layout.hidden = cfg.hidden_size;
  // On a GPU in pinned memory: the edits that read it copy it to the GPU while they compute.
  run->entry_ = std::make_shared<ActivationEntry>(layout, entry_allocator_for(model->device()));
  run->sink_ = std::make_unique<EntryKvSink>(*run->entry_, 0);
  if (null_text.defined()) {
    run->null_text_ = null_text.to(at::kFloat).contiguous();
    run->null_sink_ = std::make_unique<EntryKvSink>(*run->entry_, 0, cfg.depth());
  }
  run->adapters_ = std::move(adapters);
  run->adapter_load_ = std::move(adapter_load);
  run->adapters_from_step_ = adapters_from_step;
  run->model_ = std::move(model);
  run->tmpl_ = std::move(tmpl);
  return run;
}

Result<std::unique_ptr<Flux2PrepareRun>> Flux2PrepareRun::from_stroke(std::shared_ptr<const Flux2Transformer> model,
                                                                      std::shared_ptr<const TemplateImage> tmpl,
                                                                      Flux2Stroke stroke) {
  const Flux2EditParams& p = stroke.params;
  const bool guided = flux2_runs_cfg(model->config(), p.guidance);
  INFILL_ASSIGN_OR_RETURN(std::unique_ptr<Flux2PrepareRun> run,
                          create(model, tmpl, p.prompt, p.steps, p.template_seed, p.guidance,
                                 guided ? p.null_prompt : at::Tensor(), p.adapters, p.references, p.adapter_load,
                                 p.adapters_from_step));
  INFILL_ASSIGN_OR_RETURN(run->stroke_, Flux2EditSession::create(std::move(model), std::move(stroke.codec), std::move(tmpl),
                                                                 p, Flux2Cache{}, run->sink_.get(), run->null_sink_.get()));
  return run;
}

bool Flux2PrepareRun::waiting_for_adapters() const {
  if (stroke_ && !stroke_->done() && step_ >= stroke_->first_step()) return stroke_->waiting_for_adapters();
  return adapter_load_ && adapters_.empty() && !done() && adapters_apply_at(step_, adapters_from_step_) &&
         !adapter_load_->ready();
}

void Flux2PrepareRun::run_step() {
  c10::InferenceMode guard;
  if (stroke_ && !stroke_->done() && step_ >= stroke_->first_step()) {
    // The stroke's own step: its prompted segment records into the sink.
    std::span<Flux2Segment> segments = stroke_->segments();
    const at::Tensor prediction = model_->forward_on_device(segments);  // where the stroke's state is
    const Status applied = stroke_->apply(prediction);
    TORCH_CHECK(applied.ok(), "flux2 prepare from a stroke: ", applied.to_string());
    ++step_;
    return;
  }
  std::vector<Flux2Segment> segments = trajectory_segments();
  model_->forward_on_device(segments);  // only the sinks' K/V are wanted: no copy to the host
  ++step_;
}

bool Flux2PrepareRun::splits_over_devices() const { return !stroke_; }

std::vector<Flux2Segment> Flux2PrepareRun::step_segments() {
  TORCH_CHECK(!done() && !stroke_, "flux2 prepare: step_segments is for a template's trajectory, before done()");
  return trajectory_segments();
}

std::vector<Flux2Segment> Flux2PrepareRun::trajectory_segments() {
  c10::InferenceMode guard;
  const int i = step_;
  std::vector<Flux2Segment> segments(null_sink_ ? 2 : 1);
  segments[0].txt = text_;
  segments[0].txt_ids = text_ids_;
  segments[0].img = at::cat({flux2_with_mask(sampler_->add_noise(clean_, noise_, i), no_mask_rows_), reference_});
  segments[0].img_ids = image_ids_;
  segments[0].timestep = sampler_->model_timestep(i) / 1000.0;
  segments[0].guidance = guidance_;
  segments[0].sink = sink_.get();
  if (adapter_load_ && adapters_.empty() && adapters_apply_at(i, adapters_from_step_)) {
    Result<AdapterSet> set = adapter_load_->result();  // the worker runs it only once read
    TORCH_CHECK(set.ok(), "flux2 prepare: ", set.status().message());
    adapters_ = std::move(*set);
  }
  if (adapters_apply_at(i, adapters_from_step_)) segments[0].adapters = adapters_;
  sink_->set_step(i);
  if (null_sink_) {  // the null half: the same tokens under the empty prompt
    segments[1] = segments[0];
    segments[1].txt = null_text_;
    segments[1].sink = null_sink_.get();
    null_sink_->set_step(i);
  }
  return segments;
}

void Flux2PrepareRun::step_done() {
  TORCH_CHECK(!done(), "flux2 prepare: step_done after the last step");
  ++step_;
}

}  // namespace infill
