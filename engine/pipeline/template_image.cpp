#include "pipeline/template_image.h"

#include <fstream>
#include <iterator>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "common/hash.h"
#include "pipeline/composite.h"

namespace infill {

at::Tensor to_autoencoder_scale(const Model& model, const at::Tensor& latent) {
  const auto& ae = model.manifest.autoencoder;
  return latent / ae.scale + ae.shift;
}

Result<std::shared_ptr<const TemplateImage>> make_template(const LatentCodec& codec, int grid, double shift,
                                                           double scale, int64_t max_pixels,
                                                           std::span<const std::byte> bytes,
                                                           const std::string& name_for_errors) {
  INFILL_ASSIGN_OR_RETURN(PixelImage pixels, decode_image(bytes, name_for_errors, max_pixels));
  return template_from_pixels(codec, grid, shift, scale, std::move(pixels), sha256_hex(bytes));
}

Result<std::shared_ptr<const TemplateImage>> template_from_pixels(const LatentCodec& codec, int grid, double shift,
                                                                  double scale, PixelImage pixels, std::string id) {
  c10::InferenceMode guard;
  auto t = std::make_shared<TemplateImage>();
  t->id = std::move(id);
  t->width = pixels.width;
  t->height = pixels.height;
  at::Tensor rgb = pad_to_multiple(to_rgb_tensor(pixels), grid);
  t->model_height = static_cast<int>(rgb.size(1));
  t->model_width = static_cast<int>(rgb.size(2));
  t->rgb = rgb;
  t->latent = ((codec.encode(rgb.unsqueeze(0))[0] - shift) * scale).contiguous();
  t->pixels = std::move(pixels);
  return std::shared_ptr<const TemplateImage>(std::move(t));
}

Result<std::shared_ptr<const TemplateImage>> make_template(const Model& model, std::span<const std::byte> bytes,
                                                           const std::string& name_for_errors) {
  if (!model.autoencoder) return invalid_argument("model " + model.manifest.name + " has no autoencoder");
  const auto& ae = model.manifest.autoencoder;
  return make_template(*model.autoencoder, ae.factor * model.manifest.dit.patch_size, ae.shift, ae.scale,
                       model.manifest.max_image_pixels, bytes, name_for_errors);
}

Result<std::shared_ptr<const TemplateImage>> load_template(const Model& model, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("template image " + path + " cannot be opened");
  std::vector<char> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (data.empty()) return invalid_argument("template image " + path + " is empty");
  return make_template(model, std::as_bytes(std::span<const char>(data)), path);
}

}  // namespace infill
