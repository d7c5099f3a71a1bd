#pragma once
/// The engine embedded in infill-render's process: the same model loader, activation store
/// (RAM and the shared disk tier) and serving runtime as infill-engine, so edits submitted
/// together are batched per denoising step and every edit on a template shares the template's
/// prepared K/V cache, across processes too when the disk tier is shared. Torch-free header.

#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "render_backend.h"

namespace infill::render {

struct EmbeddedOptions {
  std::string model_path;           ///< a model folder; "" = bundled_model_path()
  std::string cache_dir;            ///< disk tier of the activation cache; "" = RAM only
  uint64_t ram_cache_bytes = uint64_t{2} << 30;
  int threads = 0;                  ///< compute threads; 0 = every core
};

/// Loads the model and starts the runtime. Errors: the model cannot be loaded (not_found /
/// corrupt_data / invalid_argument naming the file), the store cannot be opened.
Result<std::unique_ptr<RenderBackend>> open_embedded_backend(const EmbeddedOptions& options);

/// The default bundled model (infill-tiny-2; pipeline/bundled_models.h) next to an installed
/// binary or in the source tree; "" when none exists.
std::string bundled_model_path();

}  // namespace infill::render
