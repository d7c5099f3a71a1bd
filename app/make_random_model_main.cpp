// infill-make-random-model: writes the small random-weight stand-in model that the build
// generates until a trained model is bundled.
#include <cstdlib>
#include <iostream>
#include <string>

#include "model/model.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: infill-make-random-model OUTPUT_FOLDER\n";
    return 2;
  }
  infill::DitConfig dit;
  dit.hidden_size = 256;
  dit.depth = 6;
  dit.num_heads = 4;
  dit.patch_size = 2;
  dit.latent_channels = 4;
  dit.inputs = {infill::DitInput::kNoisyLatent, infill::DitInput::kMaskedLatent, infill::DitInput::kMask};
  dit.conditioning = infill::ConditioningType::kVector;
  dit.conditioning_dim = 16;
  dit.prompt_scope = infill::PromptScope::kMaskedTokens;
  dit.prediction = infill::PredictionType::kFlow;
  if (auto st = infill::write_random_model(argv[1], dit, /*ae_width=*/32, /*seed=*/20261122); !st.ok()) {
    std::cerr << "Error: " << st.message() << "\n";
    return 1;
  }
  return 0;
}
