// infill-train: trains the bundled models from wallpapers shipped in Debian packages. Not
// needed at run time. The default recipe makes infill-tiny 2 (FLUX.2 architecture, free-text
// prompts; tools/train/tiny2_recipe.h); `--arch dit` makes the first infill-tiny (patch PCA
// codec + inpainting DiT). Each model card gives the exact command.
#include <malloc.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>

#include "common/blas_kernel.h"
#include "model/compute_threads.h"
#include "model/manifest.h"
#include "tools/train/colour_words.h"
#include "tools/train/loss_plot.h"
#include "tools/train/patch_pca_fit.h"
#include "tools/train/tiny2_recipe.h"
#include "tools/train/trainer.h"
#include "tools/train/wallpaper_dataset.h"

namespace fs = std::filesystem;
using namespace infill;

namespace {

void usage() {
  std::fprintf(stderr,
               "usage: infill-train --out DIR [--arch flux2|dit] [--work DIR] [--seed N] [--threads N] [--steps N]\n"
               "                    [--small-steps N] [--hidden N] [--heads N] [--lr X] [--recolour-share X]\n"
               "  flux2 (default, infill-tiny 2): [--decoder-steps N] [--double-blocks N] [--single-blocks N]\n"
               "                    [--vocab-size N] [--max-length N] [--stop-after codec|text|transformer]\n"
               "                    [--distractor-steps N] [--capitals-steps N] (the second and third\n"
               "                    transformer stages; 0 = none)\n"
               "  dit (infill-tiny): [--batch N] [--depth N] [--channels N]\n"
               "Trains a bundled model into DIR. flux2 writes a diffusers-layout FLUX.2 folder (model_index.json,\n"
               "transformer/, vae/, text_encoder/, tokenizer/, training.json, loss.png); dit writes manifest.json,\n"
               "dit.safetensors, codec.safetensors, training.json, loss.png. Resumes from the checkpoints in\n"
               "--work (default $XDG_CACHE_HOME/infill/train).\n");
}

std::string default_work_dir() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const std::string base = xdg && *xdg ? xdg : std::string(home ? home : "/tmp") + "/.cache";
  return base + "/infill/train";
}

}  // namespace

int main(int argc, char** argv) {
  infill::select_blas_kernel();  // first: before any GEMM (common/blas_kernel.h)
  std::string out, work = default_work_dir(), arch = "flux2";
  train::TrainOptions options;
  train::Tiny2Options tiny2;
  int threads = 2, hidden = 256, depth = 6, heads = 4, channels = 8;
  bool hidden_given = false, heads_given = false, steps_given = false, small_steps_given = false, recolour_given = false, lr_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "Error: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    auto number = [&]() -> long {
      const std::string v = value();
      char* end = nullptr;
      const long n = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || n <= 0) {
        std::fprintf(stderr, "Error: %s needs a positive integer, got \"%s\"\n", a.c_str(), v.c_str());
        std::exit(2);
      }
      return n;
    };
    auto count = [&]() -> int {  // a non-negative integer: 0 turns a stage off
      const std::string v = value();
      char* end = nullptr;
      const long n = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || n < 0 || n > 1000000) {
        std::fprintf(stderr, "Error: %s needs an integer from 0 to 1000000, got \"%s\"\n", a.c_str(), v.c_str());
        std::exit(2);
      }
      return static_cast<int>(n);
    };
    if (a == "--out") out = value();
    else if (a == "--arch") arch = value();
    else if (a == "--work") work = value();
    else if (a == "--seed") options.seed = static_cast<uint64_t>(number());
    else if (a == "--steps") options.steps = static_cast<int>(number()), steps_given = true;
    else if (a == "--batch") options.batch = static_cast<int>(number());
    else if (a == "--small-steps") options.small_steps = static_cast<int>(number()), small_steps_given = true;
    else if (a == "--threads") threads = static_cast<int>(number());
    else if (a == "--hidden") hidden = static_cast<int>(number()), hidden_given = true;
    else if (a == "--depth") depth = static_cast<int>(number());
    else if (a == "--heads") heads = static_cast<int>(number()), heads_given = true;
    else if (a == "--decoder-steps") tiny2.decoder_steps = static_cast<int>(number());
    else if (a == "--double-blocks") tiny2.double_blocks = static_cast<int>(number());
    else if (a == "--single-blocks") tiny2.single_blocks = static_cast<int>(number());
    else if (a == "--vocab-size") tiny2.vocab_size = static_cast<int>(number());
    else if (a == "--max-length") tiny2.max_sequence_length = static_cast<int>(number());
    else if (a == "--stop-after") tiny2.stop_after = value();
    else if (a == "--distractor-steps") tiny2.distractor_steps = count();
    else if (a == "--capitals-steps") tiny2.capitals_steps = count();
    else if (a == "--channels") channels = static_cast<int>(number());
    else if (a == "--lr") options.lr = std::atof(value().c_str()), lr_given = true;
    else if (a == "--recolour-share") options.recolour_share = std::atof(value().c_str()), recolour_given = true;
    else if (a == "--help" || a == "-h") {
      usage();
      return 0;
    } else {
      std::fprintf(stderr, "Error: unknown argument %s\n", a.c_str());
      usage();
      return 2;
    }
  }
  if (out.empty()) {
    usage();
    return 2;
  }
  // Every training step frees and allocates the same large activation buffers. With glibc's
  // defaults the freed top of the heap goes back to the kernel and is faulted in again at the
  // next step: measured 100k page faults/s and half of the CPU time in the kernel, steps 1.7x
  // slower (decoder, 2 threads). Keep freed memory in the process.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  if (arch != "flux2" && arch != "dit") {
    std::fprintf(stderr, "Error: --arch is \"%s\", expected flux2 or dit\n", arch.c_str());
    return 2;
  }
  if (!tiny2.stop_after.empty() && tiny2.stop_after != "codec" && tiny2.stop_after != "text" &&
      tiny2.stop_after != "transformer") {
    std::fprintf(stderr, "Error: --stop-after is \"%s\", expected codec, text or transformer\n", tiny2.stop_after.c_str());
    return 2;
  }
  if (arch == "flux2") {
    tiny2.out = out;
    tiny2.work_dir = work + "/tiny2";
    tiny2.seed = options.seed;
    tiny2.threads = threads;
    if (hidden_given) tiny2.hidden = hidden;
    if (heads_given) tiny2.heads = heads;
    if (steps_given) tiny2.transformer_steps = options.steps;
    if (small_steps_given) tiny2.small_steps = options.small_steps;
    if (lr_given) tiny2.lr = options.lr;
    if (recolour_given) tiny2.recolour_share = options.recolour_share;
    const Status s = train::make_infill_tiny2(tiny2, [](const std::string& line) { std::cout << line << std::endl; });
    if (!s.ok()) {
      std::fprintf(stderr, "Error: %s\n", s.message().c_str());
      return 5;
    }
    return 0;
  }
  set_compute_threads(threads);
  options.work_dir = work;
  auto log = [](const std::string& line) {
    std::cout << line << std::endl;
  };

  // 1. Data.
  train::DatasetOptions data_options;
  auto data = train::load_dataset(data_options);
  if (!data.ok()) {
    std::fprintf(stderr, "Error: %s\n", data.status().message().c_str());
    return 2;
  }
  log("data: " + std::to_string(data->train.size()) + " training images, " + std::to_string(data->held_out.size()) +
      " held-out images");
  for (const auto& s : data->skipped) log("skipped " + s);

  // 2. Codec: patch PCA fitted on 1024 training crops.
  at::Generator pca_gen = at::make_generator<at::CPUGeneratorImpl>(options.seed);
  train::CropOptions crop_options;
  crop_options.size = 256;
  at::Tensor pca_crops = train::random_crops(data->train, 1024, crop_options, pca_gen);
  auto codec = train::fit_patch_pca(pca_crops, 8, channels);
  if (!codec.ok()) {
    std::fprintf(stderr, "Error: %s\n", codec.status().message().c_str());
    return 5;
  }
  at::Generator held_gen = at::make_generator<at::CPUGeneratorImpl>(options.seed + 7);
  crop_options.augment = false;
  const at::Tensor held_crops = train::random_crops(data->held_out, 256, crop_options, held_gen);
  const double psnr = train::round_trip_psnr(*codec, held_crops);
  const double latent_std = train::latent_std(*codec, pca_crops);
  log("codec: patch PCA 8x8 -> " + std::to_string(channels) + " channels, held-out PSNR " + std::to_string(psnr) +
      " dB, latent std " + std::to_string(latent_std));

  fs::create_directories(out);
  if (auto s = codec->save(out + "/codec.safetensors"); !s.ok()) {
    std::fprintf(stderr, "Error: %s\n", s.message().c_str());
    return 5;
  }

  // 3. DiT.
  ModelManifest m;
  m.name = "infill-tiny";
  m.description = "Tiny inpainting DiT trained by infill-train on Debian wallpapers; colour and tone prompts.";
  m.dit.weights = "dit.safetensors";
  m.dit.hidden_size = hidden;
  m.dit.depth = depth;
  m.dit.num_heads = heads;
  m.dit.patch_size = 2;
  m.dit.latent_channels = channels;
  m.dit.inputs = {DitInput::kNoisyLatent, DitInput::kMaskedLatent, DitInput::kMask};
  m.dit.conditioning = ConditioningType::kVector;
  m.dit.conditioning_dim = static_cast<int>(train::vocabulary().size());
  m.dit.prompt_scope = PromptScope::kMaskedTokens;
  m.dit.prediction = PredictionType::kFlow;
  m.has_autoencoder = true;
  m.autoencoder.type = "patch_pca";
  m.autoencoder.encoder = "codec.safetensors";
  m.autoencoder.decoder = "codec.safetensors";
  m.autoencoder.latent_channels = channels;
  m.autoencoder.factor = 8;
  m.autoencoder.scale = 1.0 / latent_std;
  m.has_prompt = true;
  m.prompt.vocabulary = train::vocabulary();
  m.sampler.sampler = "euler_rf";
  m.sampler.steps = 16;
  m.default_guidance = 3.0;
  if (auto s = m.dit.validate(); !s.ok()) {
    std::fprintf(stderr, "Error: %s\n", s.message().c_str());
    return 2;
  }
  train::LatentSpace latents{&*codec, m.autoencoder.scale, 0.0};
  auto result = train::train_dit(m.dit, *data, latents, options, out + "/dit.safetensors", log);
  if (!result.ok()) {
    std::fprintf(stderr, "Error: %s\n", result.status().message().c_str());
    return 5;
  }

  // 4. Manifest, training record and loss curve.
  std::ofstream(out + "/manifest.json") << manifest_to_json(m);
  nlohmann::json record = {{"seed", options.seed},       {"steps", options.steps},   {"batch", options.batch},
                           {"crop", options.crop},       {"lr", options.lr},         {"threads", threads},
                           {"codec_psnr_db", psnr},      {"latent_std", latent_std}, {"seconds", result->seconds},
                           {"train_images", data->train.size()}, {"held_out_images", data->held_out.size()}};
  nlohmann::json curve = nlohmann::json::array(), held = nlohmann::json::array();
  for (const auto& p : result->curve) curve.push_back({p.step, p.loss});
  for (const auto& p : result->held_out_curve) held.push_back({p.step, p.loss});
  record["small_steps"] = options.small_steps;
  record["small_batch"] = options.small_batch;
  record["small_crop"] = options.small_crop;
  record["recolour_share"] = options.recolour_share;
  record["loss"] = curve;
  record["held_out_loss"] = held;
  nlohmann::json sources = nlohmann::json::array();
  for (const auto& s : data->train) sources.push_back({{"group", s.group}, {"path", s.path}, {"split", "train"}});
  for (const auto& s : data->held_out) sources.push_back({{"group", s.group}, {"path", s.path}, {"split", "held_out"}});
  record["sources"] = sources;
  std::ofstream(out + "/training.json") << record.dump(1) << "\n";
  if (auto s = train::write_loss_plot(out + "/loss.png", result->curve, result->held_out_curve); !s.ok()) {
    std::fprintf(stderr, "Error: %s\n", s.message().c_str());
    return 5;
  }
  log("wrote " + out + " in " + std::to_string(result->seconds) + " s of training");
  return 0;
}
