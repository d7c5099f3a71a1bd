#pragma once
/// The FLUX.2 transformer (black-forest-labs/flux2, src/flux2/model.py): double-stream blocks
/// (image and text streams with their own weights, joint attention), single-stream blocks,
/// modulation shared by all blocks and computed once from the timestep (plus guidance where
/// `guidance_in.*` exists), 4-axis RoPE over (t, h, w, l) position ids, QK RMSNorm, SwiGLU MLPs,
/// no biases. One class serves FLUX.2 [klein] 4B/9B, [dev] and smaller models of the same
/// layout: every size is inferred from the weight shapes.
///
/// Mask-aware: a forward runs over segments (one per request), each computing only some of
/// its request's tokens and attending to all of them, the others' K/V read from a KvSource.
/// A request's token sequence is [text tokens, image tokens, reference tokens], the order of
/// the single-stream blocks upstream; K/V rows are indexed by that position. Block b counts
/// the double blocks first (0 .. double_blocks-1), then the single blocks.
///
/// Weights keep their stored dtype (F32, F16 or BF16, memory-mapped when aligned); on the CPU
/// each layer is converted to float32 when it runs, so no float32 copy of a model is held.
/// Threading: immutable after load; forward may run on several threads at once.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "common/status.h"
#include "model/compute_device.h"
#include "model/kv_io.h"
#include "model/lora_adapter.h"
#include "model/safetensors.h"

namespace infill {

class SequenceGroup;  // model/sequence_group.h

struct Flux2Config {
  int in_channels = 128;     ///< latent channels per token (the prediction has as many)
  /// Extra input channels of mask-conditioned models (the FLUX.1 Fill convention, used by the
  /// bundled model): p x p cells per image token, each the share of masked pixels in it.
  /// `img_in` reads in_channels + mask_channels; published FLUX.2 checkpoints have none.
  int mask_channels = 0;
  int context_dim = 7680;    ///< width of a text embedding row
  int hidden_size = 3072;
  int num_heads = 24;
  int double_blocks = 5;
  int single_blocks = 20;
  int mlp_hidden = 9216;     ///< SwiGLU inner width (hidden * mlp_ratio)
  bool guidance_embed = false;  ///< `guidance_in` present (FLUX.2 [dev]); klein has none
  int time_embed_dim = 256;
  std::vector<int> axes_dim{32, 32, 32, 32};  ///< RoPE dims per id axis; sums to head_dim
  double theta = 2000.0;

  int head_dim() const { return hidden_size / num_heads; }
  /// Width of an image row: latent and mask channels.
  int input_channels() const { return in_channels + mask_channels; }
  /// Cells per side of a token's mask (sqrt of mask_channels; 0 without).
  int mask_cells() const;
  int depth() const { return double_blocks + single_blocks; }
  /// invalid_argument naming the field unless the sizes are consistent.
  Status validate() const;
  /// "klein-4b", "klein-9b", "dev" when the sizes are those of a published checkpoint, else
  /// "custom".
  std::string family_size() const;
};

/// The key prefix under which `file` holds a FLUX.2 transformer ("" for the BFL checkpoints,
/// "model.diffusion_model." for some ComfyUI files, "weights." in the reference files), or
/// not_found naming the file when no `img_in.weight` / `double_blocks.0.img_attn.qkv.weight`
/// pair exists.
Result<std::string> find_flux2_transformer_prefix(const SafetensorsFile& file);

class Flux2Checkpoint;

/// A linear (bias-free) layer of the transformer: its upstream weight name and shape.
struct Flux2LinearLayer {
  std::string name;  ///< "double_blocks.0.img_attn.qkv.weight", "img_in.weight", ...
  int64_t out = 0;
  int64_t in = 0;
};
/// Every linear layer of a transformer of `config`, in checkpoint order (what LoRAs adapt).
std::vector<Flux2LinearLayer> flux2_linear_layers(const Flux2Config& config);

/// Infers every size from the weights' shapes; errors name the tensor.
Result<Flux2Config> infer_flux2_config(const Flux2Checkpoint& checkpoint);
/// The same for the upstream-named weights under `prefix` of `file`.
Result<Flux2Config> infer_flux2_config(const SafetensorsFile& file, const std::string& prefix);

/// One request's share of a forward.
struct Flux2Segment {
  /// [R_t, context_dim] text embedding rows to compute (R_t may be 0).
  at::Tensor txt;
  /// [R_t, 4] float (t, h, w, l) position ids of those rows.
  at::Tensor txt_ids;
  /// [R_i, in_channels + mask_channels] image and reference token rows to compute (R_i >= 1):
  /// the latent, then the mask cells (zero for reference tokens).
  at::Tensor img;
  /// [R_i, 4] float position ids of those rows (reference tokens have t = 10).
  at::Tensor img_ids;
  /// int64 [R_t + R_i]: each computed row's position in the request's sequence
  /// [text, image, reference] of `sequence_length` tokens, text rows first, ascending.
  /// Undefined: the rows are the whole sequence in order (a full forward).
  at::Tensor positions;
  /// Tokens in the request's sequence; 0 means the rows computed (a full forward).
  int64_t sequence_length = 0;
  double timestep = 0.0;  ///< in [0, 1] (upstream multiplies by 1000 before the embedding)
  double guidance = 0.0;  ///< read only when the model has guidance_embed
  /// Cached K/V of every position, required when fewer than sequence_length rows are
  /// computed; the fresh rows replace theirs. Not owned.
  KvSource* kv = nullptr;
  /// A recomputed prefix (the load plan's choice for a streamed entry whose leading blocks
  /// would wait on the disk): blocks [0, full_blocks) run on every row given, which must be
  /// the whole sequence in order (positions undefined), attending among themselves; from block
  /// `full_blocks` on only the rows at `keep_positions` go on, reading every other position's
  /// K/V from `kv` (required unless full_blocks is the depth). The prediction then has the
  /// kept image (and reference) rows. 0: no prefix.
  int full_blocks = 0;
  /// int64, ascending positions of the sequence kept after the prefix (text rows first);
  /// at least one image or reference row.
  at::Tensor keep_positions;
  /// Receives every block's K/V ([L, H], post QK-norm and RoPE) of a full forward. Not owned.
  KvSink* sink = nullptr;
  /// LoRAs applied to this segment's rows (model/lora_round.h): each adapted layer adds
  /// strength * (x A^T) B^T for them. Every adapter must have been loaded for this model's
  /// config (load_lora).
  AdapterSet adapters;
  /// Ulysses sequence parallelism (model/flux2_sequence_parallel.h): this segment is this
  /// rank's share of one forward that every rank of `group` runs at once, the only segment of
  /// its forward. Its rows are the share (positions ascending); each attention trades heads
  /// for rows with the other ranks (all-to-all), so every rank attends with every computed row
  /// for heads / size of the heads. A whole-sequence forward's shares read no KvSource and the
  /// sink receives the share's rows (KvSink::store_rows); a masked forward's shares each read
  /// a KvSource of their own (`kv`, the same K/V on every rank), of which a rank reads its
  /// heads' columns. Not owned; null: a forward on one device.
  SequenceGroup* group = nullptr;
  /// With `group`: the rows of every rank's share, in rank order (sum: sequence_length for a
  /// whole-sequence forward, else the rows computed by all ranks).
  std::vector<int64_t> group_rows;
  /// With `group` and `kv`: int64 [sum of group_rows], the positions of every rank's rows in
  /// rank order (where the fresh K/V of each replace the cached ones).
  at::Tensor group_positions;

  /// What the forward would otherwise make on the host at every call, made once by a session
  /// that keeps its state on the compute device (issue 39: no per-step copies of a session's
  /// constants). Each is optional; when given it must equal what the forward would compute.
  /// [R_t + R_i, head_dim / 2] each, the rows' RoPE tables (flux2_rope_tables of the text ids,
  /// then the image ids), in Flux2Transformer::rope_table_dtype.
  at::Tensor rope_cos, rope_sin;
  /// [time_embed_dim] float: flux2_timestep_embedding(timestep); likewise for guidance
  /// (guidance_embed models).
  at::Tensor time_embedding, guidance_embedding;
  /// `positions` on the compute device (used only when it is there: a segment run on another
  /// device, as a guided half is, makes its own).
  at::Tensor positions_on_device;
};

/// Per-block outputs of a forward of one segment, for checking against a reference.
struct Flux2Trace {
  std::vector<at::Tensor> double_img;  ///< [R_i, H] after each double block
  std::vector<at::Tensor> double_txt;  ///< [R_t, H]
  std::vector<at::Tensor> single;      ///< [R_t + R_i, H] after each single block
};

class Flux2Transformer {
 public:
  /// Loads the transformer of a checkpoint (any layout, model/flux2_checkpoint.h). Every
  /// expected tensor must be present with its shape and finite values, and no other tensor
  /// may be there: errors name the file and the tensor; nothing is half-loaded.
  static Result<Flux2Transformer> load(const Flux2Checkpoint& checkpoint);
  /// The upstream-named transformer under `prefix` of `file` (find_flux2_transformer_prefix).
  static Result<Flux2Transformer> load(const SafetensorsFile& file, const std::string& prefix);
  /// Random weights (normal, std 0.02) in `dtype` (float32, float16 or bfloat16), for tests
  /// and benchmarks at real sizes.
  static Flux2Transformer random(const Flux2Config& config, uint64_t seed, at::ScalarType dtype);
  /// Writes the weights under their checkpoint names (`prefix` prepended), in their dtype.
  /// FP8 layers (with_float8_weights) are refused: save the transformer they were made from.
  Status save(const std::string& path, const std::string& prefix = "") const;

  const Flux2Config& config() const;
  /// Bytes of weights held (FP8 layers: their codes and scales).
  int64_t weight_bytes() const;

  /// Moves the weights to `device`. On a CUDA device they are converted to `dtype` (bf16 by
  /// default: tensor-core GEMMs; float32 for checks against the reference tensors) and the
  /// forward computes in that dtype there; on the CPU they keep their dtype and each layer is
  /// widened to float32 when it runs. Errors name the device: no CUDA in this build or
  /// machine, or out of device memory (the model then stays where it was).
  Status to_device(const ComputeDevice& device, at::ScalarType dtype = at::kBFloat16);
  /// Where the weights live (and the forward computes).
  at::Device device() const;
  /// The dtype the forward computes in: float32 on the CPU, the weights' dtype elsewhere.
  at::ScalarType compute_dtype() const;
  /// The dtype of the RoPE tables the forward reads (Flux2Segment::rope_cos, rope_sin): float32
  /// where the fused norm kernels rotate q and k (they read float32 tables at no cost, and
  /// upstream keeps its `pe` in float32, so no table value is rounded to bf16 first); the
  /// compute dtype otherwise (libtorch's ops would widen every product to float32).
  at::ScalarType rope_table_dtype() const;
  /// A transformer whose adapted weights are W + sum of strength * up @ down over `adapters`
  /// (computed in float32, stored in W's dtype and device); the others are shared with this
  /// one, which is unchanged. The merged-weight alternative to applying the adapters per
  /// segment, for rounds where every segment has the same set (bench_adapters weighs them).
  Flux2Transformer merged(const AdapterSet& adapters) const;
  /// A transformer whose block projections (each double block's qkv, proj and MLP layers of
  /// both streams, each single block's linear1 and linear2: 95 % of klein 4B's weights) are
  /// FP8: E4M3 codes with a float32 scale per output row, multiplied by at::_scaled_mm with
  /// the rows quantized per call (model/float8_linear.h). The embedders, the modulation and
  /// the final layer stay in bf16, and so does a layer whose sizes are not multiples of 16
  /// (_scaled_mm's rule). A layer an E4M3 file stored keeps the file's own codes and scales
  /// (Flux2Checkpoint::float8_row_scales: not a second quantization of the publisher's
  /// numbers). The weights must be in bf16 on a device float8_compute_status accepts; errors
  /// name the device. This one is unchanged; the bf16 layers are shared.
  Result<Flux2Transformer> with_float8_weights() const;
  /// Moves the weights from the CPU to a CUDA `device` in bf16 with the block projections in
  /// FP8, as with_float8_weights makes them, one layer at a time on the way: the device never
  /// holds the bf16 model, only the FP8 one and one layer's bf16 (what lets klein 9B's FP8 file
  /// load on a 24 GB card). Layers an E4M3 file stored keep the file's own codes and scales
  /// (Flux2Checkpoint::float8_row_scales); others get a scale per row. Errors name the device
  /// (as to_device, and float8_compute_status); the model then stays on the CPU.
  Status to_device_float8(const ComputeDevice& device);
  /// How many layers are FP8 (with_float8_weights); 0 for a bf16, fp16 or float32 one.
  int float8_layers() const;
  /// A transformer sharing these weights whose row norms (the pre-norms with their modulation,
  /// the QK RMSNorm with RoPE) are the project's CUDA kernels, one launch each instead of
  /// libtorch's dozen (kernels/fused_norms.h: issue 39 item 3), computing in float32 with
  /// upstream's rounding points. Kept where it measures faster (bench_flux2's `fused_norms`).
  /// The weights must be on a CUDA device and this build must have the kernels; errors name
  /// the device and why. This one is unchanged.
  Result<Flux2Transformer> with_fused_norms() const;
  /// Whether the forward uses the fused norms (with_fused_norms; on a CUDA device).
  bool fused_norms() const;

  /// One forward over all segments, on the weights' device (inputs may be on the CPU).
  /// Returns the prediction of every computed image (and reference) row in segment order:
  /// [sum R_i, in_channels] float32 on the CPU (a step's rows are few; the sampler runs on the
  /// CPU). K/V reach a segment's sink on the compute device. `trace`, when given, receives
  /// the per-block outputs of a single-segment forward (float32, CPU).
  at::Tensor forward(std::span<Flux2Segment> segments, Flux2Trace* trace = nullptr) const;
  /// As forward, the prediction left on the compute device (float32): a session whose state
  /// lives there applies it without a round trip through the host.
  at::Tensor forward_on_device(std::span<Flux2Segment> segments, Flux2Trace* trace = nullptr) const;

  Flux2Transformer(Flux2Transformer&&) noexcept;
  Flux2Transformer& operator=(Flux2Transformer&&) noexcept;
  ~Flux2Transformer();

  struct Weights;  // model/flux2_layers.h, internal to the model layer
  const Weights& weights() const { return *w_; }

 private:
  explicit Flux2Transformer(std::unique_ptr<Weights> weights);
  std::unique_ptr<Weights> w_;
};

/// FLUX.2's sinusoidal embedding of a timestep or guidance value: t * 1000, then
/// cat(cos, sin) over dim/2 frequencies exp(-ln(10000) i / (dim/2)) : [dim] float32.
at::Tensor flux2_timestep_embedding(double t, int dim);

/// cos and sin of the RoPE angles of `ids` [R, 4]: each [R, head_dim / 2], axis by axis,
/// frequency i of an axis of width d being theta^(-2i/d).
std::pair<at::Tensor, at::Tensor> flux2_rope_angles(const at::Tensor& ids, const std::vector<int>& axes_dim,
                                                    double theta);

}  // namespace infill
