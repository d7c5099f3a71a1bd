#pragma once
/// The FLUX.2 family behind the worker's EditModel interface: prompts encoded by the model's
/// text encoder when a session is set up (on the task pool, through the prompt cache),
/// template-keyed prepare runs under the empty prompt, Flux2EditSession, packed
/// Flux2Transformer::forward.
/// load_flux2_edit_model reads a model folder as users download it (model/flux2_folder.h).

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>

#include "model/flux2_graph_cache.h"
#include "model/flux2_transformer.h"
#include "model/latent_codec.h"
#include "model/qwen3_prompt_encoder.h"
#include "pipeline/device_kv_tier.h"
#include "pipeline/edit_model.h"

namespace infill {

struct Flux2Cache;  // pipeline/flux2_edit_session.h

struct Flux2EditModelParts {
  std::string name;  ///< the model's name in errors and metrics
  /// The model's id (API, cache keys): the name and an identity of its weight files, so that
  /// the disk cache never serves K/V of other weights under the same name. Empty: the name.
  std::string id;
  std::string description;
  std::shared_ptr<const Flux2Transformer> transformer;
  std::shared_ptr<const LatentCodec> codec;          ///< the VAE: templates and results
  std::shared_ptr<const LatentCodec> preview_codec;  ///< e.g. TAEF2; null = the VAE
  std::shared_ptr<Qwen3PromptEncoder> text;          ///< prompt text -> text rows
  int default_steps = 4;
  double default_guidance = 1.0;  ///< the folder's default (clients start from it)
  int64_t max_image_pixels = int64_t{4096} * 4096;
  /// Bytes of cached K/V the device tier keeps on the transformer's GPU (templates in active
  /// use); unused on the CPU. A klein 4B entry at 512x512 with 4 steps is 3.1 GB.
  int64_t device_cache_bytes = int64_t{8} << 30;
  /// Bytes of device memory the CUDA graphs of masked rounds may hold (model/flux2_graph_cache.h):
  /// a step bound by kernel launches replays its round instead; 0 runs every round eagerly.
  /// Unused on the CPU, where a step is not launch-bound (nothing changes there). 0 by default
  /// until a GPU run has checked the graphs against the eager step (the [cuda] tests of
  /// scripts/gpu_check.sh): a wrong replay would change images silently. The benchmarks and
  /// tests that use them give 2 GiB.
  int64_t step_graph_bytes = 0;
  /// Tests: the step graphs on the CPU too, where their pieces re-run (model/work_capture.h):
  /// nothing is gained there, but the worker's path through them runs and is checked.
  bool step_graphs_on_cpu = false;
  /// Bytes per ms from pinned host memory to the transformer's GPU; 0: measured when the
  /// model is created there (a test may state a bus of its own).
  double host_to_device_bytes_per_ms = 0.0;
};

class Flux2EditModel final : public EditModel {
 public:
  /// Checks that the parts fit together (codec channels and text width against the
  /// transformer) and encodes the empty prompt; errors name the part.
  static Result<std::shared_ptr<const Flux2EditModel>> create(Flux2EditModelParts parts);

  const Flux2EditModelParts& parts() const { return parts_; }

  const EditModelInfo& info() const override { return info_; }
  const std::string& name() const override { return parts_.name; }
  Status set_prompt(EditParams& params, const std::string& text) const override;
  Status check_schedule(const EditParams& params) const override;
  int token_pixels() const override { return parts_.codec->factor(); }
  int resolved_steps(const EditParams& params) const override;
  Result<std::shared_ptr<const TemplateImage>> make_template(std::span<const std::byte> bytes,
                                                              const std::string& name_for_errors) const override;
  ActivationKey cache_key(const TemplateImage& tmpl, const EditParams& params) const override;
  /// The template-keyed key with the prompt's digest (and the text encoder's identity) as
  /// its conditioning.
  std::optional<ActivationKey> prompt_cache_key(const TemplateImage& tmpl, const EditParams& params) const override;
  Result<std::unique_ptr<StepSession>> create_session(std::shared_ptr<const TemplateImage> tmpl, const EditParams& params,
                                                      std::shared_ptr<const ActivationEntry> entry,
                                                      std::shared_ptr<const ActivationEntry> prompt_entry) const override;
  /// On a GPU the session reads its entries from the device tier; a template-keyed entry the
  /// tier cannot hold is copied per block on the copy stream, its first `recompute_if_copied`
  /// blocks recomputed instead (template-keyed mode only).
  Result<std::unique_ptr<StepSession>> create_session_planned(std::shared_ptr<const TemplateImage> tmpl,
                                                              const EditParams& params,
                                                              std::shared_ptr<const ActivationEntry> entry,
                                                              std::shared_ptr<const ActivationEntry> prompt_entry,
                                                              int recompute_if_copied) const override;
  double host_to_device_bytes_per_ms() const override { return parts_.host_to_device_bytes_per_ms; }
  /// A template-keyed entry in the disk tier streams block by block; the plan's recomputed
  /// prefix runs every token through the first blocks, the masked ones from there on.
  int streamable_blocks() const override;
  bool takes_adapters() const override { return true; }
  Result<std::shared_ptr<const LoraAdapter>> read_adapter(const std::string& path) const override;
  Result<std::shared_ptr<const LoraAdapter>> adapter_on_device(std::shared_ptr<const LoraAdapter> host) const override;
  /// Recently made references are kept (a scaled-down one costs a VAE encode).
  Result<ReferenceImage> make_reference(const TemplateImage& tmpl) const override;
  Result<std::unique_ptr<StepSession>> create_streamed_session(std::shared_ptr<const TemplateImage> tmpl,
                                                               const EditParams& params,
                                                               std::shared_ptr<StreamedKvSource> streamed,
                                                               int recompute_blocks) const override;
  /// A template-keyed edit on the RAM-resident `entry` with its first `recompute_blocks`
  /// blocks computed on every token: the resident counterpart of a streamed edit under that
  /// plan (tests and benchmarks compare the two).
  Result<std::unique_ptr<StepSession>> create_session_recomputing(std::shared_ptr<const TemplateImage> tmpl,
                                                                  const EditParams& params,
                                                                  std::shared_ptr<const ActivationEntry> entry,
                                                                  int recompute_blocks) const;
  Result<std::unique_ptr<StepPrepare>> create_prepare(std::shared_ptr<const TemplateImage> tmpl,
                                                      const EditParams& params) const override;
  Result<std::unique_ptr<StepPrepare>> create_prompt_prepare(std::shared_ptr<const TemplateImage> tmpl,
                                                             const EditParams& params) const override;
  at::Tensor forward(std::span<StepSession* const> sessions) const override;
  at::Tensor decode_preview(const at::Tensor& latent, const PixelRect& box) const override;
  int codec_factor() const override { return parts_.codec->factor(); }
  /// The transformer's device (the text encoder runs on the CPU; the FLUX.2 VAE of a folder
  /// loaded for a GPU runs there too, Flux2Autoencoder::on_device).
  ComputeDevice device() const override;
  /// The device tier's counters (all zero on the CPU).
  DeviceKvTierStats device_tier_stats() const;
  /// The step graphs' counters (all zero on the CPU, or with step_graph_bytes 0).
  StepGraphStats step_graph_stats() const override;
  void release_unused() const override;
  /// The VAE's calls run on its CPU copy for want of GPU memory (a GPU model's VAE only).
  std::optional<int64_t> codec_host_fallbacks() const override;
  ParallelShape parallel_shape() const override;

 private:
  explicit Flux2EditModel(Flux2EditModelParts parts);
  // The session of `params` reading `cache` (the create_* functions differ in the cache only).
  Result<std::unique_ptr<StepSession>> session_with(std::shared_ptr<const TemplateImage> tmpl, const EditParams& params,
                                                    Flux2Cache cache) const;
  Flux2EditModelParts parts_;
  EditModelInfo info_;
  // The empty prompt's rows, encoded once when the model is created: template-keyed prepare
  // runs (started on the step loop) and guidance's null half read them, and encoding on the
  // loop would stall every running edit for the encoder's time.
  std::shared_ptr<const PromptEmbedding> empty_prompt_;
  // Entries copied to the transformer's GPU; null on the CPU. Internally synchronised.
  std::shared_ptr<DeviceKvTier> device_tier_;
  // Masked rounds replayed as CUDA graphs; null on the CPU. Internally synchronised.
  std::shared_ptr<Flux2GraphCache> step_graphs_;
  // The references made last, most recent first (two edits' worth).
  mutable std::mutex references_mu_;
  mutable std::list<ReferenceImage> recent_references_;
};

struct Flux2LoadOptions {
  /// Byte budget of the prompt embedding cache (a klein prompt is 15 MB of float32 rows).
  int64_t prompt_cache_bytes = int64_t{256} << 20;
  /// Physical memory the transformer and text encoder share; 0 = this machine's RAM. The
  /// text encoder is unloaded after each encoding when both do not fit (qwen3_prompt_encoder.h).
  int64_t memory_bytes = 0;
  /// Flux2EditModelParts::device_cache_bytes.
  int64_t device_cache_bytes = int64_t{8} << 30;
  /// Flux2EditModelParts::step_graph_bytes.
  int64_t step_graph_bytes = 0;
  /// Where the transformer computes: on a CUDA device its weights move there in bf16, and the
  /// text encoder and the autoencoder go there too where they fit (text_encoder_fits_device,
  /// Flux2Autoencoder::on_device), else stay on the CPU.
  ComputeDevice device;
  /// On that CUDA device, the block projections in FP8 (Flux2Transformer::with_float8_weights).
  /// The model's id and description say so: its activation entries differ from bf16's.
  bool float8_weights = false;
  /// On that CUDA device, the transformer's row norms as the project's fused kernels
  /// (Flux2Transformer::with_fused_norms). Refused elsewhere, naming the device. Its entries
  /// are read by the model without them and the other way round: the two differ by bf16
  /// rounding, as two GEMM algorithms do.
  bool fused_norms = false;
};

/// Loads a FLUX.2 folder (diffusers or single-file layout) with its text encoder and
/// tokenizer. The encoder's hidden states are klein's (9, 18, 27) when it has 27 layers or
/// more and the transformer reads three of them; a smaller encoder (the bundled model's) is
/// read at evenly spaced layers, as many as the transformer's text width holds. Errors name
/// the file at fault (a folder without text encoder or tokenizer cannot take prompts).
Result<std::shared_ptr<const Flux2EditModel>> load_flux2_edit_model(const std::string& path, const Flux2LoadOptions& options);

}  // namespace infill
