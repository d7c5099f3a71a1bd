#pragma once
/// LoRA files for the FLUX.2 transformer, in the formats trainers publish, mapped once onto
/// the model's upstream (BFL) weight names:
/// - upstream names under `diffusion_model.` (ai-toolkit, OneTrainer), `base_model.model.`
///   (fal's trainer) or `model.diffusion_model.`: `<module>.lora_A.weight` [r, in] and
///   `.lora_B.weight` [out, r] (or `lora_down`/`lora_up`); scale alpha / r where a `.alpha`
///   is stored, else 1;
/// - kohya / musubi-tuner: `lora_unet_<module, '_' for '.'>.lora_down.weight`, `.lora_up.weight`,
///   `.alpha`: scale alpha / r (1 without alpha, kohya's default alpha being the rank);
/// - diffusers / PEFT: `transformer.<diffusers module>.lora_A.weight`, `.lora_B.weight`: scale
///   lora_alpha / r from the JSON in the metadata's `lora_adapter_metadata` (PEFT's rule, with
///   its rank_pattern / alpha_pattern and use_rslora; 1 when absent). Names go through the
///   checkpoint loader's mapping (model/flux2_weight_names.h): q, k and v stored apart become one
///   update of the fused qkv weight (their ups block-diagonal, so a LoRA of to_k alone adapts
///   only the k rows), and norm_out's (scale, shift) rows are swapped to upstream's order.
///
/// Refused with an error naming the file and the key: unknown keys, layers the model lacks,
/// shapes that do not fit it (a LoRA for another model size), NaN/Inf, LoKr / LoHa / DoRA,
/// text-encoder keys (the Qwen3 encoder takes no adapters yet: never dropped silently),
/// truncated or damaged files. Ranks may differ per layer.
///
/// Threading: a loaded adapter is immutable; share it freely.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/core/Tensor.h>

#include "common/status.h"

namespace infill {

struct Flux2Config;

enum class LoraFormat { kUpstream = 1, kKohya = 2, kDiffusers = 3 };
/// "upstream", "kohya", "diffusers".
const char* lora_format_name(LoraFormat format);

/// The low-rank update of one linear layer: delta W = up @ down.
struct LoraLayer {
  at::Tensor down;  ///< [r, in] float32 (A, lora_down)
  at::Tensor up;    ///< [out, r] float32 (B, lora_up), the file's scale folded in
  int64_t rank() const { return down.size(0); }
};

struct LoraAdapter {
  std::string id;    ///< SHA-256 of the file's bytes, 64 hex digits
  std::string path;  ///< where it was read from (for messages)
  LoraFormat format = LoraFormat::kUpstream;
  int64_t file_bytes = 0;
  /// By upstream weight name ("double_blocks.0.img_attn.qkv.weight").
  std::map<std::string, LoraLayer> layers;
  int64_t min_rank() const;
  int64_t max_rank() const;
  /// Bytes of the float32 tensors held.
  int64_t bytes() const;
  /// The update of `weight` at strength 1: up @ down [out, in] float32 (undefined when the
  /// adapter leaves it alone).
  at::Tensor delta(const std::string& weight) const;
  /// The same adapter with its tensors on `options`' device and dtype (a GPU model's copy, in
  /// its compute dtype, made once rather than at every step); same id.
  std::shared_ptr<const LoraAdapter> on(const at::TensorOptions& options) const;
  /// The same adapter in `dtype` in page-locked host memory (needs a CUDA libtorch), from which
  /// a GPU copies it by DMA on a stream of its own; plain memory where the driver refuses to
  /// pin more (`pinned` then says false). Same id.
  std::shared_ptr<const LoraAdapter> pinned(at::ScalarType dtype, bool* pinned) const;
};

/// One adapter of a request: a LoRA and its strength (negative strengths subtract it).
struct AdapterUse {
  std::shared_ptr<const LoraAdapter> adapter;
  double strength = 1.0;
};
/// A request's adapters, in the order given; empty for none.
using AdapterSet = std::vector<AdapterUse>;

/// What a cache key records of a set: "" for none, else each adapter's id and strength in
/// order ("<id>*0.8+<id>*-0.5"). Sets differing in an adapter, its order or a strength differ.
std::string adapter_set_key(const AdapterSet& set);
/// The same from (adapter id, strength) pairs: the key of a set whose files are not read yet.
std::string adapter_set_key(const std::vector<std::pair<std::string, double>>& uses);
/// Whether the set of `key` (adapter_set_key's text) holds the adapter `id`.
bool adapter_set_key_holds(std::string_view key, std::string_view id);

/// Reads the LoRA file at `path` for a transformer of `config`; `model_name` names it in
/// errors ("... a LoRA for another model?").
Result<std::shared_ptr<const LoraAdapter>> load_lora(const std::string& path, const Flux2Config& config,
                                                     const std::string& model_name);

}  // namespace infill
