// The bundled infill-tiny 2 (a FLUX.2 folder with its own Qwen3-architecture text encoder and
// tokenizer) loaded for a GPU: the text encoder goes there beside the transformer, the model
// says so in its id and description, and a prompt's rows equal the CPU-loaded model's within
// bf16 rounding ([cuda]: skipped, exit 4, without a CUDA device).
#include "support/catch.h"
#include "support/cuda_device.h"
#include "support/data_dirs.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "pipeline/flux2_edit_model.h"
#include "pipeline/load_edit_model.h"

using namespace infill;

TEST_CASE("On a GPU the bundled FLUX.2 model's text encoder computes there and its rows follow the CPU's",
          "[pipeline][cuda]") {
  const ComputeDevice cuda = test::require_cuda_or_skip();
  c10::InferenceMode guard;
  const std::string folder = test::source_path("resources/models/infill-tiny-2");
  auto on_cpu = load_edit_model(folder);
  auto on_gpu = load_edit_model(folder, cuda);
  REQUIRE(on_cpu.ok());
  REQUIRE(on_gpu.ok());
  const auto& cpu_parts = static_cast<const Flux2EditModel&>(*on_cpu->model).parts();
  const auto& gpu_parts = static_cast<const Flux2EditModel&>(*on_gpu->model).parts();
  CHECK(cpu_parts.text->placement() == "cpu");
  CHECK(gpu_parts.text->placement() == cuda.name());
  CHECK(on_gpu->model->info().id == on_cpu->model->info().id + "-text-bf16");
  CHECK(on_gpu->model->info().description.find("text encoder on " + cuda.name()) != std::string::npos);
  CHECK(gpu_parts.text->id() != cpu_parts.text->id());  // their cached rows are kept apart
  auto cpu_rows = cpu_parts.text->encode("a red cup on a wooden table");
  auto gpu_rows = gpu_parts.text->encode("a red cup on a wooden table");
  REQUIRE(cpu_rows.ok());
  REQUIRE(gpu_rows.ok());
  const at::Tensor a = (*gpu_rows)->rows, b = (*cpu_rows)->rows;
  REQUIRE(a.device().is_cpu());
  REQUIRE(a.sizes() == b.sizes());
  const double difference = (a - b).abs().max().item<double>() / b.abs().max().item<double>();
  CHECK(difference <= 3e-2);  // bf16 activations over the encoder's layers
  WARN("infill-tiny 2's text encoder on " << cuda.name() << " vs the CPU: max_rel " << difference);
}

TEST_CASE("A device K/V budget that leaves no room keeps the text encoder on the CPU", "[pipeline][cuda]") {
  const ComputeDevice cuda = test::require_cuda_or_skip();
  c10::InferenceMode guard;
  const std::string folder = test::source_path("resources/models/infill-tiny-2");
  GpuModelOptions gpu;
  gpu.device_cache_bytes = int64_t{1} << 40;  // more than any GPU has free (the config's upper bound)
  auto loaded = load_edit_model(folder, cuda, gpu);
  REQUIRE(loaded.ok());
  const auto& parts = static_cast<const Flux2EditModel&>(*loaded->model).parts();
  CHECK(parts.text->placement() == "cpu");
  CHECK(loaded->model->info().id.find("-text-bf16") == std::string::npos);
  CHECK(parts.device_cache_bytes == gpu.device_cache_bytes);  // and the tier has that budget
}
