#pragma once
/// A template: the image a user edits, decoded once and encoded to the model's latent.

#include <memory>
#include <span>
#include <string>

#include <ATen/core/Tensor.h>

#include "common/status.h"
#include "model/model.h"
#include "pipeline/image_io.h"

namespace infill {

struct TemplateImage {
  std::string id;        ///< SHA-256 of the encoded file bytes (the template id)
  PixelImage pixels;     ///< the decoded original, kept for the bit-exact composite
  int width = 0;         ///< pixel size of the original
  int height = 0;
  int model_width = 0;   ///< padded up to a multiple of 8 * patch size
  int model_height = 0;
  at::Tensor rgb;        ///< [3, model_height, model_width] float in [0, 1], edge-padded
  at::Tensor latent;     ///< [C, model_height / 8, model_width / 8] in the DiT's latent scale
};

/// Decodes `bytes` (any format OpenImageIO reads), pads and encodes it.
/// Errors: undecodable bytes, an image above the model's max_image_pixels.
Result<std::shared_ptr<const TemplateImage>> make_template(const Model& model, std::span<const std::byte> bytes,
                                                           const std::string& name_for_errors);
/// Reads the file at `path` and calls make_template.
Result<std::shared_ptr<const TemplateImage>> load_template(const Model& model, const std::string& path);

/// Latent in DiT scale -> autoencoder scale, and back.
at::Tensor to_autoencoder_scale(const Model& model, const at::Tensor& latent);

}  // namespace infill
