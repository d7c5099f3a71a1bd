// bench_blas_kernel: what OpenBLAS's kernel choice (common/blas_kernel.h) costs the bundled
// model's training, in one run: a training step of infill-tiny 2's transformer (forward,
// backward, AdamW update) at the recipe's two batch shapes, with the kernels OpenBLAS chose at
// load, with its SSE3 fallback ("Prescott", what it picks on CPU models it does not know), and
// with the widest kernels this CPU runs (what select_blas_kernel() switches a fallback to).
// The batch making (crops, codec, text encoder) is not included: it does not go through BLAS.
// Random weights and inputs (the cost does not depend on their values). Prints one JSON document.
//
// usage: bench_blas_kernel [--threads N] [--repeats N] [--model DIR]
#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "bench_stats.h"
#include "common/blas_kernel.h"
#include "machine_info.h"
#include "model/compute_threads.h"
#include "model/flux2_transformer.h"
#include "model/safetensors.h"
#include "pipeline/flux2_sequence.h"
#include "tools/train/tiny2_recipe.h"
#include "tools/train/train_flux2.h"

namespace {

struct Shape {
  const char* name;
  int64_t batch;
  int64_t grid;  // tokens per side: crop / 16 (8x8 PCA patches, 2x2 per token)
};

// The median of `repeats` training steps after one warm-up step, in ms.
double median_step_ms(const infill::Flux2Config& config, const Shape& shape, int text_rows,
                      int repeats) {
  torch::manual_seed(1);
  infill::train::TrainFlux2 model(config);
  model->initialise();
  torch::optim::AdamW optimiser(model->parameters(), torch::optim::AdamWOptions(1e-4));
  const int64_t B = shape.batch, N = shape.grid * shape.grid;
  const torch::Tensor txt = torch::randn({B, text_rows, config.context_dim});
  const torch::Tensor img = torch::randn({B, 2 * N, config.in_channels + config.mask_channels});
  const torch::Tensor target = torch::randn({B, N, config.in_channels});
  const torch::Tensor txt_ids = infill::flux2_text_ids(text_rows);
  const torch::Tensor img_ids =
      torch::cat({infill::flux2_grid_ids(shape.grid, shape.grid, 0),
                  infill::flux2_grid_ids(shape.grid, shape.grid, infill::kFlux2ReferenceTime)});
  const torch::Tensor t = torch::rand({B});
  auto step = [&] {
    optimiser.zero_grad();
    const torch::Tensor loss =
        (model->forward(txt, txt_ids, img, img_ids, t, N) - target).pow(2).mean();
    loss.backward();
    optimiser.step();
  };
  return infill::bench::median_ms(repeats, step);
}

}  // namespace

int main(int argc, char** argv) {
  const infill::BlasKernelChoice start = infill::select_blas_kernel();  // first: before any GEMM
  int threads = 2, repeats = 5;
  std::string model_dir = std::string(INFILL_SOURCE_DIR) + "/resources/models/infill-tiny-2";
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    const bool known = flag == "--threads" || flag == "--repeats" || flag == "--model";
    if (!known || i + 1 >= argc) {
      std::cerr << "bench_blas_kernel: "
                << (known ? flag + " needs a value" : "unknown option '" + flag + "'")
                << "\nusage: bench_blas_kernel [--threads N] [--repeats N] [--model DIR]\n";
      return 2;
    }
    const std::string value = argv[i + 1];
    if (flag == "--model") {
      model_dir = value;
      continue;
    }
    const int n = std::atoi(value.c_str());
    if (n <= 0) {
      std::cerr << "bench_blas_kernel: " << flag << " is \"" << value
                << "\", expected a positive integer\n";
      return 2;
    }
    (flag == "--threads" ? threads : repeats) = n;
  }
  if (start.in_use.empty()) {
    std::cerr << "bench_blas_kernel: " << start.library
              << ": there are no OpenBLAS kernels to compare\n";
    return 4;
  }
  threads = infill::set_compute_threads(threads);

  const std::string weights = model_dir + "/transformer/diffusion_pytorch_model.safetensors";
  auto file = infill::SafetensorsFile::open(weights);
  if (!file.ok()) {
    std::cerr << "bench_blas_kernel: --model: " << file.status().message() << "\n";
    return 2;
  }
  auto config = infill::infer_flux2_config(*file, "");
  if (!config.ok()) {
    std::cerr << "bench_blas_kernel: " << weights << ": " << config.status().message() << "\n";
    return 2;
  }
  const infill::train::Tiny2Options recipe;
  const std::vector<Shape> shapes = {{"small", 32, 128 / 16}, {"large", 12, 256 / 16}};

  // The cores to compare, each once: OpenBLAS's own choice, its fallback, the widest.
  const std::string widest =
      infill::wider_openblas_core("Prescott", infill::detect_cpu_vector_features());
  std::vector<std::string> cores;
  for (const std::string& core : {start.detected, std::string("Prescott"), widest}) {
    if (!core.empty() && std::find(cores.begin(), cores.end(), core) == cores.end())
      cores.push_back(core);
  }

  nlohmann::json rows = nlohmann::json::array();
  std::map<std::string, std::map<std::string, double>> ms;
  for (const std::string& core : cores) {
    const std::string in_use = infill::use_openblas_core(core);
    if (in_use.empty()) {
      std::cerr << "bench_blas_kernel: this OpenBLAS cannot switch to " << core << "\n";
      return 5;
    }
    nlohmann::json row = {{"core", in_use}};
    for (const Shape& shape : shapes) {
      ms[in_use][shape.name] = median_step_ms(*config, shape, recipe.max_sequence_length, repeats);
      row[std::string(shape.name) + "_step_ms"] = ms[in_use][shape.name];
    }
    // The recipe's transformer steps at these costs: stage 1's small then large steps, then the
    // distractor and capitals stages' large ones.
    const int large_steps = recipe.transformer_steps - recipe.small_steps +
                            recipe.distractor_steps + recipe.capitals_steps;
    row["recipe_transformer_compute_s"] =
        (recipe.small_steps * ms[in_use]["small"] + large_steps * ms[in_use]["large"]) / 1000.0;
    rows.push_back(row);
  }
  infill::use_openblas_core(start.in_use);

  nlohmann::json out = {
      {"benchmark", "bench_blas_kernel"},
      {"machine", infill::bench::machine_info()},
      {"model", model_dir},
      {"transformer",
       {{"hidden", config->hidden_size},
        {"double_blocks", config->double_blocks},
        {"single_blocks", config->single_blocks},
        {"context_dim", config->context_dim}}},
      {"shapes",
       {{"small", {{"batch", 32}, {"crop", 128}}}, {"large", {{"batch", 12}, {"crop", 256}}}}},
      {"text_rows", recipe.max_sequence_length},
      {"threads", threads},
      {"repeats", repeats},
      {"openblas_chose_at_load", start.detected},
      {"cores", rows}};
  if (!widest.empty() && ms.count(widest) && ms.count("Prescott")) {
    out["speedup_widest_vs_prescott"] = {{"small", ms["Prescott"]["small"] / ms[widest]["small"]},
                                         {"large", ms["Prescott"]["large"] / ms[widest]["large"]}};
  }
  std::cout << out.dump(2) << std::endl;
  return 0;
}
