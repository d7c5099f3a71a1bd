#pragma once
/// The denoising state of one FLUX.2 edit, advanced one step at a time: the counterpart of
/// EditSession for the FLUX.2 family, with the same split (segments() -> forward, possibly
/// packed with other sessions' segments -> apply()) so that a serving worker batches it.
///
/// The template enters twice, as klein edits: as the noisy latent (image tokens, time 0) and as
/// reference tokens (time 10, the clean latent); the edit's reference images follow as
/// reference tokens at time 20, 30, ... (flux2_sequence.h). Reference tokens are never masked:
/// their K/V are read from the entries like the unmasked image tokens'. Per step, masked image tokens carry the
/// sampler state; unmasked ones are reset to the template noised to the next level with the
/// template's fixed noise, so their inputs equal those of the prepare run.
///
/// Cache modes, picked per edit from the entries given (Flux2Cache):
/// - prompt-keyed: an entry recorded under this edit's prompt; each step computes the masked
///   image tokens only, reading every other token's K/V (text, unmasked image, reference);
/// - template-keyed: an entry recorded under the empty prompt; each step computes the text
///   tokens and the masked image tokens (the edit's text K/V replace the empty prompt's),
///   reading the unmasked image and reference tokens' K/V;
/// - off: every token at every step (the baseline, and the fallback without an entry).
/// Base (undistilled) models with guidance > 1 run classifier-free guidance: a second segment
/// per step under the empty prompt. It reads the null half of a guided prompt-keyed entry when
/// the edit has one, else the template-keyed entry as its own prompt-keyed one. The halves must
/// read the same context: guidance multiplies the difference of their errors (measured on
/// infill-tiny 2 at guidance 3, a prompt-keyed entry holding the prompted half only cost 0.013
/// SSIM against full recompute where an exact one cost none at guidance 1).
/// Models with guidance_embed (FLUX.2 [dev]) embed the guidance instead.
/// A session may also *record* (prepare runs from a live stroke, Flux2PrepareRun): each segment
/// is then computed whole at every step and its K/V written to a sink, making a prompt-keyed
/// entry whose text tokens attended to the stroke's generated content; guided, the entry holds
/// both halves (flux2_prompt_keyed_blocks).
/// The state lives on the transformer's device (issue 39): the latents, noise, mask cells,
/// reference rows, text rows, positions, RoPE tables of the rows computed and the timestep
/// embeddings of every level are put there once, at create; a step's segments are gathered
/// there and its prediction applied there (the sampler update, the reset of unmasked tokens).
/// The host waits only for previews (predicted_latent) and the end (finish).
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
#include "model/flux2_transformer.h"
#include "model/latent_codec.h"
#include "pipeline/adapter_load.h"
#include "pipeline/cached_kv.h"
#include "pipeline/edit_session.h"
#include "pipeline/mask.h"
#include "pipeline/sampler.h"
#include "pipeline/streamed_kv.h"
#include "pipeline/template_image.h"

namespace infill {

enum class Flux2CacheMode { kOff = 0, kTemplateKeyed = 1, kPromptKeyed = 2 };
/// "off", "template_keyed", "prompt_keyed".
const char* flux2_cache_mode_name(Flux2CacheMode mode);

struct Flux2EditParams {
  at::Tensor mask;       ///< [H, W] float in [0, 1] at the template's pixel size
  at::Tensor prompt;     ///< [L, context_dim] float32: the edit's text rows
  /// [L, context_dim]: the empty prompt's rows, for classifier-free guidance (base models with
  /// guidance > 1); undefined otherwise.
  at::Tensor null_prompt;
  /// guidance_embed models: the embedded guidance; others: the CFG scale (> 1 runs a second,
  /// null-prompt segment per step; 1 = none, as distilled klein runs).
  double guidance = 1.0;
  uint64_t seed = 0;            ///< noise of the masked region
  double strength = 1.0;        ///< (0, 1]: 1 regenerates from pure noise
  int steps = 4;
  uint64_t template_seed = 0;   ///< seed of the template's fixed noise (part of the entry's key)
  int halo_tokens = 1;          ///< masked-token dilation, in tokens
  float feather_px = 4.0f;      ///< inward feather of the composite
  int decode_margin = 4;        ///< latent pixels of context decoded around the mask's box
  /// LoRAs of every segment (both halves under guidance); the entries read must have been
  /// recorded under the same set and strengths (their keys say so).
  AdapterSet adapters;
  /// EditParams::adapter_load and adapters_from_step: steps before adapters_from_step carry no
  /// adapters; from there a load must be ready (the worker sees to it; segments() throws else).
  std::shared_ptr<AdapterLoad> adapter_load;
  int adapters_from_step = 0;
  /// Reference images' latents [C, h_i, w_i] (at most kMaxReferenceImages), in order; the
  /// entries read must have been recorded with the same ones (their keys name them).
  std::vector<at::Tensor> references;
};

/// Whether an edit at `guidance` runs classifier-free guidance (a second, null-prompt segment
/// per step): base models without guidance_embed at guidance > 1.
bool flux2_runs_cfg(const Flux2Config& cfg, double guidance);
/// Blocks of a prompt-keyed entry recorded at `guidance`: the prompted half's depth, and under
/// classifier-free guidance the null half's after them (its block b at depth + b).
int flux2_prompt_keyed_blocks(const Flux2Config& cfg, double guidance);

/// Entries of the template under the same schedule and template seed, either may be null.
struct Flux2Cache {
  std::shared_ptr<const ActivationEntry> prompt_keyed;    ///< recorded under the edit's prompt
  std::shared_ptr<const ActivationEntry> template_keyed;  ///< recorded under the empty prompt
  /// Their copies on the transformer's GPU (the device tier), when there: read instead.
  std::shared_ptr<const DeviceKvEntry> prompt_keyed_resident, template_keyed_resident;
  /// The template-keyed entry when it is only in the disk tier: streamed block by block as
  /// each step reaches it. Used instead of template_keyed, with no prompt-keyed entry.
  std::shared_ptr<StreamedKvSource> template_keyed_streamed;
  /// Template-keyed mode only: the first blocks of every step are computed on every token
  /// instead of read (the load plan's recomputed prefix for a streamed entry, whose reads of
  /// those blocks would stall); the masked rows go on from there. On a resident entry: the
  /// same edit, for comparing the two. 0 .. depth.
  int recompute_blocks = 0;
};

class Flux2EditSession {
 public:
  /// Validates `params` against the model and template (mask size, prompt width, strength,
  /// steps, entry layouts) and sets up the initial noisy latent.
  /// `record` (not owned, may be null): every segment is computed whole, whatever the entries,
  /// and the prompted one's K/V go to `record` at each step (set_step is called);
  /// `record_null` (not owned; required with `record` under classifier-free guidance) takes
  /// the null-prompt segment's.
  static Result<std::unique_ptr<Flux2EditSession>> create(std::shared_ptr<const Flux2Transformer> model,
                                                          std::shared_ptr<const LatentCodec> codec,
                                                          std::shared_ptr<const TemplateImage> tmpl,
                                                          const Flux2EditParams& params, Flux2Cache cache,
                                                          EntryKvSink* record = nullptr, EntryKvSink* record_null = nullptr);

  bool done() const { return step_ >= sampler_->steps() || tokens_.count() == 0; }
  int step() const { return step_; }
  int first_step() const { return first_step_; }
  const TokenSet& tokens() const { return tokens_; }
  Flux2CacheMode mode() const { return mode_; }
  /// The next step applies adapters still being read (Flux2EditParams::adapter_load).
  bool waiting_for_adapters() const;
  bool guided() const { return guided_; }

  /// The segments of the next step (one, or two under classifier-free guidance: prompted,
  /// then empty prompt). Valid until apply(). Precondition: !done().
  std::span<Flux2Segment> segments();
  /// Whether the two halves of a guided step can run at once on two threads (each on its own
  /// device): no source is shared between them (a streamed entry is read once for both).
  bool halves_split() const;
  /// As segments(), the null half reading a source of its own where it would share the
  /// prompted half's (a second reader of the same template-keyed entry), so that the halves
  /// can run at once on two threads. Precondition: guided() and halves_split().
  std::span<Flux2Segment> split_segments();
  /// Whether the next step may run in sequence parallel over several devices: every token
  /// computed (no entry), or the masked rows reading entries that each rank can read through a
  /// reader of its own (not a streamed entry, read once by one thread; no recomputed prefix).
  bool sequence_splits() const;
  /// For a sequence-parallel step: per segment of segments() (call it first), a new reader of
  /// what its source reads at this step, of which each rank makes its own
  /// (EntryKvSource::another_reader); null for a segment that reads none.
  /// Precondition: sequence_splits().
  std::vector<std::shared_ptr<const EntryKvSource>> segment_readers() const;
  /// Rows Flux2Transformer::forward returns for segments().
  int64_t prediction_rows() const;
  /// Takes the prediction rows of segments() and advances one step.
  Status apply(const at::Tensor& prediction);
  /// As apply(), landing on level `next_step` in (step(), steps]: the steps in between are
  /// dropped (an overloaded scheduler's trade), the Euler update spanning the whole interval.
  Status apply(const at::Tensor& prediction, int next_step);
  int steps() const { return sampler_->steps(); }
  /// Current estimate of the clean latent, known region filled in (for previews). [C, h, w]
  at::Tensor predicted_latent() const;
  /// Decodes the masked region and composites it onto the template's pixels.
  Result<EditOutput> finish() const;

 private:
  Flux2EditSession() = default;
  // The segment of one text reading its cached K/V from `kv` (null: every token is computed);
  // the caller has set `kv` to this step.
  void build_segment(Flux2Segment& s, const at::Tensor& text, KvSource* kv, bool compute_text);
  // Cos and sin tables of rows with these ids (joined in order), on the device: made on first
  // use, kept.
  struct RopeTables {
    at::Tensor cos, sin;
  };
  const RopeTables& rope_tables(RopeTables& slot, std::initializer_list<at::Tensor> ids);
  int64_t rows_of(const Flux2Segment& s) const;

  std::shared_ptr<const Flux2Transformer> model_;
  std::shared_ptr<const LatentCodec> codec_;
  std::shared_ptr<const TemplateImage> tmpl_;
  Flux2EditParams params_;
  Flux2Cache cache_;
  Flux2CacheMode mode_ = Flux2CacheMode::kOff;
  std::optional<Sampler> sampler_;
  TokenSet tokens_;
  int64_t grid_h_ = 0, grid_w_ = 0, text_rows_ = 0;
  int64_t sequence_ = 0;  // text + image + reference tokens
  at::Tensor clean_;          // [N, C] template latent tokens
  at::Tensor mask_rows_;      // [N, k] mask cells of image tokens (k = the model's mask_channels)
  at::Tensor reference_rows_; // [R, C + k] the template's clean latent and the references', mask cells zero
  at::Tensor noise_;          // [N, C] template noise outside the mask, edit noise inside
  at::Tensor x_;              // [N, C] current noisy latent tokens
  at::Tensor last_velocity_;  // [M, C] of the last applied step, for previews
  at::Tensor text_ids_, image_ids_, masked_ids_, masked_positions_text_, masked_positions_;
  // On the device (the CPU copies above are what the forward checks against and what sinks and
  // the CPU kernels read).
  at::Tensor masked_index_;       // tokens_.indices
  at::Tensor masked_mask_rows_;   // mask_rows_ of the masked tokens
  at::Tensor masked_positions_text_device_, masked_positions_device_;
  at::Tensor time_embeddings_;    // [steps, time_embed_dim] float: level i's timestep embedded
  at::Tensor guidance_embedding_; // guidance_embed models: the guidance embedded
  RopeTables rope_full_, rope_masked_text_, rope_masked_;
  int step_ = 0;
  int first_step_ = 0;
  bool guided_ = false;
  Flux2Segment segments_[2];
  std::unique_ptr<EntryKvSource> kv_;
  // The null-prompt half's own source, when it reads another entry or half than kv_ does.
  std::unique_ptr<EntryKvSource> null_kv_;
  // The null half's reader of kv_'s entry when the halves run on two threads (split_segments).
  std::unique_ptr<EntryKvSource> split_null_kv_;
  EntryKvSink* record_ = nullptr;       // not owned
  EntryKvSink* record_null_ = nullptr;  // not owned
};

}  // namespace infill
