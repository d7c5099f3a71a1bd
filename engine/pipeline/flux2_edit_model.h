#pragma once
/// The FLUX.2 family behind the worker's EditModel interface: prompts encoded by the model's
/// text encoder when a session is set up (on the task pool, through the prompt cache),
/// template-keyed prepare runs under the empty prompt, Flux2EditSession, packed
/// Flux2Transformer::forward.

#include <cstdint>
#include <memory>
#include <string>

#include "model/flux2_transformer.h"
#include "model/latent_codec.h"
#include "model/qwen3_prompt_encoder.h"
#include "pipeline/edit_model.h"

namespace infill {

struct Flux2EditModelParts {
  std::string name;  ///< the model's id in cache keys, errors and metrics
  std::shared_ptr<const Flux2Transformer> transformer;
  std::shared_ptr<const LatentCodec> codec;          ///< the VAE: templates and results
  std::shared_ptr<const LatentCodec> preview_codec;  ///< e.g. TAEF2; null = the VAE
  std::shared_ptr<Qwen3PromptEncoder> text;          ///< prompt text -> text rows
  int default_steps = 4;
  double default_guidance = 1.0;  ///< the folder's default (clients start from it)
  int64_t max_image_pixels = int64_t{4096} * 4096;
};

class Flux2EditModel final : public EditModel {
 public:
  /// Checks that the parts fit together (codec channels and text width against the
  /// transformer); errors name the part.
  static Result<std::shared_ptr<const Flux2EditModel>> create(Flux2EditModelParts parts);

  const Flux2EditModelParts& parts() const { return parts_; }

  const std::string& name() const override { return parts_.name; }
  int token_pixels() const override { return parts_.codec->factor(); }
  int resolved_steps(const EditParams& params) const override;
  Result<std::shared_ptr<const TemplateImage>> make_template(std::span<const std::byte> bytes,
                                                              const std::string& name_for_errors) const override;
  ActivationKey cache_key(const TemplateImage& tmpl, const EditParams& params) const override;
  Result<std::unique_ptr<StepSession>> create_session(std::shared_ptr<const TemplateImage> tmpl, const EditParams& params,
                                                      std::shared_ptr<const ActivationEntry> entry) const override;
  Result<std::unique_ptr<StepPrepare>> create_prepare(std::shared_ptr<const TemplateImage> tmpl,
                                                      const EditParams& params) const override;
  at::Tensor forward(std::span<StepSession* const> sessions) const override;
  at::Tensor decode_preview(const at::Tensor& latent, const PixelRect& box) const override;
  int codec_factor() const override { return parts_.codec->factor(); }

 private:
  explicit Flux2EditModel(Flux2EditModelParts parts) : parts_(std::move(parts)) {}
  Flux2EditModelParts parts_;
};

}  // namespace infill
