#pragma once
/// A template: the image a user edits, decoded once and encoded to the model's latent.

#include <memory>
#include <span>
#include <string>

#include <ATen/core/Tensor.h>

#include "common/status.h"
#include "model/latent_codec.h"
#include "model/model.h"
#include "pipeline/image_io.h"

namespace infill {

struct TemplateImage {
  std::string id;        ///< SHA-256 of the encoded file bytes (the template id)
  PixelImage pixels;     ///< the decoded original, kept for the bit-exact composite
  int width = 0;         ///< pixel size of the original
  int height = 0;
  int model_width = 0;   ///< padded up to a multiple of the token grid (codec factor x patch size)
  int model_height = 0;
  at::Tensor rgb;        ///< [3, model_height, model_width] float in [0, 1], edge-padded
  at::Tensor latent;     ///< [C, model_height / f, model_width / f] in the model's latent scale
};

/// Any codec's template: decodes `bytes`, edge-pads the pixels to a multiple of `grid` and
/// encodes them to (codec latent - shift) * scale. FLUX.2 models use shift 0, scale 1 (their
/// codec's latent is the normalised one the transformer reads) and grid = the codec factor.
/// Errors: undecodable bytes, an image above `max_pixels`.
Result<std::shared_ptr<const TemplateImage>> make_template(const LatentCodec& codec, int grid, double shift,
                                                           double scale, int64_t max_pixels,
                                                           std::span<const std::byte> bytes,
                                                           const std::string& name_for_errors);

/// The same from pixels already decoded; `id` names the template (make_template uses the
/// sha256 of the bytes the pixels came from).
Result<std::shared_ptr<const TemplateImage>> template_from_pixels(const LatentCodec& codec, int grid, double shift,
                                                                  double scale, PixelImage pixels, std::string id);

/// Decodes `bytes` (any format OpenImageIO reads), pads and encodes it.
/// Errors: undecodable bytes, an image above the model's max_image_pixels.
Result<std::shared_ptr<const TemplateImage>> make_template(const Model& model, std::span<const std::byte> bytes,
                                                           const std::string& name_for_errors);
/// Reads the file at `path` and calls make_template.
Result<std::shared_ptr<const TemplateImage>> load_template(const Model& model, const std::string& path);

/// Latent in DiT scale -> autoencoder scale, and back.
at::Tensor to_autoencoder_scale(const Model& model, const at::Tensor& latent);

}  // namespace infill
