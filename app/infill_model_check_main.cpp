// infill-model-check FILE...: runs the call recorded in each reference tensor file and prints
// one JSON line per file; exit 0 only when every file loads and matches (model/reference_check.h).
// infill-model-check --folder PATH [--lora FILE[:STRENGTH]]...: loads a FLUX.2 model folder as
// the engine would and describes it, and each LoRA read for it, in one JSON line; exit 0 only
// when everything loads.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/blas_kernel.h"
#include "model/flux2_model.h"
#include "model/lora_adapter.h"
#include "model/reference_check.h"

namespace {

// A --lora argument: FILE or FILE:STRENGTH.
struct LoraArg {
  std::string file;
  double strength = 1.0;
};

bool parse_lora_arg(const std::string& text, LoraArg& out) {
  out = LoraArg{text, 1.0};
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos) return true;
  try {
    size_t used = 0;
    const double s = std::stod(text.substr(colon + 1), &used);
    if (used != text.size() - colon - 1) return false;
    out = LoraArg{text.substr(0, colon), s};
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

// One JSON line describing the model folder at `path` and the LoRAs read for it, or the error
// that kept one from loading.
int describe_folder(const std::string& path, const std::vector<LoraArg>& loras) {
  nlohmann::ordered_json line;
  line["folder"] = path;
  const auto t0 = std::chrono::steady_clock::now();
  auto model = infill::load_flux2_model(path);
  if (!model.ok()) {
    line["error"] = model.status().to_string();
    line["ok"] = false;
    std::printf("%s\n", line.dump().c_str());
    return 1;
  }
  const infill::Flux2Folder& f = (*model)->folder;
  const infill::Flux2Config& c = (*model)->transformer.config();
  line["layout"] = infill::flux2_layout_name(f.layout);
  line["pipeline_class"] = f.pipeline_class;
  line["family_size"] = c.family_size();
  line["distilled"] = f.distilled;
  line["default_steps"] = f.default_steps;
  line["default_guidance"] = f.default_guidance;
  line["transformer"] = {{"files", f.transformer_files},
                         {"hidden_size", c.hidden_size},
                         {"num_heads", c.num_heads},
                         {"double_blocks", c.double_blocks},
                         {"single_blocks", c.single_blocks},
                         {"context_dim", c.context_dim},
                         {"mask_channels", c.mask_channels},
                         {"guidance_embed", c.guidance_embed},
                         {"stored_dtypes", (*model)->transformer_stored_dtypes},
                         {"weight_bytes", (*model)->transformer.weight_bytes()}};
  line["autoencoder"] = {{"file", f.autoencoder_file},
                         {"class", f.codec_class.empty() ? "AutoencoderKLFlux2" : f.codec_class},
                         {"latent_channels", (*model)->codec->latent_channels()},
                         {"factor", (*model)->codec->factor()}};
  if ((*model)->autoencoder) {
    line["autoencoder"]["ch"] = (*model)->autoencoder->config().ch;
    line["autoencoder"]["z_channels"] = (*model)->autoencoder->config().z_channels;
  }
  line["max_sequence_length"] = f.max_sequence_length;
  line["text_encoder"] = f.text_encoder_dir;
  line["tokenizer"] = f.tokenizer_dir;
  nlohmann::ordered_json adapters = nlohmann::ordered_json::array();
  for (const LoraArg& arg : loras) {
    auto lora = infill::load_lora(arg.file, c, "the model in " + path);
    if (!lora.ok()) {
      line["loras"] = std::move(adapters);
      line["error"] = lora.status().to_string();
      line["ok"] = false;
      std::printf("%s\n", line.dump().c_str());
      return 1;
    }
    adapters.push_back({{"file", arg.file},
                        {"strength", arg.strength},
                        {"id", (*lora)->id},
                        {"format", infill::lora_format_name((*lora)->format)},
                        {"min_rank", (*lora)->min_rank()},
                        {"max_rank", (*lora)->max_rank()},
                        {"layers", (*lora)->layers.size()},
                        {"bytes", (*lora)->bytes()}});
  }
  if (!loras.empty()) line["loras"] = std::move(adapters);
  line["load_ms"] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  line["ok"] = true;
  std::printf("%s\n", line.dump().c_str());
  return 0;
}

void usage(FILE* out) {
  std::fprintf(out,
               "usage: infill-model-check [--blocks] [--device cpu|cuda[:N]] [--bf16 [--fp8]] [--fused-norms] FILE...\n"
               "       infill-model-check --folder PATH [--lora FILE[:STRENGTH]]...\n"
               "Runs the call recorded in each reference file (weights.*, input.*, output.*, trace.*)\n"
               "and prints one JSON line per file: {\"file\", \"model\", \"max_abs_err\", \"max_rel_err\", \"ok\"}.\n"
               "ok: max |diff| / max |reference| <= %g (%g with --bf16, %g with --fp8). --blocks adds every\n"
               "compared tensor. --device runs the transformer there (default cpu); --bf16 computes in bf16\n"
               "on a CUDA device; --fp8 with it keeps the block projections in FP8 (compute capability 8.9+).\n"
               "--fused-norms runs the transformer's row norms as the project's CUDA kernels (a CUDA --device).\n"
               "A transformer reference file applies the LoRA files its metadata \"loras\" names, from its folder.\n"
               "--folder loads a FLUX.2 model folder (diffusers or single-file layout) and describes it,\n"
               "with each --lora file read for that model (format, ranks, layers; errors name the key).\n"
               "Exit code 0 only when every file is ok (or the folder loads).\n",
               infill::kReferenceTolerance, infill::kReferenceToleranceBf16, infill::kReferenceToleranceFloat8);
}

}  // namespace

int main(int argc, char** argv) {
  infill::select_blas_kernel();  // first: before any GEMM (common/blas_kernel.h)
  bool blocks = false;
  infill::ReferenceCheckOptions options;
  std::vector<std::string> files;
  std::string folder;
  std::vector<LoraArg> loras;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      usage(stdout);
      return 0;
    }
    if (std::strcmp(argv[i], "--folder") == 0 || std::strcmp(argv[i], "--lora") == 0) {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "infill-model-check: %s needs a value\n", argv[i]);
        return 2;
      }
      if (argv[i][2] == 'f') {
        folder = argv[++i];
        continue;
      }
      LoraArg arg;
      if (!parse_lora_arg(argv[++i], arg)) {
        std::fprintf(stderr, "infill-model-check: --lora '%s': expected FILE or FILE:STRENGTH (a number)\n", argv[i]);
        return 2;
      }
      loras.push_back(arg);
      continue;
    }
    if (std::strcmp(argv[i], "--blocks") == 0) {
      blocks = true;
    } else if (std::strcmp(argv[i], "--bf16") == 0) {
      options.bfloat16 = true;
    } else if (std::strcmp(argv[i], "--fp8") == 0) {
      options.float8 = true;
    } else if (std::strcmp(argv[i], "--fused-norms") == 0) {
      options.fused_norms = true;
    } else if (std::strcmp(argv[i], "--device") == 0) {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "infill-model-check: --device needs a value (cpu, cuda or cuda:N)\n");
        return 2;
      }
      auto device = infill::parse_compute_device(argv[++i]);
      if (!device.ok()) {
        std::fprintf(stderr, "infill-model-check: %s\n", device.status().message().c_str());
        return 2;
      }
      options.device = *device;
    } else if (argv[i][0] == '-') {
      std::fprintf(stderr, "infill-model-check: unknown option '%s'\n", argv[i]);
      usage(stderr);
      return 2;
    } else {
      files.emplace_back(argv[i]);
    }
  }
  if (!folder.empty() || !loras.empty()) {
    if (folder.empty() || !files.empty()) {
      std::fprintf(stderr, "infill-model-check: --lora goes with --folder PATH (the model it is read for), "
                           "not with reference files\n");
      return 2;
    }
    return describe_folder(folder, loras);
  }
  if (files.empty()) {
    usage(stderr);
    return 2;
  }
  if (options.bfloat16 && !options.device.cuda) {
    std::fprintf(stderr, "infill-model-check: --bf16 needs a CUDA --device (the CPU computes in float32)\n");
    return 2;
  }
  if (options.float8 && !options.bfloat16) {
    std::fprintf(stderr, "infill-model-check: --fp8 goes with --bf16 and a CUDA --device (FP8 layers compute in bf16)\n");
    return 2;
  }
  if (options.fused_norms && !options.device.cuda) {
    std::fprintf(stderr, "infill-model-check: --fused-norms needs a CUDA --device (they are CUDA kernels)\n");
    return 2;
  }
  bool all_ok = true;
  for (const std::string& file : files) {
    nlohmann::ordered_json line;
    line["file"] = file;
    auto check = infill::run_reference_check(file, options);
    if (!check.ok()) {
      line["model"] = nullptr;
      line["error"] = check.status().to_string();
      line["ok"] = false;
      all_ok = false;
    } else {
      line["model"] = check->model;
      line["max_abs_err"] = check->max_abs_err;
      line["max_rel_err"] = check->max_rel_err;
      line["device"] = options.device.name();
      line["dtype"] = options.float8 ? "bfloat16, FP8 block weights" : options.bfloat16 ? "bfloat16" : "float32";
      if (options.fused_norms) line["norms"] = "fused CUDA kernels";
      line["tolerance"] = options.tolerance();
      if (check->loras > 0) line["loras"] = check->loras;
      line["ok"] = check->ok;
      all_ok = all_ok && check->ok;
      if (blocks) {
        nlohmann::ordered_json list = nlohmann::ordered_json::array();
        for (const auto& c : check->comparisons) {
          list.push_back({{"name", c.name}, {"max_abs_err", c.max_abs_err}, {"max_rel_err", c.max_rel_err}});
        }
        line["comparisons"] = std::move(list);
      }
    }
    std::printf("%s\n", line.dump().c_str());
    std::fflush(stdout);
  }
  return all_ok ? 0 : 1;
}
