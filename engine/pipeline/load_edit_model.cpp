#include "pipeline/load_edit_model.h"

#include <filesystem>

#include "pipeline/dit_edit_model.h"
#include "pipeline/flux2_edit_model.h"

namespace infill {

Result<LoadedEditModel> load_edit_model(const std::string& path, const ComputeDevice& device, int64_t step_graph_bytes) {
  LoadedEditModel out;
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
  options.step_graph_bytes = step_graph_bytes;
  INFILL_ASSIGN_OR_RETURN(out.model, load_flux2_edit_model(path, options));
  return out;
}

}  // namespace infill
