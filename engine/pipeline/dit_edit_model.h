#pragma once
/// The DiT family (the bundled infill-tiny model and models of its manifest format) behind
/// the worker's EditModel interface: EditSession, PrepareRun and Dit::forward.

#include <memory>

#include "model/model.h"
#include "pipeline/edit_model.h"

namespace infill {

class DitEditModel final : public EditModel {
 public:
  explicit DitEditModel(std::shared_ptr<const Model> model);

  const std::shared_ptr<const Model>& model() const { return model_; }

  const EditModelInfo& info() const override { return info_; }
  const std::string& name() const override { return model_->manifest.name; }
  Status set_prompt(EditParams& params, const std::string& text) const override;
  Status check_schedule(const EditParams& params) const override;
  int token_pixels() const override;
  int resolved_steps(const EditParams& params) const override;
  Result<std::shared_ptr<const TemplateImage>> make_template(std::span<const std::byte> bytes,
                                                              const std::string& name_for_errors) const override;
  ActivationKey cache_key(const TemplateImage& tmpl, const EditParams& params) const override;
  /// `prompt_entry` is ignored: the DiT family keeps template-keyed entries only.
  Result<std::unique_ptr<StepSession>> create_session(std::shared_ptr<const TemplateImage> tmpl, const EditParams& params,
                                                      std::shared_ptr<const ActivationEntry> entry,
                                                      std::shared_ptr<const ActivationEntry> prompt_entry) const override;
  Result<std::unique_ptr<StepPrepare>> create_prepare(std::shared_ptr<const TemplateImage> tmpl,
                                                      const EditParams& params) const override;
  int streamable_blocks() const override { return model_->manifest.dit.depth; }
  Result<std::unique_ptr<StepSession>> create_streamed_session(std::shared_ptr<const TemplateImage> tmpl,
                                                               const EditParams& params,
                                                               std::shared_ptr<StreamedKvSource> streamed,
                                                               int recompute_blocks) const override;
  at::Tensor forward(std::span<StepSession* const> sessions) const override;
  at::Tensor decode_preview(const at::Tensor& latent, const PixelRect& box) const override;
  int codec_factor() const override { return model_->manifest.autoencoder.factor; }

 private:
  std::shared_ptr<const Model> model_;
  EditModelInfo info_;
};

}  // namespace infill
