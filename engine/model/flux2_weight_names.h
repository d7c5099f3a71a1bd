#pragma once
/// diffusers' names of FLUX.2 transformer weights mapped to the upstream (BFL) names: the
/// inverse of diffusers' scripts/convert_flux2_to_diffusers.py (huggingface/diffusers
/// 207bae7). The one mapping both checkpoints (model/flux2_checkpoint.h) and LoRA files
/// (model/lora_adapter.h) go through. Torch-free; pure functions.

#include <optional>
#include <string>

namespace infill {

/// Where a diffusers weight lands in the upstream layout.
struct UpstreamWeight {
  enum class Part {
    kWhole = 1,          ///< the upstream weight itself, renamed
    kQ = 2,              ///< rows [0, H) of a fused qkv weight [3H, H] (diffusers stores q, k, v apart)
    kK = 3,              ///< rows [H, 2H)
    kV = 4,              ///< rows [2H, 3H)
    kSwappedHalves = 5,  ///< diffusers' (scale, shift) rows, upstream's (shift, scale): halves swapped
  };
  std::string name;  ///< upstream weight name, e.g. "double_blocks.0.img_attn.qkv.weight"
  Part part = Part::kWhole;
};

/// The upstream weight of a diffusers weight name without prefix (e.g.
/// "transformer_blocks.0.attn.to_k.weight" -> {"double_blocks.0.img_attn.qkv.weight", kK});
/// nullopt for a name that is not part of a diffusers Flux2Transformer2DModel.
std::optional<UpstreamWeight> upstream_weight_of_diffusers(const std::string& diffusers_name);

}  // namespace infill
