#pragma once
/// A diffusion transformer with adaLN-Zero blocks (the DiT family), able to run only the
/// masked tokens of many requests in one packed forward.
///
/// Weight names follow the public DiT checkpoints (x_embedder.proj, t_embedder.mlp.{0,2},
/// y_embedder.embedding_table or y_embedder.mlp.{0,2}, blocks.N.{attn.qkv, attn.proj,
/// mlp.fc1, mlp.fc2, adaLN_modulation.1}, final_layer.{linear, adaLN_modulation.1}), with an
/// optional key prefix, so such checkpoints load by configuration alone.
///
/// Tokens are row-major over the patch grid. Activations are token-major: [rows, hidden].
/// Threading: a Dit is immutable after construction; `forward` may run on several threads
/// at once (it allocates its own scratch), but one step loop normally owns it.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "common/status.h"
#include "model/kv_io.h"
#include "model/manifest.h"

namespace infill {

/// One request's share of a packed forward.
struct DitSegment {
  /// [R, C_in * p * p] patchified model input of the rows to compute (see Dit::patchify).
  at::Tensor tokens;
  /// int64 [R], ascending token ids of those rows.
  at::Tensor token_ids;
  int grid_h = 0;
  int grid_w = 0;
  /// [H] conditioning embedding (timestep + prompt), from Dit::conditioning.
  at::Tensor cond;
  /// [H] conditioning with the null prompt; used for rows where `prompted` is false.
  at::Tensor null_cond;
  /// Optional bool [R]: rows that receive `cond`; undefined means every row does.
  at::Tensor prompted;
  /// Blocks [0, full_blocks) run on all R rows with fresh K/V (R must then be the whole
  /// grid); from block `full_blocks` on only `carry_rows` (int64 indices into the R rows)
  /// are computed and attend to K/V from `kv` with their fresh rows scattered in.
  /// full_blocks == depth is the plain full forward (no cache needed).
  int full_blocks = 0;
  at::Tensor carry_rows;
  KvSource* kv = nullptr;  ///< not owned; required when full_blocks < depth
  KvSink* sink = nullptr;  ///< not owned; optional, gets K/V of the full blocks
};

class Dit {
 public:
  /// Loads weights named as in the DiT checkpoints from a safetensors file and checks every
  /// shape against `config`. Errors name the missing or mis-shaped weight.
  static Result<Dit> load(const DitConfig& config, const std::string& weights_path);
  /// Random weights (normal, std 0.02, gates not zeroed so every block does real work).
  static Dit random(const DitConfig& config, uint64_t seed);
  /// Writes the weights in checkpoint naming (fp16 or fp32).
  Status save(const std::string& path, bool fp16) const;

  const DitConfig& config() const;

  /// [C_in, h, w] model input (h, w multiples of p) -> [h/p * w/p, C_in * p * p]; the column
  /// order (c, py, px) matches x_embedder.proj's flattened kernel.
  at::Tensor patchify(const at::Tensor& input) const;
  /// Writes prediction rows [R, p * p * C_out] ((py, px, c) order, as the DiT final layer
  /// emits them) of tokens `token_ids` into `latent` [C, h, w] (only the first
  /// latent_channels when learn_sigma). Other tokens are left untouched.
  void unpatchify_into(at::Tensor& latent, const at::Tensor& rows, const at::Tensor& token_ids) const;

  /// c = t_embedder(timestep) + y_embedder(prompt) : [H]. `prompt` is: undefined (null
  /// prompt), an int64 scalar class id (class conditioning) or a float [conditioning_dim]
  /// vector (vector conditioning). The null prompt is class num_classes or the zero vector.
  at::Tensor conditioning(double timestep, const at::Tensor& prompt) const;

  /// One packed forward over all segments. Returns prediction rows for the carried rows of
  /// every segment, in segment order: [sum R_out, p * p * C_out].
  at::Tensor forward(std::span<DitSegment> segments) const;

  Dit(Dit&&) noexcept;
  Dit& operator=(Dit&&) noexcept;
  ~Dit();

  struct Weights;

 private:
  explicit Dit(std::unique_ptr<Weights> weights);
  std::unique_ptr<Weights> w_;
};

/// 2D sin-cos position embedding of the DiT reference code for a grid: [h * w, dim].
at::Tensor sincos_position_embedding(int dim, int grid_h, int grid_w);
/// Sinusoidal timestep features of the DiT reference code: [dim] = cat(cos, sin).
at::Tensor timestep_features(double timestep, int dim);

}  // namespace infill
