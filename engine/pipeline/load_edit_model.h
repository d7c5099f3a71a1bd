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

/// Errors name the file at fault and what was expected there. `device`: where the model
/// computes; the DiT family runs on the CPU only (an error names the device otherwise).
/// `step_graph_bytes`: a FLUX.2 model's budget for CUDA graphs of masked rounds on a GPU
/// (Flux2LoadOptions::step_graph_bytes; 0 = none).
Result<LoadedEditModel> load_edit_model(const std::string& path, const ComputeDevice& device = {},
                                        int64_t step_graph_bytes = 0);

}  // namespace infill
