#include "pipeline/composite.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/Half.h>

#include "pipeline/colour_transfer.h"

namespace infill {
namespace {

std::string shape_text(const at::Tensor& t) {
  if (!t.defined()) return "undefined";
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + std::to_string(t.size(d));
  return s + "]";
}

// Sample <-> [0, 1] float conversions per storage type.
template <class T>
struct Codec;
template <>
struct Codec<uint8_t> {
  static float decode(uint8_t v) { return static_cast<float>(v) / 255.0f; }
  static uint8_t encode(float v) {
    return static_cast<uint8_t>(std::clamp(std::floor(v * 255.0f + 0.5f), 0.0f, 255.0f));
  }
};
template <>
struct Codec<uint16_t> {
  static float decode(uint16_t v) { return static_cast<float>(v) / 65535.0f; }
  static uint16_t encode(float v) {
    return static_cast<uint16_t>(std::clamp(std::floor(v * 65535.0f + 0.5f), 0.0f, 65535.0f));
  }
};
template <>
struct Codec<float> {
  static float decode(float v) { return v; }
  static float encode(float v) { return v; }
};

template <>
struct Codec<c10::Half> {
  static float decode(c10::Half v) { return static_cast<float>(v); }
  static c10::Half encode(float v) { return c10::Half(v); }  // round to nearest even
};

template <class T>
void blend(PixelImage& out, const float* rgb, const float* alpha, const PixelRect& r) {
  const int channels = out.channels;
  const int colour_channels = channels >= 3 ? 3 : 1;
  const int64_t plane = static_cast<int64_t>(r.width) * r.height;
  T* samples = reinterpret_cast<T*>(out.data.data());
  for (int y = 0; y < r.height; ++y) {
    for (int x = 0; x < r.width; ++x) {
      const int64_t i = static_cast<int64_t>(y) * r.width + x;
      const float a = alpha[i];
      if (!(a > 0.0f)) continue;  // keep the original bytes (also for NaN)
      T* px = samples + ((static_cast<int64_t>(r.y) + y) * out.width + r.x + x) * channels;
      float generated[3];
      for (int c = 0; c < 3; ++c) generated[c] = std::clamp(rgb[c * plane + i], 0.0f, 1.0f);
      if (colour_channels == 1) generated[0] = (generated[0] + generated[1] + generated[2]) / 3.0f;
      for (int c = 0; c < colour_channels; ++c) {
        const float value =
            a >= 1.0f ? generated[c] : Codec<T>::decode(px[c]) * (1.0f - a) + generated[c] * a;
        px[c] = Codec<T>::encode(value);
      }
    }
  }
}

}  // namespace

Status check_composite_inputs(const PixelImage& original, const at::Tensor& generated_rgb,
                              const at::Tensor& alpha, const PixelRect& region) {
  if (original.width <= 0 || original.height <= 0 || original.channels < 1 ||
      original.channels > 4 || original.data.size() != original.expected_bytes()) {
    return invalid_argument("composite: original image is inconsistent (" +
                            std::to_string(original.width) + "x" + std::to_string(original.height) +
                            "x" + std::to_string(original.channels) + ", " +
                            std::to_string(original.data.size()) + " bytes)");
  }
  if (region.x < 0 || region.y < 0 || region.width < 0 || region.height < 0 ||
      region.x + region.width > original.width || region.y + region.height > original.height) {
    return invalid_argument(
        "composite: region " + std::to_string(region.width) + "x" + std::to_string(region.height) +
        "+" + std::to_string(region.x) + "+" + std::to_string(region.y) + " is not inside the " +
        std::to_string(original.width) + "x" + std::to_string(original.height) + " original");
  }
  if (!generated_rgb.defined() || generated_rgb.dim() != 3 || generated_rgb.size(0) != 3 ||
      generated_rgb.size(1) != region.height || generated_rgb.size(2) != region.width ||
      !generated_rgb.is_floating_point()) {
    return invalid_argument("composite: generated image is " + shape_text(generated_rgb) +
                            ", expected float [3, " + std::to_string(region.height) + ", " +
                            std::to_string(region.width) + "]");
  }
  if (!alpha.defined() || alpha.dim() != 2 || alpha.size(0) != region.height ||
      alpha.size(1) != region.width || !alpha.is_floating_point()) {
    return invalid_argument("composite: alpha is " + shape_text(alpha) + ", expected float [" +
                            std::to_string(region.height) + ", " + std::to_string(region.width) +
                            "]");
  }
  return Status::success();
}

Status check_composite_inputs(const PixelImage& original, const at::Tensor& generated_rgb,
                              const at::Tensor& alpha) {
  return check_composite_inputs(original, generated_rgb, alpha,
                                {0, 0, original.width, original.height});
}

PixelImage composite(const PixelImage& original, const at::Tensor& generated_rgb,
                     const at::Tensor& alpha, const PixelRect& region) {
  const Status status = check_composite_inputs(original, generated_rgb, alpha, region);
  if (!status.ok()) throw std::invalid_argument(status.message());
  PixelImage out = original;
  if (region.empty()) return out;
  at::Tensor rgb = generated_rgb.to(at::kCPU, at::kFloat).contiguous();
  const at::Tensor a = alpha.to(at::kCPU, at::kFloat).contiguous();
  if (out.scene_linear) {
    // The model painted display-referred sRGB: back to the original's linear light.
    rgb = rgb.clamp(0.0f, 1.0f).contiguous();
    display_to_linear(rgb.data_ptr<float>(), rgb.size(1) * rgb.size(2), 1, rgb.size(1) * rgb.size(2));
  }
  switch (out.format) {
    case PixelFormat::kU8:
      blend<uint8_t>(out, rgb.data_ptr<float>(), a.data_ptr<float>(), region);
      break;
    case PixelFormat::kU16:
      blend<uint16_t>(out, rgb.data_ptr<float>(), a.data_ptr<float>(), region);
      break;
    case PixelFormat::kF32:
      blend<float>(out, rgb.data_ptr<float>(), a.data_ptr<float>(), region);
      break;
    case PixelFormat::kF16:
      blend<c10::Half>(out, rgb.data_ptr<float>(), a.data_ptr<float>(), region);
      break;
  }
  return out;
}

PixelImage composite(const PixelImage& original, const at::Tensor& generated_rgb,
                     const at::Tensor& alpha) {
  return composite(original, generated_rgb, alpha, {0, 0, original.width, original.height});
}

at::Tensor pad_to_multiple(const at::Tensor& image, int multiple) {
  TORCH_CHECK(image.defined() && image.dim() >= 2, "pad_to_multiple: expected [..., H, W]");
  TORCH_CHECK(multiple >= 1, "pad_to_multiple: multiple ", multiple, " must be >= 1");
  const int64_t h = image.size(-2);
  const int64_t w = image.size(-1);
  TORCH_CHECK(h > 0 && w > 0, "pad_to_multiple: empty image ", image.sizes());
  const int64_t pad_h = (multiple - h % multiple) % multiple;
  const int64_t pad_w = (multiple - w % multiple) % multiple;
  if (pad_h == 0 && pad_w == 0) return image;
  at::Tensor out = image;
  if (pad_w > 0) {
    std::vector<int64_t> sizes = out.sizes().vec();
    sizes.back() = pad_w;
    out = at::cat({out, out.narrow(-1, w - 1, 1).expand(sizes)}, -1);
  }
  if (pad_h > 0) {
    std::vector<int64_t> sizes = out.sizes().vec();
    sizes[sizes.size() - 2] = pad_h;
    out = at::cat({out, out.narrow(-2, h - 1, 1).expand(sizes)}, -2);
  }
  return out;
}

at::Tensor crop(const at::Tensor& image, int width, int height) {
  TORCH_CHECK(image.defined() && image.dim() >= 2, "crop: expected [..., H, W]");
  TORCH_CHECK(width >= 0 && height >= 0 && width <= image.size(-1) && height <= image.size(-2),
              "crop: ", width, "x", height, " does not fit in ", image.sizes());
  return image.narrow(-1, 0, width).narrow(-2, 0, height);
}

}  // namespace infill
