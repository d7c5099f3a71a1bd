#include "pipeline/load_edit_model.h"

#include <filesystem>

#include "model/float8_linear.h"
#include "pipeline/dit_edit_model.h"
#include "pipeline/flux2_edit_model.h"

namespace infill {

Result<LoadedEditModel> load_edit_model(const std::string& path, const ComputeDevice& device, const GpuModelOptions& gpu) {
  LoadedEditModel out;
  if (gpu.float8_weights && !device.cuda) {
    return invalid_argument(path + ": float8_weights: " + float8_compute_status(device).message());
  }
  if (gpu.fused_norms && !device.cuda) {
    return invalid_argument(path + ": fused_norm_kernels: " + device.name() +
                            ": the fused norms are CUDA kernels (on the CPU libtorch's ops run)");
  }
  std::error_code ec;
  if (std::filesystem::exists(std::filesystem::path(path) / "manifest.json", ec)) {
    if (device.cuda) {
      return Status(ErrorCode::kUnimplemented,
                    path + ": models of the DiT family (manifest.json) run on the CPU only, not on " + device.name());
    }
    INFILL_ASSIGN_OR_RETURN(out.dit, load_model(path));
    out.model = std::make_shared<const DitEditModel>(out.dit);
    return out;
  }
  Flux2LoadOptions options;
  options.device = device;
  options.step_graph_bytes = gpu.step_graph_bytes;
  options.float8_weights = gpu.float8_weights;
  options.fused_norms = gpu.fused_norms;
  options.device_cache_bytes = gpu.device_cache_bytes;
  INFILL_ASSIGN_OR_RETURN(out.model, load_flux2_edit_model(path, options));
  return out;
}

}  // namespace infill
