#pragma once
/// What a serving worker needs of a loaded model, whatever its family: making templates,
/// naming and running prepare jobs, setting up edit sessions, and one packed forward per step
/// over the sessions it batches. The DiT family (dit_edit_model.h) and FLUX.2
/// (flux2_edit_model.h) implement it; the worker's step loop, scheduler and cache handling
/// are shared.
///
/// Threading: an EditModel is immutable after construction and used from the step loop and
/// the task pool at once; a session or prepare run is used by one thread at a time.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "cache/activation_entry.h"
#include "common/status.h"
#include "model/compute_device.h"
#include "model/step_graph_stats.h"
#include "pipeline/edit_session.h"
#include "pipeline/mask.h"
#include "pipeline/template_image.h"

namespace infill {

class EditModel;
class SequenceGroup;  // model/sequence_group.h

/// One edit's denoising state as the worker steps it.
class StepSession {
 public:
  virtual ~StepSession() = default;
  virtual bool done() const = 0;
  virtual int step() const = 0;
  virtual int first_step() const = 0;
  /// Steps of the schedule (the last level).
  virtual int steps() const = 0;
  virtual const TokenSet& tokens() const = 0;
  /// Whether each step runs a second (null-prompt) segment.
  virtual bool guided() const = 0;
  /// Rows of the packed forward's output that belong to this session's next step.
  virtual int64_t prediction_rows() const = 0;
  /// Takes this session's rows and lands on level `next_step` in (step(), steps()].
  virtual Status apply(const at::Tensor& prediction, int next_step) = 0;
  /// Current clean-latent estimate [C, h, w] in the model's scale, for previews.
  virtual at::Tensor predicted_latent() const = 0;
  virtual Result<EditOutput> finish() const = 0;
  /// The next step applies adapters still being read (EditParams::adapter_load): the worker
  /// leaves the session out of rounds until they are.
  virtual bool waiting_for_adapters() const { return false; }

  /// The attention heads of the model when the next step may run in sequence parallel over
  /// several devices (a full recompute, or a masked step reading cached K/V every device can
  /// read), else 0.
  virtual int parallel_heads() const { return 0; }
  /// Whether the next step computes the masked rows only, reading the others' cached K/V (the
  /// worker shares such a step over devices only when the mask is large).
  virtual bool reads_cached_kv() const { return false; }
  /// One rank's share of the next step, run by every rank of a group at once with its member
  /// and the model as loaded on its own device; each gets this session's prediction rows (as
  /// the model's forward of this session alone gives them), for apply.
  using ParallelForward = std::function<at::Tensor(SequenceGroup& member, const EditModel& model_here)>;
  /// The next step's share, in place of the model's forward. Precondition: parallel_heads() > 0.
  virtual ParallelForward parallel_step() { return {}; }
  /// Whether the next step's two guided halves may run at once on two devices, each half on
  /// one (Katz's latent parallelism), through halves_step.
  virtual bool splits_halves() const { return false; }
  /// As parallel_step, for a group of two ranks: rank 0 computes the prompted half, rank 1
  /// the null-prompt half; each gets both halves' rows. Precondition: splits_halves().
  virtual ParallelForward halves_step() { return {}; }
  /// Both at once: each half of the next step in sequence parallel over its own half of a
  /// group's ranks, run by every rank with the whole group's member (the prompted half's ranks
  /// first), its half's member and the model as loaded on its own device; each gets both
  /// halves' rows. Precondition: splits_halves() and parallel_heads() > 0.
  using HalvesForward =
      std::function<at::Tensor(SequenceGroup& whole, SequenceGroup& half, const EditModel& model_here)>;
  virtual HalvesForward halves_parallel_step() { return {}; }
};

/// A template's prepare run, sliced one step at a time by the worker.
class StepPrepare {
 public:
  virtual ~StepPrepare() = default;
  virtual const ActivationKey& key() const = 0;
  virtual const std::string& template_id() const = 0;
  /// Tokens computed at every step (for the cost model).
  virtual int64_t tokens() const = 0;
  /// Query-key pairs attended at every step (for the cost model): tokens()^2 for one sequence,
  /// less when the tokens are several sequences attending each within its own.
  virtual double attention_pairs() const {
    const double t = static_cast<double>(tokens());
    return t * t;
  }
  virtual int steps() const = 0;
  virtual bool done() const = 0;
  /// Runs the next step. A model error throws (c10::Error).
  virtual void run_step() = 0;
  virtual std::shared_ptr<const ActivationEntry> entry() const = 0;
  /// As StepSession::waiting_for_adapters: the worker runs no slice of it until they are read.
  virtual bool waiting_for_adapters() const { return false; }

  /// The attention heads of the model when the next step may run on several devices in
  /// sequence parallel (parallel_step), else 0.
  virtual int parallel_heads() const { return 0; }
  /// One rank's share of a step: run by every rank of a sequence-parallel group at once, each
  /// with its member of the group and this model as loaded on its own device.
  using ParallelShare = std::function<void(SequenceGroup& member, const EditModel& model_here)>;
  /// The next step as a share every rank runs, in place of run_step; call parallel_step_done
  /// once every rank ran it. Precondition: parallel_heads() > 0.
  virtual ParallelShare parallel_step() { return {}; }
  virtual void parallel_step_done() {}
};

/// What clients are told of a model (GET /v1/models) and the defaults requests start from.
struct EditModelInfo {
  std::string id;           ///< unique among loaded models; part of every cache key
  std::string name;
  std::string description;
  std::string family;       ///< "dit" or "flux2"
  int default_steps = 0;
  std::string default_sampler;
  double default_guidance = 1.0;
  int64_t max_image_pixels = 0;
  /// Prompt words the model knows; empty for free text (a text encoder).
  std::vector<std::string> vocabulary;
  bool free_text = false;
};

class EditModel {
 public:
  virtual ~EditModel() = default;
  virtual const EditModelInfo& info() const = 0;
  /// "infill-tiny", "flux.2-klein-4b", ...: names the model in errors and metrics.
  virtual const std::string& name() const = 0;
  /// Sets the request's prompt from text: checked against the vocabulary (invalid_argument
  /// naming the unknown word), or kept for the text encoder.
  virtual Status set_prompt(EditParams& params, const std::string& text) const = 0;
  /// Checks the request's sampler and steps against what the model can run.
  virtual Status check_schedule(const EditParams& params) const = 0;
  /// Pixels per token along each axis (codec factor x patch size).
  virtual int token_pixels() const = 0;
  /// Steps the request's schedule resolves to (its own, or the model's default).
  virtual int resolved_steps(const EditParams& params) const = 0;
  /// Decodes, pads and encodes a template (on the pool).
  virtual Result<std::shared_ptr<const TemplateImage>> make_template(std::span<const std::byte> bytes,
                                                                      const std::string& name_for_errors) const = 0;
  /// The key of the cache entry an edit with `params` reads.
  virtual ActivationKey cache_key(const TemplateImage& tmpl, const EditParams& params) const = 0;
  /// The key of an entry recorded under the edit's own prompt (FLUX.2's prompt-keyed cache),
  /// or nullopt for models without one.
  virtual std::optional<ActivationKey> prompt_cache_key(const TemplateImage& tmpl, const EditParams& params) const {
    return std::nullopt;
  }
  /// Sets up an edit (on the pool): validates params, encodes the prompt where the model has
  /// a text encoder. `entry` is the entry of cache_key(), `prompt_entry` the one of
  /// prompt_cache_key(); either may be null (no entry: every token is computed).
  virtual Result<std::unique_ptr<StepSession>> create_session(std::shared_ptr<const TemplateImage> tmpl,
                                                              const EditParams& params,
                                                              std::shared_ptr<const ActivationEntry> entry,
                                                              std::shared_ptr<const ActivationEntry> prompt_entry) const = 0;
  /// Bytes per millisecond a host-resident cache entry crosses to this model's device
  /// (measured when the model was set up on a GPU); 0 when the model reads entries where they
  /// are (the CPU).
  virtual double host_to_device_bytes_per_ms() const { return 0.0; }
  /// create_session for a model on a GPU, with the worker's load plan for a template-keyed
  /// `entry` that must be copied to the device: the first `recompute_if_copied` blocks of every
  /// step run on every token instead of being copied. An entry the device already holds is
  /// read there whatever the plan; on the CPU the plan is ignored (the default).
  virtual Result<std::unique_ptr<StepSession>> create_session_planned(std::shared_ptr<const TemplateImage> tmpl,
                                                                      const EditParams& params,
                                                                      std::shared_ptr<const ActivationEntry> entry,
                                                                      std::shared_ptr<const ActivationEntry> prompt_entry,
                                                                      int recompute_if_copied) const {
    return create_session(std::move(tmpl), params, std::move(entry), std::move(prompt_entry));
  }
  /// Blocks per step of this model's cache entries (the load plan's unit); 0 when its edits
  /// cannot stream an entry from the disk tier (the worker then reads the entry whole).
  virtual int streamable_blocks() const { return 0; }
  /// How many leading blocks of a streamed edit the model can recompute on all tokens instead
  /// of loading (the load plan's recompute prefix is capped here; 0: every block loads).
  virtual int max_recompute_blocks() const { return streamable_blocks(); }
  /// Sets up an edit that streams the entry of cache_key(), found only in the disk tier,
  /// while it steps: blocks [recompute_blocks, streamable_blocks()) read their K/V as the step
  /// reaches them (the I/O overlapping the blocks before), the blocks before run on all
  /// tokens (the load plan's choice). Models without streaming refuse.
  virtual Result<std::unique_ptr<StepSession>> create_streamed_session(std::shared_ptr<const TemplateImage> tmpl,
                                                                       const EditParams& params,
                                                                       std::shared_ptr<StreamedKvSource> streamed,
                                                                       int recompute_blocks) const {
    return Status(ErrorCode::kUnimplemented, "model " + name() + " cannot stream cache entries from disk");
  }
  /// The prepare run that makes the entry of cache_key().
  virtual Result<std::unique_ptr<StepPrepare>> create_prepare(std::shared_ptr<const TemplateImage> tmpl,
                                                              const EditParams& params) const = 0;
  /// The prepare run that makes the entry of prompt_cache_key() (run on the pool: it encodes
  /// the prompt). With a mask in `params` the entry is recorded from that stroke's edit, which
  /// later strokes of the same prompt resemble more than the bare template. Under guidance it
  /// records the null-prompt half too, so it costs two full forwards per step.
  /// Models without prompt-keyed entries refuse.
  virtual Result<std::unique_ptr<StepPrepare>> create_prompt_prepare(std::shared_ptr<const TemplateImage> tmpl,
                                                                     const EditParams& params) const {
    return invalid_argument("model " + name() + " keeps no prompt-keyed cache entries");
  }
  /// One forward over the next step of every session (all created by this model), packed;
  /// each session's prediction_rows() rows in session order, on the device where the
  /// sessions keep their state (FLUX.2: the model's; the DiT family: the CPU).
  virtual at::Tensor forward(std::span<StepSession* const> sessions) const = 0;
  /// The pixels [3, h, w] in [0, 1] of a latent's box (pixel units, multiples of the codec
  /// factor), for previews; undefined when the model has no codec.
  virtual at::Tensor decode_preview(const at::Tensor& latent, const PixelRect& box) const = 0;
  /// Pixels per latent pixel of the codec.
  virtual int codec_factor() const = 0;
  /// Where forward computes: errors of a step name it.
  virtual ComputeDevice device() const { return {}; }
  /// What its step graphs did (FLUX.2 on a GPU, model/flux2_graph_cache.h); zeros otherwise.
  virtual StepGraphStats step_graph_stats() const { return {}; }
  /// Codec calls (template encodes, result and preview decodes) that ran on the codec's CPU
  /// copy because the GPU was out of memory (model/host_fallback_codec.h); nothing for a model
  /// whose codec has no such copy (the CPU's).
  virtual std::optional<int64_t> codec_host_fallbacks() const { return std::nullopt; }
  /// What a sequence-parallel step of this model moves between devices, for the device
  /// team's step predictions (serving/team_planner.h); zeros for models that never share.
  struct ParallelShape {
    int64_t hidden = 0;                ///< elements per row of an all-to-all
    int attention_layers = 0;          ///< Ulysses: 4 all-to-alls per layer
    int64_t prediction_channels = 0;   ///< floats per image row of a step's prediction
  };
  virtual ParallelShape parallel_shape() const { return {}; }
  /// Whether read_adapter can succeed at all (FLUX.2 models).
  virtual bool takes_adapters() const { return false; }
  /// Reads the LoRA file at `path` for this model (model/lora_adapter.h) into host memory:
  /// errors name the file and the key; models that take no adapters refuse. On a GPU the
  /// host form is in the compute dtype and pinned, ready for adapter_on_device.
  virtual Result<std::shared_ptr<const LoraAdapter>> read_adapter(const std::string& path) const {
    return invalid_argument("model " + name() + " takes no LoRA adapters (FLUX.2 models do); " + path + " was not read");
  }
  /// The adapter as forward() reads it, from read_adapter's host form: on a GPU a copy made
  /// there on a copy stream (the compute stream's queue is not in its way; returns once the
  /// copy is done); on the CPU `host` itself. Out of device memory: resource_exhausted.
  virtual Result<std::shared_ptr<const LoraAdapter>> adapter_on_device(std::shared_ptr<const LoraAdapter> host) const {
    return host;
  }
  /// Lets go of device memory only the model still holds: FLUX.2's step graphs stacked with
  /// adapters nothing else holds (deleted from the store, no edit running with them;
  /// model/flux2_graph_cache.h) and its device tier's copies of entries the activation store
  /// dropped. Called when an adapter is deleted (its entries erased); nothing otherwise.
  virtual void release_unused() const {}
  /// The reference image (pipeline/reference_image.h) made from `tmpl`, a template of this
  /// model: errors name it and the limit it breaks; models that take no references refuse.
  virtual Result<ReferenceImage> make_reference(const TemplateImage& tmpl) const {
    return invalid_argument("model " + name() + " takes no reference images (FLUX.2 models do); " + tmpl.id + " was not used");
  }
};

}  // namespace infill
