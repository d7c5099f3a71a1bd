#pragma once
/// Loads a model folder of any family the engine serves: a folder with `manifest.json` is of
/// the DiT family (the bundled infill-tiny); anything else is read as FLUX.2 (a diffusers
/// folder, or the single-file layout with its text encoder and tokenizer).

#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "model/compute_device.h"
#include "model/model.h"
#include "pipeline/edit_model.h"

namespace infill {

struct LoadedEditModel {
  std::shared_ptr<const EditModel> model;
  /// The same model when it is of the DiT family (its cost calibration runs Dit::forward).
  std::shared_ptr<const Model> dit;
};

/// How a FLUX.2 model computes on a GPU.
struct GpuModelOptions {
  /// The budget for CUDA graphs of masked rounds (Flux2LoadOptions::step_graph_bytes; 0 = none).
  int64_t step_graph_bytes = 0;
  /// FP8 block projections (Flux2LoadOptions::float8_weights). Refused on the CPU, naming the
  /// device, for either family.
  bool float8_weights = false;
  /// The fused norm kernels (Flux2LoadOptions::fused_norms). Refused on the CPU, naming the
  /// device, for either family.
  bool fused_norms = false;
  /// The device tier's budget of cached K/V (Flux2LoadOptions::device_cache_bytes), which the
  /// text encoder's place on the GPU is decided beside.
  int64_t device_cache_bytes = int64_t{8} << 30;
};

/// Errors name the file at fault and what was expected there. `device`: where the model
/// computes; the DiT family runs on the CPU only (an error names the device otherwise).
Result<LoadedEditModel> load_edit_model(const std::string& path, const ComputeDevice& device = {},
                                        const GpuModelOptions& gpu = {});

}  // namespace infill
