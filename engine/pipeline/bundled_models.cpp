#include "pipeline/bundled_models.h"

#include <filesystem>

namespace infill {

namespace fs = std::filesystem;

const std::vector<std::string>& bundled_model_names() {
  static const std::vector<std::string> names = {"infill-tiny-2", "infill-tiny"};
  return names;
}

std::vector<std::string> bundled_model_dirs(const std::string& source_dir) {
  std::error_code ec;
  const fs::path exe_dir = fs::read_symlink("/proc/self/exe", ec).parent_path();
  std::vector<std::string> found;
  for (const std::string& name : bundled_model_names()) {
    std::vector<fs::path> candidates = {exe_dir / "../share/infill/models" / name, exe_dir / "../resources/models" / name};
    if (!source_dir.empty()) candidates.push_back(fs::path(source_dir) / "resources/models" / name);
    for (const fs::path& dir : candidates) {
      // A model folder: the DiT family's manifest or a FLUX.2 (diffusers layout) index.
      if (fs::exists(dir / "manifest.json", ec) || fs::exists(dir / "model_index.json", ec)) {
        found.push_back(fs::weakly_canonical(dir, ec).string());
        break;
      }
    }
  }
  return found;
}

}  // namespace infill
