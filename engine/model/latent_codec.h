#pragma once
/// The interface between pixels and the DiT's latent space, so that a model can ship the
/// codec that suits it: the TAESD-family autoencoder (model/autoencoder.h) or the patch PCA
/// transform of the bundled infill-tiny model (model/patch_pca_codec.h).
///
/// Threading: implementations are immutable after loading; every method may be called from
/// several threads at once.

#include <algorithm>
#include <cstdint>

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

namespace infill {

/// The box decode_crop decodes: (x0, y0, w, h) grown by `margin` latent pixels on each side
/// and clamped to the latent [B, C, height, width], as half-open [x0, x1) x [y0, y1).
struct LatentContextBox {
  int64_t x0 = 0, y0 = 0, x1 = 0, y1 = 0;
};

/// Checks that the box lies inside the latent (a programming error otherwise: throws
/// c10::Error naming `codec`) and grows it by `margin`.
inline LatentContextBox latent_context_box(const at::Tensor& latent, int x0, int y0, int w, int h, int margin,
                                           const char* codec) {
  const int64_t height = latent.size(2), width = latent.size(3);
  TORCH_CHECK(x0 >= 0 && y0 >= 0 && w > 0 && h > 0 && x0 + w <= width && y0 + h <= height && margin >= 0, codec,
              ": decode_crop box (x0=", x0, ", y0=", y0, ", w=", w, ", h=", h, ", margin=", margin,
              ") is not inside the ", width, "x", height, " latent");
  return {std::max<int64_t>(0, x0 - margin), std::max<int64_t>(0, y0 - margin),
          std::min<int64_t>(width, int64_t{x0} + w + margin), std::min<int64_t>(height, int64_t{y0} + h + margin)};
}

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
