#pragma once
/// A FLUX.2 model folder as users download it, located and checked before anything loads:
///
/// - diffusers layout (the model's Hugging Face repository): `model_index.json`,
///   `transformer/diffusion_pytorch_model.safetensors` (or shards listed in
///   `diffusion_pytorch_model.safetensors.index.json`), `vae/diffusion_pytorch_model.safetensors`,
///   `text_encoder/config.json` with `model.safetensors` (or its index and shards) and
///   `tokenizer/tokenizer.json`;
/// - single-file layout (ComfyUI users, the BFL release): a transformer file with upstream
///   names (`flux-2-klein-4b.safetensors`, or BFL's FP8 `flux-2-klein-4b-fp8.safetensors`) or
///   diffusers names in one file, and `ae.safetensors` in one folder, or the transformer
///   file itself with `ae.safetensors` beside it; a `text_encoder/` and `tokenizer/` beside
///   them are used when present.
///
/// The bundled model (infill-tiny 2) uses the diffusers layout with two extensions, both in
/// model_index.json: `"vae": ["infill", "LearnedDecoderCodec"]` with `vae/codec.safetensors`
/// (model/learned_decoder_codec.h) in place of the FLUX.2 VAE, and an `"infill"` object with
/// `max_sequence_length` (text rows; 512, klein's, by default), `default_steps`,
/// `default_guidance` and `description`.
///
/// Distilled or base: `model_index.json`'s "is_distilled" (klein's distilled checkpoints set
/// it; base ones do not), else the folder or file name ("klein" without "base" is
/// distilled), else base. A distilled checkpoint runs 4 steps without guidance, a base one
/// 50 steps with guidance 4 (upstream's defaults); requests may override both.
/// Torch-free: this only reads JSON and checks that files exist.

#include <string>
#include <vector>

#include "common/status.h"

namespace infill {

struct Flux2Folder {
  enum class Layout { kDiffusers = 1, kSingleFile = 2 };
  Layout layout = Layout::kDiffusers;
  std::string root;  ///< the folder
  std::string name;  ///< the folder's (or the transformer file's) name
  std::string pipeline_class;  ///< model_index.json "_class_name"; empty for single files
  /// The transformer's safetensors file(s); shards in the index's order.
  std::vector<std::string> transformer_files;
  /// The autoencoder file; `autoencoder_diffusers_names` when it is diffusers' vae/ file.
  std::string autoencoder_file;
  bool autoencoder_diffusers_names = false;
  /// "" for the FLUX.2 VAE; "LearnedDecoderCodec" for the bundled model's codec.
  std::string codec_class;
  /// The text encoder's folder (config.json + weights) and the tokenizer's folder
  /// (tokenizer.json); empty when a single-file folder has none.
  std::string text_encoder_dir;
  std::string tokenizer_dir;
  bool distilled = false;
  int default_steps = 50;
  double default_guidance = 4.0;
  int max_sequence_length = 512;  ///< text rows per prompt (klein's pipelines use 512)
  std::string description;        ///< "infill".description, else empty
};

/// "diffusers" or "single_file".
const char* flux2_layout_name(Flux2Folder::Layout layout);

/// Recognises `path` (a folder, or a transformer file) and checks that every file the layout
/// needs exists. Errors name the missing or malformed file and what was expected there.
Result<Flux2Folder> find_flux2_folder(const std::string& path);

}  // namespace infill
