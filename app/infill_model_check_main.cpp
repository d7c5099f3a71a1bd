// infill-model-check FILE...: runs the call recorded in each reference tensor file and prints
// one JSON line per file; exit 0 only when every file loads and matches (model/reference_check.h).
// infill-model-check --folder PATH: loads a FLUX.2 model folder as the engine would and
// describes it in one JSON line; exit 0 only when it loads.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include <nlohmann/json.hpp>

#include "common/blas_kernel.h"
#include "model/flux2_model.h"
#include "model/reference_check.h"

namespace {

// One JSON line describing the model folder at `path`, or the error that kept it from loading.
int describe_folder(const std::string& path) {
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
  line["load_ms"] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  line["ok"] = true;
  std::printf("%s\n", line.dump().c_str());
  return 0;
}

void usage(FILE* out) {
  std::fprintf(out,
               "usage: infill-model-check [--blocks] [--device cpu|cuda[:N]] [--bf16] FILE...\n"
               "       infill-model-check --folder PATH\n"
               "Runs the call recorded in each reference file (weights.*, input.*, output.*, trace.*)\n"
               "and prints one JSON line per file: {\"file\", \"model\", \"max_abs_err\", \"max_rel_err\", \"ok\"}.\n"
               "ok: max |diff| / max |reference| <= %g (%g with --bf16). --blocks adds every compared tensor.\n"
               "--device runs the transformer there (default cpu); --bf16 computes in bf16 on a CUDA device.\n"
               "--folder loads a FLUX.2 model folder (diffusers or single-file layout) and describes it.\n"
               "Exit code 0 only when every file is ok (or the folder loads).\n",
               infill::kReferenceTolerance, infill::kReferenceToleranceBf16);
}

}  // namespace

int main(int argc, char** argv) {
  infill::select_blas_kernel();  // first: before any GEMM (common/blas_kernel.h)
  bool blocks = false;
  infill::ReferenceCheckOptions options;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      usage(stdout);
      return 0;
    }
    if (std::strcmp(argv[i], "--folder") == 0) {
      if (i + 1 != argc - 1) {
        std::fprintf(stderr, "infill-model-check: --folder takes exactly one PATH\n");
        return 2;
      }
      return describe_folder(argv[i + 1]);
    }
    if (std::strcmp(argv[i], "--blocks") == 0) {
      blocks = true;
    } else if (std::strcmp(argv[i], "--bf16") == 0) {
      options.bfloat16 = true;
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
  if (files.empty()) {
    usage(stderr);
    return 2;
  }
  if (options.bfloat16 && !options.device.cuda) {
    std::fprintf(stderr, "infill-model-check: --bf16 needs a CUDA --device (the CPU computes in float32)\n");
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
      line["dtype"] = options.bfloat16 ? "bfloat16" : "float32";
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
