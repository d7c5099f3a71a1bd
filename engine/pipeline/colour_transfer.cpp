#include "pipeline/colour_transfer.h"

#include <cmath>
#include <memory>
#include <vector>

#ifdef INFILL_HAVE_OIIO
#include <OpenImageIO/color.h>
#endif

namespace infill {
namespace {

// The piecewise curves of IEC 61966-2-1; NaN stays NaN (to_rgb_tensor maps it to 0).
float srgb_encode(float linear) {
  if (linear <= 0.0031308f) return 12.92f * linear;
  return 1.055f * std::pow(linear, 1.0f / 2.4f) - 0.055f;
}

float srgb_decode(float encoded) {
  if (encoded <= 0.04045f) return encoded / 12.92f;
  return std::pow((encoded + 0.055f) / 1.055f, 2.4f);
}

template <class Curve>
void apply_curve(float* data, int64_t pixels, int64_t pixel_stride, int64_t channel_stride, Curve curve) {
  for (int64_t i = 0; i < pixels; ++i)
    for (int c = 0; c < 3; ++c) {
      float& v = data[i * pixel_stride + c * channel_stride];
      v = curve(v);
    }
}

#ifdef INFILL_HAVE_OIIO
struct Processors {
  Processors() {
    to_display = config.createColorProcessor("linear", "sRGB");
    to_linear = config.createColorProcessor("sRGB", "linear");
    if (!to_display || !to_linear) {
      to_display.reset();
      to_linear.reset();
      description = "the sRGB curve (IEC 61966-2-1); OpenColorIO config " + std::string(config.configname()) +
                    " has no \"linear\" and \"sRGB\" spaces";
    } else {
      description = "OpenColorIO config " + std::string(config.configname()) + ": linear -> sRGB";
    }
  }
  OIIO::ColorConfig config;  // $OCIO's config, else OIIO's built-in one
  OIIO::ColorProcessorHandle to_display;
  OIIO::ColorProcessorHandle to_linear;
  std::string description;
};

const Processors& processors() {
  static const Processors p;
  return p;
}

void apply_processor(const OIIO::ColorProcessor& processor, float* data, int64_t pixels, int64_t pixel_stride,
                     int64_t channel_stride) {
  if (channel_stride == 1) {
    // One row of `pixels` RGB triples, `pixel_stride` floats apart.
    processor.apply(data, static_cast<int>(pixels), 1, 3, sizeof(float), pixel_stride * sizeof(float),
                    static_cast<OIIO::stride_t>(pixels * pixel_stride * sizeof(float)));
    return;
  }
  // OIIO's built-in processors ignore the channel stride: planar data goes through
  // interleaved triples.
  std::vector<float> rgb(static_cast<size_t>(pixels) * 3);
  for (int64_t i = 0; i < pixels; ++i)
    for (int c = 0; c < 3; ++c) rgb[i * 3 + c] = data[i * pixel_stride + c * channel_stride];
  processor.apply(rgb.data(), static_cast<int>(pixels), 1, 3, sizeof(float), 3 * sizeof(float),
                  static_cast<OIIO::stride_t>(pixels * 3 * sizeof(float)));
  for (int64_t i = 0; i < pixels; ++i)
    for (int c = 0; c < 3; ++c) data[i * pixel_stride + c * channel_stride] = rgb[i * 3 + c];
}
#endif

}  // namespace

void linear_to_display(float* data, int64_t pixels, int64_t pixel_stride, int64_t channel_stride) {
  if (pixels <= 0) return;
#ifdef INFILL_HAVE_OIIO
  if (const auto& p = processors(); p.to_display) {
    apply_processor(*p.to_display, data, pixels, pixel_stride, channel_stride);
    return;
  }
#endif
  apply_curve(data, pixels, pixel_stride, channel_stride, srgb_encode);
}

void display_to_linear(float* data, int64_t pixels, int64_t pixel_stride, int64_t channel_stride) {
  if (pixels <= 0) return;
#ifdef INFILL_HAVE_OIIO
  if (const auto& p = processors(); p.to_linear) {
    apply_processor(*p.to_linear, data, pixels, pixel_stride, channel_stride);
    return;
  }
#endif
  apply_curve(data, pixels, pixel_stride, channel_stride, srgb_decode);
}

std::string colour_transfer_description() {
#ifdef INFILL_HAVE_OIIO
  return processors().description;
#else
  return "the sRGB curve (IEC 61966-2-1)";
#endif
}

}  // namespace infill
