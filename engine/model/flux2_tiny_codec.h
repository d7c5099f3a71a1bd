#pragma once
/// TAEF2 (the tiny TAESD-family autoencoder trained on the FLUX.2 VAE's latent space) as a codec
/// of FLUX.2's normalised latent: the fast decoder for previews. TAEF2 reads and writes the
/// VAE's latent mean [B, 32, H/8, W/8]; the transformer works on that mean 2x2-patchified and
/// normalised by the VAE's batch-norm statistics [B, 128, H/16, W/16]. This codec joins the two
/// with the VAE's own patchify_normalize / unpatchify_denormalize, so its latents are the ones
/// the FLUX.2 VAE makes and the transformer reads.
///
/// Threading: immutable; every method may be called from several threads at once.

#include <memory>

#include <ATen/core/Tensor.h>

#include "model/autoencoder.h"
#include "model/flux2_autoencoder.h"
#include "model/latent_codec.h"

namespace infill {

class Flux2TinyCodec final : public LatentCodec {
 public:
  /// `taef2`: the TAESD-family networks (latent_channels must equal the VAE's z_channels);
  /// `vae`: the FLUX.2 VAE whose statistics define the normalised latent.
  Flux2TinyCodec(std::shared_ptr<const Autoencoder> taef2, std::shared_ptr<const Flux2Autoencoder> vae);

  int factor() const override { return 2 * Autoencoder::kFactor; }
  int latent_channels() const override { return vae_->latent_channels(); }
  /// rgb [B, 3, H, W] in [0, 1], H and W multiples of 16 -> normalised latent [B, 4z, H/16, W/16].
  at::Tensor encode(const at::Tensor& rgb) const override;
  /// normalised latent [B, 4z, h, w] -> rgb [B, 3, 16h, 16w] in [0, 1].
  at::Tensor decode(const at::Tensor& latent) const override;
  /// The latent box (x0, y0, w, h) in normalised-latent pixels, through TAEF2's cropped decode
  /// (2 TAEF2 latent pixels per normalised-latent pixel; `margin` likewise).
  at::Tensor decode_crop(const at::Tensor& latent, int x0, int y0, int w, int h, int margin) const override;

 private:
  std::shared_ptr<const Autoencoder> taef2_;
  std::shared_ptr<const Flux2Autoencoder> vae_;
};

}  // namespace infill
