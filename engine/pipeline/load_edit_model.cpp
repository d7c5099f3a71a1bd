#include "pipeline/load_edit_model.h"

#include <filesystem>

#include "pipeline/dit_edit_model.h"
#include "pipeline/flux2_edit_model.h"

namespace infill {

Result<LoadedEditModel> load_edit_model(const std::string& path) {
  LoadedEditModel out;
  std::error_code ec;
  if (std::filesystem::exists(std::filesystem::path(path) / "manifest.json", ec)) {
    INFILL_ASSIGN_OR_RETURN(out.dit, load_model(path));
    out.model = std::make_shared<const DitEditModel>(out.dit);
    return out;
  }
  INFILL_ASSIGN_OR_RETURN(out.model, load_flux2_edit_model(path, {}));
  return out;
}

}  // namespace infill
