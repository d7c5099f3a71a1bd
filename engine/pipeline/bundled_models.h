#pragma once
/// Where the models bundled with Infill are: infill-tiny-2 (the default: FLUX.2 architecture,
/// free-text prompts) and infill-tiny (the first bundled model: a DiT with colour words, kept
/// for fast CPU smoke tests). Torch-free.

#include <string>
#include <vector>

namespace infill {

/// Names of the bundled models, default first.
const std::vector<std::string>& bundled_model_names();

/// The bundled model folders that exist, default first, each looked for next to the running
/// binary (`<prefix>/share/infill/models/NAME` of an installed package, `../resources/models/NAME`
/// of a build tree) and in `source_dir`/resources/models (empty: not looked for). Canonical
/// paths.
std::vector<std::string> bundled_model_dirs(const std::string& source_dir);

}  // namespace infill
