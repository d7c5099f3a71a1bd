#include "model/flux2_model.h"

#include "model/flux2_checkpoint.h"
#include "model/safetensors.h"

namespace infill {

Result<std::unique_ptr<Flux2Model>> load_flux2_model(const std::string& path) {
  INFILL_ASSIGN_OR_RETURN(Flux2Folder folder, find_flux2_folder(path));
  INFILL_ASSIGN_OR_RETURN(Flux2Checkpoint checkpoint, Flux2Checkpoint::open(folder.transformer_files));
  INFILL_ASSIGN_OR_RETURN(Flux2Transformer transformer, Flux2Transformer::load(checkpoint));
  INFILL_ASSIGN_OR_RETURN(SafetensorsFile ae_file, SafetensorsFile::open(folder.autoencoder_file));
  INFILL_ASSIGN_OR_RETURN(Flux2Autoencoder autoencoder, Flux2Autoencoder::load(ae_file));
  if (autoencoder.latent_channels() != transformer.config().in_channels) {
    return invalid_argument(folder.autoencoder_file + ": the autoencoder's latent has " +
                            std::to_string(autoencoder.latent_channels()) + " channels, the transformer (" +
                            checkpoint.where() + ") reads " + std::to_string(transformer.config().in_channels));
  }
  auto model = std::unique_ptr<Flux2Model>(new Flux2Model{std::move(folder), std::move(transformer),
                                                          std::make_shared<const Flux2Autoencoder>(std::move(autoencoder))});
  return model;
}

}  // namespace infill
