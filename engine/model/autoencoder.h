#pragma once
/// The TAESD-family tiny autoencoder: RGB <-> latent at 1/8 resolution.
///
/// Layout (weight keys are the original PyTorch `nn.Sequential` indices, e.g.
/// "1.conv.0.weight", "13.pool.0.weight"; see ../shared/models/taef2/README.md):
///   Block(x)   = relu(conv4(relu(conv2(relu(conv0(x))))) + x), where a context block first does
///                x = x + conv1x1(relu(group_norm_4(conv1x1(x))))  (width -> 4*width -> width);
///   encoder    = conv 3->W, Block, [conv s2, Block x3] x3 (the last three context blocks),
///                conv W->C;
///   decoder    = tanh(z/3)*3, conv C->W, relu, Block x3 (context), [upsample x2, conv, Block x3]
///   x2,
///                upsample x2, conv, Block, conv W->3.
/// All convs are 3x3 with padding 1; the stride-2 and post-upsample convs have no bias.
///
/// Weights are held as float32 CPU tensors; inference runs with plain ATen ops inside
/// c10::InferenceMode. Threading: an Autoencoder is immutable after load/random; encode and
/// decode may be called from several threads at once.

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "common/status.h"
#include "model/latent_codec.h"

namespace infill {

struct AutoencoderConfig {
  int latent_channels = 32;
  int width = 64;              ///< channels of every hidden layer
  bool context_blocks = true;  ///< global-context ("pool") branch in the latent-resolution blocks
  /// invalid_argument unless latent_channels and width are positive and width % 4 == 0
  /// (GroupNorm with 4 groups).
  Status validate() const;
};

namespace detail {

/// One layer of the original `nn.Sequential` (its index is the position in the vector and the
/// weight key prefix). Implementation detail of Autoencoder. Weights float32, CPU.
struct AutoencoderLayer {
  enum class Kind { kConv, kBlock, kUpsample, kRelu, kClamp };
  Kind kind = Kind::kConv;
  int stride = 1;
  // kConv: weight [out, in, 3, 3], bias [out] or undefined.
  at::Tensor weight, bias;
  // kBlock: the three 3x3 convs [W, W, 3, 3] with biases [W].
  at::Tensor conv0_weight, conv0_bias, conv2_weight, conv2_bias, conv4_weight, conv4_bias;
  // kBlock with the context branch, undefined otherwise:
  // [4W, W, 1, 1], GroupNorm affine [4W] and [4W], [W, 4W, 1, 1].
  at::Tensor pool0_weight, pool1_weight, pool1_bias, pool3_weight;
};

}  // namespace detail

class Autoencoder final : public LatentCodec {
 public:
  /// Pixels per latent pixel along each axis.
  static constexpr int kFactor = 8;

  /// Loads both halves; the config is inferred from the tensor shapes and every tensor's shape
  /// is checked. Errors name the file and tensor: not_found, invalid_argument (wrong shape,
  /// dtype, an unexpected tensor, encoder and decoder that disagree), corrupt_data.
  static Result<Autoencoder> load(const std::string& encoder_path, const std::string& decoder_path);

  /// Random weights (PyTorch's default conv init), already rounded to fp16 so that
  /// save() + load() reproduces the same network exactly. For tests and stand-in models.
  static Autoencoder random(const AutoencoderConfig& config, uint64_t seed);

  /// Writes both halves as F16 safetensors with the original key names, atomically.
  Status save(const std::string& encoder_path, const std::string& decoder_path) const;

  const AutoencoderConfig& config() const { return config_; }
  int factor() const override { return kFactor; }
  int latent_channels() const override { return config_.latent_channels; }

  /// rgb [B, 3, H, W] float32 in [0, 1], H and W multiples of 8 -> latent [B, C, H/8, W/8].
  /// Shape or dtype errors throw (programming errors). Returns a normal (non-inference) tensor.
  at::Tensor encode(const at::Tensor& rgb) const override;

  /// latent [B, C, h, w] float32 -> rgb [B, 3, 8h, 8w] clamped to [0, 1].
  at::Tensor decode(const at::Tensor& latent) const override;

  /// Decodes only the latent box (x0, y0, w, h) (latent pixels), with `margin` latent pixels of
  /// context on each side (clamped to the latent bounds), and returns that box's pixels
  /// [B, 3, 8h, 8w] in [0, 1]. The latent-resolution trunk (up to the first upsample, where the
  /// global-context GroupNorms are) runs on the whole latent so its statistics are exact; only
  /// the upsampling stages are cropped. Differences from decode() come from zero padding at
  /// the context box's edges; the margin keeps them away from the returned pixels.
  at::Tensor decode_crop(const at::Tensor& latent, int x0, int y0, int w, int h, int margin) const override;

 private:
  AutoencoderConfig config_;
  std::vector<detail::AutoencoderLayer> encoder_;
  std::vector<detail::AutoencoderLayer> decoder_;
};

}  // namespace infill
