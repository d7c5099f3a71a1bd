#include "model/model.h"

#include <filesystem>
#include <fstream>

#include "common/hash.h"
#include "model/file_identity.h"
#include "model/patch_pca_codec.h"

namespace infill {

Result<std::shared_ptr<const Model>> load_model(const std::string& path) {
  INFILL_ASSIGN_OR_RETURN(ModelManifest manifest, load_manifest(path));
  const std::string dit_path = manifest.resolve(manifest.dit.weights);
  INFILL_ASSIGN_OR_RETURN(Dit dit, Dit::load(manifest.dit, dit_path));
  INFILL_ASSIGN_OR_RETURN(uint64_t identity, file_identity(dit_path));
  std::shared_ptr<const LatentCodec> ae;
  if (manifest.has_autoencoder) {
    const std::string enc = manifest.resolve(manifest.autoencoder.encoder);
    const std::string dec = manifest.resolve(manifest.autoencoder.decoder);
    if (manifest.autoencoder.type == "patch_pca") {
      if (enc != dec) return invalid_argument(manifest.name + ": a patch_pca codec is one file; encoder and decoder must name it both");
      INFILL_ASSIGN_OR_RETURN(PatchPcaCodec loaded, PatchPcaCodec::load(enc));
      ae = std::make_shared<PatchPcaCodec>(std::move(loaded));
    } else {
      INFILL_ASSIGN_OR_RETURN(Autoencoder loaded, Autoencoder::load(enc, dec));
      ae = std::make_shared<Autoencoder>(std::move(loaded));
    }
    if (ae->factor() != manifest.autoencoder.factor || ae->latent_channels() != manifest.autoencoder.latent_channels) {
      return invalid_argument(enc + ": codec has factor " + std::to_string(ae->factor()) + " and " +
                              std::to_string(ae->latent_channels()) + " channels, the manifest says factor " +
                              std::to_string(manifest.autoencoder.factor) + " and " +
                              std::to_string(manifest.autoencoder.latent_channels));
    }
    INFILL_ASSIGN_OR_RETURN(uint64_t enc_id, file_identity(enc));
    INFILL_ASSIGN_OR_RETURN(uint64_t dec_id, file_identity(dec));
    identity = identity * 31 + enc_id * 7 + dec_id;
  }
  auto model = std::make_shared<Model>(Model{std::move(manifest), std::move(dit), std::move(ae), ""});
  model->id = model->manifest.name + "-" + hex64(identity);
  return std::shared_ptr<const Model>(std::move(model));
}

Status write_random_model(const std::string& folder, const DitConfig& dit_config, int ae_width, uint64_t seed) {
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  if (ec) return io_error("cannot create model folder " + folder + ": " + ec.message());
  ModelManifest m;
  m.name = "infill-random";
  m.dit = dit_config;
  m.dit.weights = "dit.safetensors";
  INFILL_RETURN_IF_ERROR(m.dit.validate());
  m.has_autoencoder = true;
  m.autoencoder.type = "taesd";
  m.autoencoder.encoder = "ae_encoder.safetensors";
  m.autoencoder.decoder = "ae_decoder.safetensors";
  m.autoencoder.latent_channels = dit_config.latent_channels;
  INFILL_RETURN_IF_ERROR(Dit::random(m.dit, seed).save(folder + "/dit.safetensors", /*fp16=*/true));
  AutoencoderConfig ae;
  ae.latent_channels = dit_config.latent_channels;
  ae.width = ae_width;
  INFILL_RETURN_IF_ERROR(Autoencoder::random(ae, seed + 1)
                             .save(folder + "/ae_encoder.safetensors", folder + "/ae_decoder.safetensors"));
  const std::string tmp = folder + "/manifest.json.tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << manifest_to_json(m);
    if (!out) return io_error("cannot write " + tmp);
  }
  std::filesystem::rename(tmp, folder + "/manifest.json", ec);
  if (ec) return io_error("cannot write " + folder + "/manifest.json: " + ec.message());
  return {};
}

}  // namespace infill
