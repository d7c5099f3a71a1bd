#pragma once
/// The prepare run of a FLUX.2 template: the full denoising of the template's sequence
/// [text, image, reference] under one text (the empty prompt for a template-keyed entry, the
/// edit's prompt for a prompt-keyed one), one step at a time, recording every step's and
/// block's K/V of every token (fp16) into a new activation cache entry.
///
/// Every image token is "unmasked" here: its input at step i is the template latent noised to
/// level i with the template's fixed noise, exactly the input unmasked tokens get in a later
/// edit, so no sampler update is needed. The counterpart of PrepareRun for the DiT family.
/// Threading: used by one thread at a time; the entry is complete (and immutable) once done().

#include <cstdint>
#include <memory>
#include <optional>

#include <ATen/core/Tensor.h>

#include "cache/activation_entry.h"
#include "common/status.h"
#include "model/flux2_transformer.h"
#include "pipeline/cached_kv.h"
#include "pipeline/sampler.h"
#include "pipeline/template_image.h"

namespace infill {

/// FLUX.2's schedule for a template: Euler RF, shifted for its image token count.
Result<Sampler> flux2_sampler(const TemplateImage& tmpl, int steps);

class Flux2PrepareRun {
 public:
  /// `text` [L, context_dim] float32: the rows of the prompt the entry is keyed by.
  /// `guidance` is embedded for models with guidance_embed (FLUX.2 [dev]) and ignored otherwise.
  static Result<std::unique_ptr<Flux2PrepareRun>> create(std::shared_ptr<const Flux2Transformer> model,
                                                         std::shared_ptr<const TemplateImage> tmpl, at::Tensor text,
                                                         int steps, uint64_t template_seed, double guidance);

  int steps() const { return sampler_->steps(); }
  int step() const { return step_; }
  bool done() const { return step_ >= sampler_->steps(); }
  /// Tokens of the sequence (text + image + reference), each computed at every step.
  int64_t tokens() const;
  /// Runs the next step's forward, recording its K/V. Precondition: !done(). A model error
  /// throws (c10::Error); the run is then unusable.
  void run_step();
  /// The entry; complete once done().
  std::shared_ptr<const ActivationEntry> entry() const { return entry_; }

 private:
  Flux2PrepareRun() = default;
  std::shared_ptr<const Flux2Transformer> model_;
  std::shared_ptr<const TemplateImage> tmpl_;
  std::optional<Sampler> sampler_;
  std::shared_ptr<ActivationEntry> entry_;
  std::unique_ptr<EntryKvSink> sink_;
  at::Tensor text_, text_ids_, clean_, noise_, image_ids_;
  at::Tensor no_mask_rows_;  // [N, mask_channels] zeros
  at::Tensor reference_;     // [N, in_channels + mask_channels] the clean latent as reference tokens
  double guidance_ = 0.0;
  int step_ = 0;
};

}  // namespace infill
