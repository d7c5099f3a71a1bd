#pragma once
/// The FLUX.2 autoencoder (black-forest-labs/flux2, `src/flux2/autoencoder.py`): RGB <-> a
/// 4z-channel latent at 1/16 resolution (for the published ch_mult of four levels).
///
/// Layout (weight keys are the upstream module names, as in `ae.safetensors`; diffusers' names
/// are mapped to them on load):
///   ResnetBlock(x) = shortcut(x) + conv2(silu(norm2(conv1(silu(norm1(x)))))), 3x3 convs,
///                    GroupNorm(32 groups, eps 1e-6), a 1x1 `nin_shortcut` where channels change;
///   AttnBlock(x)   = x + proj_out(softmax(q k^T / sqrt(C)) v), one head over the h*w positions,
///                    q, k, v 1x1 convs of norm(x);
///   encoder        = conv_in, per level i: num_res_blocks ResnetBlocks to ch*ch_mult[i] and
///                    (except the last level) a stride-2 3x3 conv after zero padding (0,1,0,1);
///                    mid (block_1, attn_1, block_2), norm_out, silu, conv_out -> 2z,
///                    quant_conv (1x1); the first z channels are the mean;
///   decoder        = post_quant_conv (1x1), conv_in, mid, per level from the last:
///                    num_res_blocks + 1 ResnetBlocks and (except level 0) nearest x2 upsample +
///                    3x3 conv; norm_out, silu, conv_out -> 3;
///   latent         = the mean, 2x2-patchified ("c (i pi) (j pj) -> (c pi pj) i j") and
///                    normalised with the `bn` running statistics (eps 1e-4).
///
/// Weights are held as float32 CPU tensors whatever the file stores (the published ae has
/// about 84M parameters, so about 336 MB); inference runs with plain ATen ops inside
/// c10::InferenceMode. Threading: a Flux2Autoencoder is immutable after load; copies share
/// the weights, and every method may be called from several threads at once.

#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "common/status.h"
#include "model/compute_device.h"
#include "model/latent_codec.h"
#include "model/safetensors.h"

namespace infill {

/// The upstream `AutoEncoderParams` that fix the weight shapes (`resolution` does not).
struct Flux2AutoencoderConfig {
  int in_channels = 3;
  int out_channels = 3;
  int ch = 128;
  std::vector<int> ch_mult{1, 2, 4, 4};
  int num_res_blocks = 2;
  int z_channels = 32;

  /// Latent channels after the 2x2 patchify: 4 * z_channels.
  int latent_channels() const;
  /// Pixels per latent pixel along each axis: 2^(levels-1) * 2.
  int factor() const;
  /// invalid_argument unless every size is positive, ch_mult is not empty and every
  /// GroupNorm's channel count (ch and ch * ch_mult[i]) is a multiple of 32.
  Status validate() const;
  /// "ch=32, ch_mult=[1, 2], num_res_blocks=1, z_channels=4, in_channels=3, out_channels=3"
  std::string to_string() const;
};

class Flux2Autoencoder final : public LatentCodec {
 public:
  /// Loads the weights under `key_prefix` ("weights." in the reference test files, "" in
  /// ae.safetensors and in diffusers' vae/diffusion_pytorch_model.safetensors); tensors outside
  /// the prefix are ignored, and so is bn.num_batches_tracked. The naming is recognised from the
  /// keys: the upstream module names (encoder.*, decoder.*, bn.running_mean, bn.running_var), or
  /// diffusers' AutoencoderKLFlux2 names (when encoder.down_blocks.0.resnets.0.conv1.weight is
  /// present), read back as upstream names by inverting diffusers'
  /// scripts/convert_flux2_to_diffusers.py. The config is inferred from the shapes and then every
  /// tensor's shape is checked. Errors name the file and the tensor as stored (a missing one by
  /// its upstream name when the file has diffusers names): not_found (a missing tensor),
  /// invalid_argument (a wrong shape or dtype, an unexpected tensor under the prefix, such as a
  /// diffusers name with no upstream counterpart, a config that cannot be inferred),
  /// corrupt_data (a NaN or infinite value, a negative running variance). Nothing is
  /// half-loaded.
  static Result<Flux2Autoencoder> load(const SafetensorsFile& file,
                                       const std::string& key_prefix = "");
  /// Opens `path` and loads it with an empty key prefix.
  static Result<Flux2Autoencoder> load(const std::string& path);
  /// Random weights of `config` (fan-in scaled convolutions, norm scales near 1), for tests,
  /// benchmarks and as the start of training.
  static Flux2Autoencoder random(const Flux2AutoencoderConfig& config, uint64_t seed);
  /// Writes the weights under upstream names (an `ae.safetensors`), float32.
  Status save(const std::string& path) const;
  /// A copy whose weights live on `device` (float32) and whose encode and decode compute there
  /// (issue 39: a stroke's crop decode is a large share of a live-painting budget, seconds on
  /// the CPU at 1024x1024); this one is unchanged. Inputs may stay on the CPU: every method
  /// returns its result on its input's device. resource_exhausted naming the device when its
  /// memory cannot hold the weights.
  Result<Flux2Autoencoder> on_device(const ComputeDevice& device) const;
  /// Where the weights live and encode and decode compute.
  at::Device device() const;

  const Flux2AutoencoderConfig& config() const;

  /// image [B, in_channels, H, W] float32 in [-1, 1], H and W multiples of factor() ->
  /// normalised latent [B, 4z, H/f, W/f] (upstream `AutoEncoder.encode`). Shape or dtype errors
  /// throw (programming errors). Returns an ordinary (non-inference) contiguous tensor.
  at::Tensor encode_normalized(const at::Tensor& image) const;

  /// The inverse (upstream `AutoEncoder.decode`): normalised latent [B, 4z, h, w] float32 ->
  /// image [B, out_channels, f*h, f*w], about [-1, 1] and not clamped.
  at::Tensor decode_normalized(const at::Tensor& latent) const;

  /// The encoder's mean [B, z, H', W'] (H', W' even) -> the normalised latent
  /// [B, 4z, H'/2, W'/2]: 2x2 patchify and batch-norm statistics, the last step of
  /// encode_normalized. Shared with decoders of the same latent space (TAEF2).
  at::Tensor patchify_normalize(const at::Tensor& mean) const;
  /// The inverse: normalised latent [B, 4z, h, w] -> [B, z, 2h, 2w], what the decoder reads.
  at::Tensor unpatchify_denormalize(const at::Tensor& latent) const;

  int factor() const override;
  int latent_channels() const override;

  /// rgb [B, 3, H, W] float32 in [0, 1] -> encode_normalized(rgb * 2 - 1).
  at::Tensor encode(const at::Tensor& rgb) const override;
  /// (decode_normalized(latent) + 1) / 2 clamped to [0, 1]: [B, 3, f*h, f*w].
  at::Tensor decode(const at::Tensor& latent) const override;
  /// Decodes the latent box (x0, y0, w, h) (latent pixels) grown by `margin` latent pixels on
  /// each side (clamped to the latent bounds) and returns that box's pixels [B, 3, f*h, f*w] in
  /// [0, 1]. Approximate, whatever the margin, unless the grown box is the whole latent: the
  /// decoder's mid attention and its GroupNorms see only the grown box, not the whole image;
  /// a wider margin brings the result closer to decode().
  at::Tensor decode_crop(const at::Tensor& latent, int x0, int y0, int w, int h,
                         int margin) const override;

 private:
  struct Weights;
  explicit Flux2Autoencoder(std::shared_ptr<const Weights> weights);
  std::shared_ptr<const Weights> w_;
};

}  // namespace infill
