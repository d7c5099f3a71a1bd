#pragma once
/// The codec of infill-tiny 2: the patch PCA encoder (model/patch_pca_codec.h, linear and
/// exact) with a small learned convolutional decoder of the TAESD kind in place of the PCA's
/// patch-by-patch decode, so that errors in a generated latent come out as smooth image
/// errors instead of 8x8 squares.
///
/// Latent layout (as FLUX.2 reads its VAE latent): the PCA latent [B, C, H/f, W/f] (f = the
/// PCA patch size, 8) is normalised, (z - shift) * scale, and patchified 2x2 into
/// [B, 4C, H/2f, W/2f] with channel index c*4 + dy*2 + dx (einops
/// "b c (h ph) (w pw) -> b (c ph pw) h w"). So factor() == 2f and latent_channels() == 4C.
///
/// Decoder (weights named as in tools/train/train_codec.h, which trains it):
///   z8 = unpatchify(latent)                                   [B, C, H/f, W/f]
///   x  = relu(conv_in(z8))                                    level 0 at 1/f, widths[0]
///   level k >= 1: x = relu(up(upsample_nearest_x2(x)))        widths[k] at 2^k/f
///   every level:  x = Block(x) blocks[k] times, Block(x) = relu(conv1(relu(conv0(x))) + x)
///   rgb = clamp(conv_out(x), 0, 1)                            [B, 3, H, W]
/// All convs 3x3, padding 1, with bias. No normalisation layers, so a crop decoded with
/// context_margin() latent pixels of context equals the same pixels of a full decode.
///
/// File (one safetensors file, because the decoder is only valid for the PCA basis and latent
/// scale it was trained with, so they must not travel apart):
///   "pca.mean" [3 f f], "pca.basis" [C, 3 f f] (F32: the encoder is exact),
///   "decoder.conv_in.weight" [W0, C, 3, 3], "decoder.conv_in.bias" [W0],
///   "decoder.levels.<k>.up.weight" [Wk, Wk-1, 3, 3] and ".bias" [Wk] for k >= 1,
///   "decoder.levels.<k>.blocks.<j>.conv0|conv1.weight" [Wk, Wk, 3, 3] and ".bias" [Wk],
///   "decoder.conv_out.weight" [3, WL, 3, 3], "decoder.conv_out.bias" [3]  (F16 or F32),
///   metadata "scale" (> 0) and "shift" (default 0), decimal numbers.
/// Threading: immutable after load/random; every method may run on several threads at once.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "common/status.h"
#include "model/latent_codec.h"
#include "model/patch_pca_codec.h"

namespace infill {

/// [B, C, 2h, 2w] -> [B, 4C, h, w], channel c*4 + dy*2 + dx.
at::Tensor patchify_2x2(const at::Tensor& x);
/// The inverse of patchify_2x2: [B, 4C, h, w] -> [B, C, 2h, 2w].
at::Tensor unpatchify_2x2(const at::Tensor& x);

struct LearnedDecoderConfig {
  int pca_factor = 8;    ///< PCA patch size f (2, 4, 8 or 16); the codec's factor() is 2f
  int pca_channels = 8;  ///< C; the codec's latent_channels() is 4C
  /// Hidden channels per level, from 1/f resolution (level 0) to full resolution:
  /// log2(f) + 1 entries.
  std::vector<int> widths = {64, 32, 16, 8};
  /// Residual blocks per level (>= 0), as many entries as widths.
  std::vector<int> blocks = {1, 1, 1, 0};
  /// invalid_argument naming the field unless the sizes above are consistent and positive.
  Status validate() const;
  /// Latent pixels (at 1/2f) of context that decide one output pixel's value beyond its own
  /// latent pixel: the margin decode_crop needs to match decode() exactly.
  int context_margin() const;
};

class LearnedDecoderCodec final : public LatentCodec {
 public:
  /// Loads and validates one codec file (see above). The config is inferred from the tensor
  /// shapes, then every shape is checked. Errors name the file and the tensor: not_found
  /// (missing file or tensor), invalid_argument (wrong shape or dtype, unexpected tensor, bad
  /// metadata), corrupt_data (NaN or infinite values, non-orthonormal basis).
  static Result<LearnedDecoderCodec> load(const std::string& path);

  /// Joins a fitted PCA codec with decoder weights named as in the file without the
  /// "decoder." prefix ("conv_in.weight", ...). The config is inferred and checked as in load.
  /// `scale` > 0 and `shift` are the latent normalisation. Errors as load, naming `what`.
  static Result<LearnedDecoderCodec> from_parts(
      const PatchPcaCodec& pca, double scale, double shift,
      const std::vector<std::pair<std::string, at::Tensor>>& decoder,
      const std::string& what = "learned decoder codec");

  /// Random orthonormal PCA basis and random decoder weights (PyTorch's default conv init),
  /// rounded to fp16 so that save() + load() reproduces the network exactly; scale 1, shift 0.
  /// For tests and benchmarks. Throws c10::Error on an invalid config.
  static LearnedDecoderCodec random(const LearnedDecoderConfig& config, uint64_t seed);

  /// Writes the codec (PCA F32, decoder F16), atomically. invalid_argument when a decoder
  /// weight is outside the fp16 range.
  Status save(const std::string& path) const;

  const LearnedDecoderConfig& config() const { return config_; }
  const PatchPcaCodec& pca() const { return pca_; }
  double scale() const { return scale_; }
  double shift() const { return shift_; }
  /// config().context_margin(): the decode_crop margin that makes the crop exact.
  int context_margin() const { return config_.context_margin(); }
  /// Decoder weights in file order, without the "decoder." prefix (float32).
  std::vector<std::pair<std::string, at::Tensor>> decoder_weights() const;

  int factor() const override { return 2 * config_.pca_factor; }
  int latent_channels() const override { return 4 * config_.pca_channels; }

  /// rgb [B, 3, H, W] float32 in [0, 1], H and W multiples of factor() -> [B, 4C, H/2f, W/2f].
  at::Tensor encode(const at::Tensor& rgb) const override;
  /// latent [B, 4C, h, w] float32 -> rgb [B, 3, 2f h, 2f w] in [0, 1] through the learned decoder.
  at::Tensor decode(const at::Tensor& latent) const override;
  /// The same latent through the PCA's own linear patch decode (the blocky reference).
  at::Tensor decode_pca(const at::Tensor& latent) const;
  /// Decodes the latent box (x0, y0, w, h) with `margin` latent pixels of context (clamped to
  /// the latent) and returns its pixels [B, 3, 2f h, 2f w]. Equal to the same pixels of decode()
  /// (up to float rounding) when margin >= context_margin(); a smaller margin changes pixels
  /// near the box's edges that are not image edges.
  at::Tensor decode_crop(const at::Tensor& latent, int x0, int y0, int w, int h,
                         int margin) const override;

 private:
  /// One 3x3 conv of the decoder, in file order (see decoder_layout in the source).
  struct Conv {
    at::Tensor weight, bias;  // [out, in, 3, 3] channels-last, [out]
  };
  explicit LearnedDecoderCodec(PatchPcaCodec pca) : pca_(std::move(pca)) {}
  /// Builds the codec from decoder tensors named without the "decoder." prefix; messages
  /// start with `what`.
  static Result<LearnedDecoderCodec> build(
      const PatchPcaCodec& pca, double scale, double shift,
      const std::vector<std::pair<std::string, at::Tensor>>& decoder, const std::string& what);
  at::Tensor run_decoder(const at::Tensor& z) const;  // [B, C, h, w] -> [B, 3, f h, f w]

  LearnedDecoderConfig config_;
  PatchPcaCodec pca_;
  double scale_ = 1.0;
  double shift_ = 0.0;
  std::vector<Conv> convs_;
};

}  // namespace infill
