#pragma once
// The small inpainting DiT configuration the tests share: noisy latent + masked latent + mask
// inputs, vector conditioning, prompt on masked tokens only (the shape of infill-tiny).
#include "model/manifest.h"

namespace infill::test {

inline DitConfig tiny_inpainting_dit(int hidden = 64, int depth = 2, int conditioning_dim = 8) {
  DitConfig cfg;
  cfg.hidden_size = hidden;
  cfg.depth = depth;
  cfg.num_heads = 4;
  cfg.patch_size = 2;
  cfg.latent_channels = 4;
  cfg.inputs = {DitInput::kNoisyLatent, DitInput::kMaskedLatent, DitInput::kMask};
  cfg.conditioning = ConditioningType::kVector;
  cfg.conditioning_dim = conditioning_dim;
  cfg.prompt_scope = PromptScope::kMaskedTokens;
  return cfg;
}

}  // namespace infill::test
