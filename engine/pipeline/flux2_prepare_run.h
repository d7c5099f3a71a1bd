#pragma once
/// The prepare run of a FLUX.2 template: the full denoising of the template's sequence
/// [text, image, reference] under one text (the empty prompt for a template-keyed entry, the
/// edit's prompt for a prompt-keyed one), one step at a time, recording every step's and
/// block's K/V of every token (fp16) into a new activation cache entry.
///
/// Every image token is "unmasked" here: its input at step i is the template latent noised to
/// level i with the template's fixed noise, exactly the input unmasked tokens get in a later
/// edit, so no sampler update is needed. The counterpart of PrepareRun for the DiT family.
///
/// A prompt-keyed entry may instead be recorded from a live stroke (from_stroke): the stroke's
/// edit is run in full recompute under its prompt and every token's K/V recorded. Its text
/// tokens then attended to generated content in the stroke's region, not to the template there,
/// which is what later strokes (the same prompt, a grown mask) see: measured on infill-tiny 2,
/// a template-trajectory entry's text K/V cost prompt-keyed edits 0.04 SSIM against full
/// recompute (bench_model_quality).
/// Under classifier-free guidance a prompt-keyed entry holds both halves of every step, the
/// prompted then the null-prompt one (flux2_prompt_keyed_blocks), so that an edit's two halves
/// read the same context.
/// Threading: used by one thread at a time; the entry is complete (and immutable) once done().

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>

#include "cache/activation_entry.h"
#include "common/status.h"
#include "model/flux2_transformer.h"
#include "model/latent_codec.h"
#include "pipeline/cached_kv.h"
#include "pipeline/flux2_edit_session.h"
#include "pipeline/sampler.h"
#include "pipeline/template_image.h"

namespace infill {

/// FLUX.2's schedule for a template: Euler RF, shifted for its image token count.
Result<Sampler> flux2_sampler(const TemplateImage& tmpl, int steps);

/// The live stroke a prompt-keyed entry is recorded from.
struct Flux2Stroke {
  Flux2EditParams params;                    ///< the stroke's edit (its mask, prompt rows, seed, ...)
  std::shared_ptr<const LatentCodec> codec;  ///< the edit's codec (a session needs one; nothing is decoded)
};

class Flux2PrepareRun {
 public:
  /// `text` [L, context_dim] float32: the rows of the prompt the entry is keyed by.
  /// `guidance` is embedded for models with guidance_embed (FLUX.2 [dev]) and ignored otherwise.
  /// `null_text` [L, context_dim] (a guided prompt-keyed entry; undefined otherwise): the empty
  /// prompt's rows, whose sequence is recorded as the entry's second half.
  static Result<std::unique_ptr<Flux2PrepareRun>> create(std::shared_ptr<const Flux2Transformer> model,
                                                         std::shared_ptr<const TemplateImage> tmpl, at::Tensor text,
                                                         int steps, uint64_t template_seed, double guidance,
                                                         at::Tensor null_text = {}, AdapterSet adapters = {},
                                                         std::vector<at::Tensor> references = {},
                                                         std::shared_ptr<AdapterLoad> adapter_load = {},
                                                         int adapters_from_step = 0);
  /// A prompt-keyed entry recorded from `stroke` (keyed by its prompt, steps and template seed).
  /// Steps before the stroke's first (strength < 1) record the template's trajectory.
  static Result<std::unique_ptr<Flux2PrepareRun>> from_stroke(std::shared_ptr<const Flux2Transformer> model,
                                                              std::shared_ptr<const TemplateImage> tmpl,
                                                              Flux2Stroke stroke);

  int steps() const { return sampler_->steps(); }
  const Flux2Transformer& model() const { return *model_; }
  int step() const { return step_; }
  bool done() const { return step_ >= sampler_->steps(); }
  /// The next step applies adapters still being read (adapter_load.h).
  bool waiting_for_adapters() const;
  /// Tokens computed at every step: the sequence (text + image + reference), twice for a
  /// guided prompt-keyed entry.
  int64_t tokens() const;
  /// Query-key pairs attended at every step: the sequence's length squared, per half.
  double attention_pairs() const;
  /// Runs the next step's forward, recording its K/V. Precondition: !done(). A model error
  /// throws (c10::Error); the run is then unusable.
  void run_step();
  /// Whether the steps may run as step_segments / step_done on several devices (a template's
  /// trajectory; not a run recorded from a live stroke, whose steps sample).
  bool splits_over_devices() const;
  /// The next step's segments (one, or the prompted and null-prompt halves), their sinks set
  /// to record it: a whole-sequence forward each, which the caller runs as it likes, e.g. in
  /// sequence parallel over several devices (model/flux2_sequence_parallel.h), then calls
  /// step_done. Precondition: !done() and splits_over_devices(). run_step is forward of these,
  /// then step_done.
  std::vector<Flux2Segment> step_segments();
  void step_done();
  /// The entry; complete once done().
  std::shared_ptr<const ActivationEntry> entry() const { return entry_; }

 private:
  Flux2PrepareRun() = default;
  // The segments of the template's trajectory at step_ (every step of a template-keyed run).
  std::vector<Flux2Segment> trajectory_segments();
  std::shared_ptr<const Flux2Transformer> model_;
  std::shared_ptr<const TemplateImage> tmpl_;
  std::optional<Sampler> sampler_;
  std::shared_ptr<ActivationEntry> entry_;
  std::shared_ptr<AdapterLoad> adapter_load_;
  int adapters_from_step_ = 0;
  AdapterSet adapters_;  // every segment's LoRAs: the entry is keyed by them
  std::unique_ptr<EntryKvSink> sink_, null_sink_;  // null_sink_: the null half's, when recorded
  at::Tensor text_, null_text_, text_ids_, clean_, noise_, image_ids_;
  at::Tensor no_mask_rows_;  // [N, mask_channels] zeros
  at::Tensor reference_;     // [R, in_channels + mask_channels] the template's and the references' clean latents
  double guidance_ = 0.0;
  int step_ = 0;
  std::unique_ptr<Flux2EditSession> stroke_;  // null: the template's trajectory at every step
};

}  // namespace infill
