#pragma once
// Images of random samples for pipeline tests.
#include <cstdint>
#include <random>

#include <c10/util/Half.h>

#include "pipeline/image_io.h"

namespace infill::test {

/// u8 / u16 samples over their full range, f32 and f16 uniform in [f32_low, f32_high)
/// (HDR-like; f16 rounded to half).
inline PixelImage random_image(int width, int height, int channels, PixelFormat format, uint32_t seed,
                               float f32_low = -0.5f, float f32_high = 2.0f) {
  PixelImage image = PixelImage::allocate(width, height, channels, format);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> real(f32_low, f32_high);
  const size_t n = static_cast<size_t>(width) * height * channels;
  for (size_t i = 0; i < n; ++i) {
    switch (format) {
      case PixelFormat::kU8: reinterpret_cast<uint8_t*>(image.data.data())[i] = rng() & 0xff; break;
      case PixelFormat::kU16: reinterpret_cast<uint16_t*>(image.data.data())[i] = rng() & 0xffff; break;
      case PixelFormat::kF32: reinterpret_cast<float*>(image.data.data())[i] = real(rng); break;
      case PixelFormat::kF16: reinterpret_cast<uint16_t*>(image.data.data())[i] = c10::Half(real(rng)).x; break;
    }
  }
  return image;
}

}  // namespace infill::test
