#include "pipeline/dit_edit_model.h"

#include <vector>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "model/prompt_encoder.h"
#include "pipeline/prepare_run.h"

namespace infill {

namespace {

class DitStepSession final : public StepSession {
 public:
  DitStepSession(std::unique_ptr<EditSession> session, int steps) : s_(std::move(session)), steps_(steps) {}
  EditSession& session() { return *s_; }

  bool done() const override { return s_->done(); }
  int step() const override { return s_->step(); }
  int first_step() const override { return s_->first_step(); }
  int steps() const override { return steps_; }
  const TokenSet& tokens() const override { return s_->tokens(); }
  bool guided() const override { return s_->guided(); }
  int64_t prediction_rows() const override { return s_->prediction_rows(); }
  Status apply(const at::Tensor& prediction, int next_step) override { return s_->apply(prediction, next_step); }
  at::Tensor predicted_latent() const override { return s_->predicted_latent(); }
  Result<EditOutput> finish() const override { return s_->finish(); }

 private:
  std::unique_ptr<EditSession> s_;
  int steps_;
};

class DitStepPrepare final : public StepPrepare {
 public:
  explicit DitStepPrepare(std::unique_ptr<PrepareRun> run) : run_(std::move(run)) {}
  const ActivationKey& key() const override { return run_->key(); }
  const std::string& template_id() const override { return run_->template_image().id; }
  int64_t tokens() const override { return run_->tokens(); }
  int steps() const override { return run_->steps(); }
  bool done() const override { return run_->done(); }
  void run_step() override { run_->run_step(); }
  std::shared_ptr<const ActivationEntry> entry() const override { return run_->entry(); }

 private:
  std::unique_ptr<PrepareRun> run_;
};

}  // namespace

DitEditModel::DitEditModel(std::shared_ptr<const Model> model) : model_(std::move(model)) {
  const ModelManifest& m = model_->manifest;
  info_.id = model_->id;
  info_.name = m.name;
  info_.description = m.description;
  info_.family = "dit";
  info_.default_steps = m.sampler.steps;
  info_.default_sampler = m.sampler.sampler;
  info_.default_guidance = m.default_guidance;
  info_.max_image_pixels = m.max_image_pixels;
  if (m.has_prompt) info_.vocabulary = m.prompt.vocabulary;
}

Status DitEditModel::set_prompt(EditParams& params, const std::string& text) const {
  INFILL_ASSIGN_OR_RETURN(params.prompt, encode_prompt(model_->manifest, text));
  return {};
}

Status DitEditModel::check_schedule(const EditParams& params) const {
  return make_model_sampler(*model_, resolve_schedule(*model_, params.schedule)).status();
}

int DitEditModel::token_pixels() const { return model_->manifest.dit.patch_size * model_->manifest.autoencoder.factor; }

int DitEditModel::resolved_steps(const EditParams& params) const { return resolve_schedule(*model_, params.schedule).steps; }

Result<std::shared_ptr<const TemplateImage>> DitEditModel::make_template(std::span<const std::byte> bytes,
                                                                         const std::string& name_for_errors) const {
  return infill::make_template(*model_, bytes, name_for_errors);
}

ActivationKey DitEditModel::cache_key(const TemplateImage& tmpl, const EditParams& params) const {
  return make_cache_key(*model_, tmpl, params.schedule);
}

Result<std::unique_ptr<StepSession>> DitEditModel::create_session(std::shared_ptr<const TemplateImage> tmpl,
                                                                  const EditParams& params,
                                                                  std::shared_ptr<const ActivationEntry> entry,
                                                                  std::shared_ptr<const ActivationEntry>) const {
  if (!params.adapters.empty() || params.adapter_load) {
    return invalid_argument("model " + name() + " is of the DiT family, which takes no LoRA adapters (FLUX.2 models do)");
  }
  if (!params.references.empty()) {
    return invalid_argument("model " + name() + " is of the DiT family, which takes no reference images (FLUX.2 models do)");
  }
  CacheSource source;
  source.entry = std::move(entry);
  INFILL_ASSIGN_OR_RETURN(std::unique_ptr<EditSession> session, EditSession::create(model_, std::move(tmpl), params, std::move(source)));
  return std::unique_ptr<StepSession>(std::make_unique<DitStepSession>(std::move(session), resolved_steps(params)));
}

Result<std::unique_ptr<StepSession>> DitEditModel::create_streamed_session(std::shared_ptr<const TemplateImage> tmpl,
                                                                           const EditParams& params,
                                                                           std::shared_ptr<StreamedKvSource> streamed,
                                                                           int recompute_blocks) const {
  if (!streamed) return invalid_argument("a streamed edit needs its streamed source");
  CacheSource source;
  source.streamed = std::move(streamed);
  source.recompute_blocks = recompute_blocks;
  INFILL_ASSIGN_OR_RETURN(std::unique_ptr<EditSession> session, EditSession::create(model_, std::move(tmpl), params, std::move(source)));
  return std::unique_ptr<StepSession>(std::make_unique<DitStepSession>(std::move(session), resolved_steps(params)));
}

Result<std::unique_ptr<StepPrepare>> DitEditModel::create_prepare(std::shared_ptr<const TemplateImage> tmpl,
                                                                  const EditParams& params) const {
  INFILL_ASSIGN_OR_RETURN(std::unique_ptr<PrepareRun> run, PrepareRun::create(model_, std::move(tmpl), params.schedule));
  return std::unique_ptr<StepPrepare>(std::make_unique<DitStepPrepare>(std::move(run)));
}

at::Tensor DitEditModel::forward(std::span<StepSession* const> sessions) const {
  std::vector<DitSegment> segments;
  for (StepSession* s : sessions) {
    for (const DitSegment& segment : static_cast<DitStepSession*>(s)->session().segments()) segments.push_back(segment);
  }
  return model_->dit.forward(segments);
}

at::Tensor DitEditModel::decode_preview(const at::Tensor& latent, const PixelRect& box) const {
  if (!model_->autoencoder || box.empty()) return {};
  c10::InferenceMode guard;
  const int f = codec_factor();
  const at::Tensor z = to_autoencoder_scale(*model_, latent).unsqueeze(0);
  return model_->autoencoder->decode_crop(z, box.x / f, box.y / f, (box.width + f - 1) / f, (box.height + f - 1) / f, 2)[0];
}

}  // namespace infill
