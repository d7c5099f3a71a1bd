#pragma once
/// A FLUX.2 model loaded from its folder (model/flux2_folder.h): the transformer in its stored
/// dtype and the autoencoder, with the folder's sampling defaults. The text encoder and the
/// tokenizer are located and checked by the folder, and read by the text side.
///
/// Threading: immutable after loading; share it as std::shared_ptr<const Flux2Model>.

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/flux2_autoencoder.h"
#include "model/flux2_folder.h"
#include "model/flux2_transformer.h"
#include "model/latent_codec.h"

namespace infill {

struct Flux2Model {
  Flux2Folder folder;
  Flux2Transformer transformer;
  /// Templates and results: the FLUX.2 VAE, or the bundled model's codec.
  std::shared_ptr<const LatentCodec> codec;
  /// The FLUX.2 VAE when the folder has one (it is `codec` then); null for the bundled codec.
  std::shared_ptr<const Flux2Autoencoder> autoencoder;
  /// The dtypes the transformer's file stores its weights in (Flux2Checkpoint::stored_dtypes).
  std::vector<std::string> transformer_stored_dtypes;
};

/// Recognises and checks the folder (or transformer file), then loads the transformer and the
/// codec the folder names (model/flux2_folder.h). Every error names the file (and the tensor) at fault; nothing is half-loaded.
Result<std::unique_ptr<Flux2Model>> load_flux2_model(const std::string& path);

}  // namespace infill
