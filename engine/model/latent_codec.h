#pragma once
/// The interface between pixels and the DiT's latent space, so that a model can ship the
/// codec that suits it: the TAESD-family autoencoder (model/autoencoder.h) or the patch PCA
/// transform of the bundled infill-tiny model (model/patch_pca_codec.h).
///
/// Threading: implementations are immutable after loading; every method may be called from
/// several threads at once.

#include <ATen/core/Tensor.h>

namespace infill {

class LatentCodec {
 public:
  virtual ~LatentCodec() = default;

  /// Pixels per latent pixel along each axis.
  virtual int factor() const = 0;
  virtual int latent_channels() const = 0;

  /// rgb [B, 3, H, W] float32 in [0, 1], H and W multiples of factor() -> [B, C, H/f, W/f].
  virtual at::Tensor encode(const at::Tensor& rgb) const = 0;
  /// latent [B, C, h, w] -> rgb [B, 3, f*h, f*w] clamped to [0, 1].
  virtual at::Tensor decode(const at::Tensor& latent) const = 0;
  /// Decodes the latent box (x0, y0, w, h) (latent pixels) with `margin` latent pixels of
  /// context where the codec needs it, returning that box's pixels [B, 3, f*h, f*w].
  virtual at::Tensor decode_crop(const at::Tensor& latent, int x0, int y0, int w, int h, int margin) const = 0;
};

}  // namespace infill
