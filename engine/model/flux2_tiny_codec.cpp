#include "model/flux2_tiny_codec.h"

#include <c10/util/Exception.h>

namespace infill {

Flux2TinyCodec::Flux2TinyCodec(std::shared_ptr<const Autoencoder> taef2, std::shared_ptr<const Flux2Autoencoder> vae)
    : taef2_(std::move(taef2)), vae_(std::move(vae)) {
  TORCH_CHECK(taef2_ && vae_, "Flux2TinyCodec needs both networks");
  TORCH_CHECK(taef2_->latent_channels() == vae_->config().z_channels, "TAEF2 has ", taef2_->latent_channels(),
              " latent channels, the FLUX.2 VAE's mean has ", vae_->config().z_channels);
}

at::Tensor Flux2TinyCodec::encode(const at::Tensor& rgb) const { return vae_->patchify_normalize(taef2_->encode(rgb)); }

at::Tensor Flux2TinyCodec::decode(const at::Tensor& latent) const {
  return taef2_->decode(vae_->unpatchify_denormalize(latent));
}

at::Tensor Flux2TinyCodec::decode_crop(const at::Tensor& latent, int x0, int y0, int w, int h, int margin) const {
  return taef2_->decode_crop(vae_->unpatchify_denormalize(latent), 2 * x0, 2 * y0, 2 * w, 2 * h, 2 * margin);
}

}  // namespace infill
