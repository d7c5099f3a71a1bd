#pragma once
/// The denoising state of one edit, advanced one step at a time.
///
/// A session turns (template, mask, prompt, seed, steps, strength) into a sequence of model
/// calls: `segments()` gives the packed rows of the next step (two segments under
/// classifier-free guidance: with the prompt and with the null prompt), the caller runs them
/// through Dit::forward (alone, or batched with other sessions' segments), and `apply()` takes
/// the prediction rows back. This split lets a serving worker batch many sessions per step.
///
/// Per step, masked tokens carry the sampler state; every latent pixel outside the mask is
/// reset to the template latent noised to the next level with the template's own fixed noise,
/// so the inputs of unmasked tokens equal those of the prepare run and its cached K/V are exact.
/// Threading: a session is used by one thread at a time.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "cache/activation_entry.h"
#include "common/status.h"
#include "model/lora_adapter.h"
#include "model/model.h"
#include "pipeline/adapter_load.h"
#include "pipeline/cached_kv.h"
#include "pipeline/image_io.h"
#include "pipeline/mask.h"
#include "pipeline/reference_image.h"
#include "pipeline/sampler.h"
#include "pipeline/streamed_kv.h"
#include "pipeline/template_image.h"

namespace infill {

/// The denoising schedule a cache entry was computed for.
struct ScheduleSpec {
  std::string sampler;         ///< "" = the model's default
  int steps = 0;               ///< 0 = the model's default
  uint64_t template_seed = 0;  ///< seed of the template's fixed noise
};

enum class CacheMode {
  kUse = 1,  ///< compute masked tokens only, reading the rest from the cache entry
  kOff = 2,  ///< recompute every token at every step (the baseline)
};

struct EditParams {
  at::Tensor mask;          ///< [H, W] float in [0, 1] at the template's pixel size
  at::Tensor prompt;        ///< undefined = null prompt; class id or conditioning vector
  /// Free text, for models with a text encoder (FLUX.2): encoded when the session is set up.
  std::string prompt_text;
  /// Classifier-free guidance: prediction = null + scale * (prompt - null). 1 = no guidance
  /// (one segment per step); above 1 each step runs two segments. Range [1, 20]; ignored
  /// without a prompt.
  double guidance_scale = 1.0;
  uint64_t seed = 0;        ///< noise of the masked region
  double strength = 1.0;    ///< (0, 1]: 1 regenerates from pure noise
  ScheduleSpec schedule;
  CacheMode cache = CacheMode::kUse;
  int halo_tokens = 1;      ///< masked-token dilation, in tokens
  float feather_px = 4.0f;  ///< inward feather of the composite
  int decode_margin = 4;    ///< latent pixels of context decoded around the mask's box
  /// LoRAs, in order, each with its strength (FLUX.2 only); part of every cache key.
  AdapterSet adapters;
  /// The adapters while their files are read (adapter_load.h); `adapters` is then empty.
  std::shared_ptr<AdapterLoad> adapter_load;
  /// Katz's K: the schedule's steps before this one run without the adapters (so that a
  /// loading adapter need not hold them up). Part of the cache keys of edits with adapters:
  /// an entry recorded with one K serves only edits with the same K. 0: every step.
  int adapters_from_step = 0;
  /// Reference images (FLUX.2 only; reference_image.h), in order; their ids are part of every
  /// cache key.
  std::vector<ReferenceImage> references;
};

struct EditOutput {
  PixelImage image;           ///< same size and format as the template
  int steps_run = 0;
  int steps_dropped = 0;      ///< steps of the schedule skipped under overload
  int64_t masked_tokens = 0;
  int64_t total_tokens = 0;
  bool used_cache = false;
  /// How cached K/V were used: "off", "template_keyed" (the DiT family's only mode, and
  /// FLUX.2's with an empty-prompt entry) or "prompt_keyed" (FLUX.2 with an entry under the
  /// edit's own prompt).
  std::string cache_mode = "off";
  /// The prompt had more tokens than the text encoder reads and was cut (as upstream cuts).
  bool prompt_truncated = false;
  bool streamed_cache = false;  ///< cached K/V were streamed from the disk tier
  int recomputed_blocks = 0;    ///< leading blocks run on all tokens by the load plan
  /// The template's entry was copied from host memory to the GPU block by block (not held by
  /// the device tier), recomputed_blocks of every step recomputed instead.
  bool copied_to_device = false;
  PixelRect region;           ///< pixel box that was decoded
  /// EditParams::adapters_from_step of an edit with adapters (0 without).
  int adapters_from_step = 0;
};

/// Resolves "" / 0 in `spec` to the model's defaults.
ScheduleSpec resolve_schedule(const Model& model, const ScheduleSpec& spec);
/// The cache key of a template under a schedule.
ActivationKey make_cache_key(const Model& model, const TemplateImage& tmpl, const ScheduleSpec& spec);
/// Builds the sampler for a model and a schedule, validating names and ranges.
Result<Sampler> make_model_sampler(const Model& model, const ScheduleSpec& spec);
/// The template's fixed noise: [C, h, w], a pure function of the seed and the shape.
at::Tensor template_noise(const TemplateImage& tmpl, uint64_t seed);
/// Model input [C_in, h, w] from a noisy latent, the known latent and the latent mask.
at::Tensor model_input(const Model& model, const at::Tensor& noisy, const at::Tensor& known,
                       const at::Tensor& latent_mask);

/// Rows `token_ids` (int64, any order) of Dit::patchify(chw) for patch size `patch_size`,
/// gathered directly from the [c, h, w] tensor: [M, c * p * p]. The edit's step loop builds
/// its masked tokens' input this way instead of patchifying the whole grid every step.
at::Tensor patch_rows(const at::Tensor& chw, int64_t patch_size, const at::Tensor& token_ids);

/// `mask` checked against the template (2-D, the template's pixel size, finite) as float32
/// clamped to [0, 1]; errors name what is wrong.
Result<at::Tensor> checked_edit_mask(const at::Tensor& mask, const TemplateImage& tmpl);
/// Strength in (0, 1], halo 0..64 tokens, feather 0..256 px; errors name the parameter.
Status check_edit_ranges(double strength, int halo_tokens, float feather_px);

/// Where a mask-aware edit reads the template's cached K/V from.
struct CacheSource {
  std::shared_ptr<const ActivationEntry> entry;  ///< a RAM-resident entry, or
  std::shared_ptr<StreamedKvSource> streamed;    ///< slabs streamed from the disk tier
  /// Leading blocks run on all tokens (the load plan's choice for a streamed entry; with a
  /// RAM entry the same plan forced, which a streamed edit must equal bit for bit).
  int recompute_blocks = 0;
  bool empty() const { return !entry && !streamed; }
};

class EditSession {
 public:
  /// Validates `params` against the template (mask size, strength, schedule, prompt) and sets
  /// up the initial noisy latent. `cache` must hold the entry for make_cache_key(...) when
  /// params.cache is kUse and the mask is not empty.
  static Result<std::unique_ptr<EditSession>> create(std::shared_ptr<const Model> model,
                                                     std::shared_ptr<const TemplateImage> tmpl,
                                                     const EditParams& params, CacheSource cache);

  bool done() const { return step_ >= sampler_->steps() || tokens_.count() == 0; }
  int step() const { return step_; }
  int first_step() const { return first_step_; }
  const TokenSet& tokens() const { return tokens_; }
  bool uses_cache() const { return params_.cache == CacheMode::kUse; }

  /// The segments of the next step: one, or two under guidance (prompted, then null
  /// prompt). Valid until apply(). Precondition: !done().
  std::span<DitSegment> segments();
  /// Prediction rows of one step for these segments, concatenated in segment order (what
  /// Dit::forward returns for them): [segments * carried rows, p * p * C_out].
  int64_t prediction_rows() const;
  /// Takes the prediction rows of segments() and advances one step. Fails (and the edit
  /// with it) when streamed cache slabs could not be read.
  Status apply(const at::Tensor& prediction);
  /// As apply(), but the step lands on step index `next_step` in (step(), steps]: the steps
  /// in between are dropped (a quality-for-latency trade an overloaded scheduler makes,
  /// reported through steps_run). Unmasked latents are reset to the template at that level,
  /// whose cached K/V the next step reads. next_step == step() + 1 is apply().
  Status apply(const at::Tensor& prediction, int next_step);
  /// Steps skipped so far by apply(prediction, next_step).
  int steps_dropped() const { return steps_dropped_; }
  /// Whether each step runs a second, null-prompt segment.
  bool guided() const { return guided_; }
  /// Current estimate of the clean latent, known region filled in (for previews). [C, h, w]
  at::Tensor predicted_latent() const;
  /// Decodes the masked region and composites it onto the template's pixels.
  Result<EditOutput> finish() const;

 private:
  EditSession() = default;
  std::shared_ptr<const Model> model_;
  std::shared_ptr<const TemplateImage> tmpl_;
  EditParams params_;
  CacheSource cache_;
  std::optional<Sampler> sampler_;
  TokenSet tokens_;
  at::Tensor latent_mask_;  // [h, w] float 0/1
  at::Tensor keep_mask_;    // [1, h, w] bool: latent pixels reset to the template every step
  at::Tensor known_;        // [C, h, w] template latent with the masked region zeroed
  at::Tensor noise_;        // [C, h, w] template noise outside the mask, edit noise inside
  at::Tensor template_noise_;
  at::Tensor x_;            // [C, h, w] current noisy latent
  at::Tensor last_prediction_;
  // Conditioning of every step level from first_step_ on (prompted, null prompt), computed in
  // create(), i.e. during pre-processing, so that segments() on the step loop only indexes.
  std::vector<at::Tensor> cond_, null_cond_;
  // The masked tokens' model-input rows, built per step without concatenating and patchifying
  // the whole grid: only the noisy latent changes between steps, so its rows are gathered
  // through positions computed once (noisy_positions_, [M, C * p * p] into x_), while the
  // rows of the other inputs (known latent, mask) are gathered once in create().
  // input_rows_[i] is input i's block of columns, undefined for the noisy latent.
  at::Tensor noisy_positions_;
  std::vector<at::Tensor> input_rows_;
  at::Tensor masked_input_rows() const;
  int step_ = 0;
  int first_step_ = 0;
  int steps_dropped_ = 0;
  bool guided_ = false;
  DitSegment segments_[2];
  std::unique_ptr<EntryKvSource> kv_;
  std::unique_ptr<RepeatingKvSource> shared_kv_;  // both guidance segments read one fetch
};

}  // namespace infill
