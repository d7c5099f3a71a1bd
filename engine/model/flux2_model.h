#pragma once
/// A FLUX.2 model loaded from its folder (model/flux2_folder.h): the transformer in its stored
/// dtype and the autoencoder, with the folder's sampling defaults. The text encoder and the
/// tokenizer are located and checked by the folder, and read by the text side.
///
/// Threading: immutable after loading; share it as std::shared_ptr<const Flux2Model>.

#include <memory>
#include <string>

#include "common/status.h"
#include "model/flux2_autoencoder.h"
#include "model/flux2_folder.h"
#include "model/flux2_transformer.h"

namespace infill {

struct Flux2Model {
  Flux2Folder folder;
  Flux2Transformer transformer;
  std::shared_ptr<const Flux2Autoencoder> autoencoder;
};

/// Recognises and checks the folder (or transformer file), then loads the transformer and the
/// autoencoder. Every error names the file (and the tensor) at fault; nothing is half-loaded.
Result<std::unique_ptr<Flux2Model>> load_flux2_model(const std::string& path);

}  // namespace infill
