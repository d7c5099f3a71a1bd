#pragma once
/// The model manifest: a JSON file beside the weights that says what the networks are and
/// how their weights are named, so that a checkpoint loads by configuration alone.
///
/// Parsing is strict: an unknown field, a missing required field or a value of the wrong type
/// is an error naming the field ("manifest.json: dit.hiden_size is not a known field").

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace infill {

/// What the DiT's input channels are made of, in this order.
enum class DitInput { kNoisyLatent = 1, kMaskedLatent = 2, kMask = 3 };

/// How the pooled conditioning enters the model.
enum class ConditioningType {
  kNone = 1,    ///< timestep only
  kClass = 2,   ///< y_embedder.embedding_table [num_classes (+1 null), H] (the DiT checkpoints)
  kVector = 3,  ///< y_embedder.mlp.0 / mlp.2: Linear(dim, H), SiLU, Linear(H, H)
};

/// Which tokens receive the prompt's conditioning.
enum class PromptScope {
  kGlobal = 1,        ///< every token (as in DiT): cached activations of other prompts are approximate
  kMaskedTokens = 2,  ///< only masked tokens; the rest see the null conditioning, as in the cache
};

enum class PredictionType { kFlow = 1, kEpsilon = 2 };

struct DitConfig {
  std::string weights;  ///< safetensors file, relative to the manifest's folder
  std::string key_prefix;  ///< prepended to every weight name ("" or e.g. "model.")
  int hidden_size = 0;
  int depth = 0;
  int num_heads = 0;
  int patch_size = 2;
  double mlp_ratio = 4.0;
  int latent_channels = 4;  ///< channels of the noisy latent (and of the prediction)
  std::vector<DitInput> inputs{DitInput::kNoisyLatent};
  bool learn_sigma = false;  ///< the final layer predicts 2x channels; the second half is ignored
  ConditioningType conditioning = ConditioningType::kNone;
  int num_classes = 0;         ///< kClass: real classes; row num_classes is the null class
  int conditioning_dim = 0;    ///< kVector: length of the pooled vector
  PromptScope prompt_scope = PromptScope::kGlobal;
  PredictionType prediction = PredictionType::kFlow;
  int frequency_embedding_size = 256;

  int head_dim() const { return hidden_size / num_heads; }
  int mlp_hidden() const { return static_cast<int>(hidden_size * mlp_ratio); }
  int in_channels() const;
  int out_channels() const { return learn_sigma ? 2 * latent_channels : latent_channels; }
  Status validate() const;
};

struct AutoencoderSpec {
  std::string type;     ///< "taesd" or "patch_pca"
  std::string encoder;  ///< safetensors, relative to the manifest's folder
  std::string decoder;  ///< patch_pca: the same file as the encoder
  int latent_channels = 0;
  int factor = 8;       ///< pixels per latent pixel
  double scale = 1.0;   ///< latent fed to the DiT = (encoder output - shift) * scale
  double shift = 0.0;
};

struct SamplerDefaults {
  std::string sampler = "euler_rf";
  int steps = 20;
  double shift = 1.0;
};

/// Words a prompt may use, for models with vector conditioning: a prompt is the multi-hot
/// vector of its words over this list (model/prompt_encoder.h).
struct PromptSpec {
  std::vector<std::string> vocabulary;
};

struct ModelManifest {
  std::string name;
  std::string description;  ///< optional, shown by clients
  std::string folder;  ///< absolute folder of manifest.json; weight paths resolve against it
  DitConfig dit;
  bool has_autoencoder = false;
  AutoencoderSpec autoencoder;
  SamplerDefaults sampler;
  bool has_prompt = false;
  PromptSpec prompt;
  double default_guidance = 1.0;  ///< classifier-free guidance scale clients start from
  int max_image_pixels = 2048 * 2048;

  std::string resolve(const std::string& relative) const;
};

/// Parses and validates manifest text; `folder` is where relative weight paths resolve.
Result<ModelManifest> parse_manifest(const std::string& json_text, const std::string& folder,
                                     const std::string& name_for_errors);
/// Reads `path` (a manifest.json, or a folder containing one).
Result<ModelManifest> load_manifest(const std::string& path);
/// Serialises a manifest (for generated models and round-trip tests).
std::string manifest_to_json(const ModelManifest& manifest);

}  // namespace infill
