#include "server/edit_mask.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "pipeline/image_io.h"
#include "pipeline/template_image.h"

namespace infill {

Result<at::Tensor> decode_edit_mask(const std::string& bytes, const nlohmann::json& rect, const TemplateImage& tmpl,
                                    int64_t max_image_pixels) {
  if (!rect.is_null()) {
    if (!rect.is_array() || rect.size() != 4 ||
        !std::all_of(rect.begin(), rect.end(), [](const nlohmann::json& v) { return v.is_number_integer(); }))
      return invalid_argument("mask_rect must be [x, y, width, height] in integer pixels");
    const int64_t x = rect[0].get<int64_t>(), y = rect[1].get<int64_t>(), w = rect[2].get<int64_t>(), h = rect[3].get<int64_t>();
    if (x < 0 || y < 0 || w <= 0 || h <= 0 || x + w > tmpl.width || y + h > tmpl.height)
      return invalid_argument("mask_rect [" + std::to_string(x) + ", " + std::to_string(y) + ", " + std::to_string(w) + ", " +
                              std::to_string(h) + "] is not inside the " + std::to_string(tmpl.width) + "x" +
                              std::to_string(tmpl.height) + " template");
    at::Tensor m = at::zeros({tmpl.height, tmpl.width});
    m.narrow(0, y, h).narrow(1, x, w).fill_(1.0);
    return m;
  }
  auto image = decode_image(std::as_bytes(std::span<const char>(bytes.data(), bytes.size())), "mask", max_image_pixels);
  if (!image.ok()) return image.status();
  if (image->width != tmpl.width || image->height != tmpl.height)
    return invalid_argument("mask is " + std::to_string(image->width) + "x" + std::to_string(image->height) +
                            ", template is " + std::to_string(tmpl.width) + "x" + std::to_string(tmpl.height));
  // Grey is replicated to RGB, alpha dropped: the mean is the grey value, or RGB's mean.
  return to_rgb_tensor(*image).mean(0).contiguous();
}

}  // namespace infill
