#include "model/flux2_model.h"

#include "model/flux2_checkpoint.h"
#include "model/learned_decoder_codec.h"
#include "model/safetensors.h"

namespace infill {

Result<std::unique_ptr<Flux2Model>> load_flux2_model(const std::string& path) {
  INFILL_ASSIGN_OR_RETURN(Flux2Folder folder, find_flux2_folder(path));
  INFILL_ASSIGN_OR_RETURN(Flux2Checkpoint checkpoint, Flux2Checkpoint::open(folder.transformer_files));
  INFILL_ASSIGN_OR_RETURN(Flux2Transformer transformer, Flux2Transformer::load(checkpoint));
  std::shared_ptr<const LatentCodec> codec;
  std::shared_ptr<const Flux2Autoencoder> autoencoder;
  if (folder.codec_class == "LearnedDecoderCodec") {
    INFILL_ASSIGN_OR_RETURN(LearnedDecoderCodec learned, LearnedDecoderCodec::load(folder.autoencoder_file));
    codec = std::make_shared<const LearnedDecoderCodec>(std::move(learned));
  } else {
    INFILL_ASSIGN_OR_RETURN(SafetensorsFile ae_file, SafetensorsFile::open(folder.autoencoder_file));
    INFILL_ASSIGN_OR_RETURN(Flux2Autoencoder vae, Flux2Autoencoder::load(ae_file));
    autoencoder = std::make_shared<const Flux2Autoencoder>(std::move(vae));
    codec = autoencoder;
  }
  if (codec->latent_channels() != transformer.config().in_channels) {
    return invalid_argument(folder.autoencoder_file + ": the autoencoder's latent has " +
                            std::to_string(codec->latent_channels()) + " channels, the transformer (" +
                            checkpoint.where() + ") reads " + std::to_string(transformer.config().in_channels));
  }
  const int cells = transformer.config().mask_cells();
  if (cells > 0 && codec->factor() % cells != 0) {
    return invalid_argument(checkpoint.where() + ": the transformer reads " + std::to_string(cells) + "x" +
                            std::to_string(cells) + " mask cells per token, which do not divide the codec's " +
                            std::to_string(codec->factor()) + "-pixel tokens (" + folder.autoencoder_file + ")");
  }
  return std::unique_ptr<Flux2Model>(
      new Flux2Model{std::move(folder), std::move(transformer), std::move(codec), std::move(autoencoder),
                     checkpoint.stored_dtypes()});
}

}  // namespace infill
