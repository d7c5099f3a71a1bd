#pragma once
// The product's promise checked byte for byte: pixels outside the mask are the template's.
#include <cstddef>
#include <cstring>

#include <ATen/ATen.h>

#include "pipeline/image_io.h"

namespace infill::test {

/// Whether every pixel where `mask` ([H, W] float) is 0 has the same bytes in both images.
inline bool outside_identical(const PixelImage& a, const PixelImage& b, const at::Tensor& mask) {
  const at::Tensor m = mask.to(at::kFloat).contiguous();
  const float* keep = m.data_ptr<float>();
  const size_t bpp = static_cast<size_t>(a.channels) * bytes_per_sample(a.format);
  for (int y = 0; y < a.height; ++y) {
    for (int x = 0; x < a.width; ++x) {
      if (keep[static_cast<size_t>(y) * a.width + x] != 0.0f) continue;
      const size_t at = (static_cast<size_t>(y) * a.width + x) * bpp;
      if (std::memcmp(a.data.data() + at, b.data.data() + at, bpp) != 0) return false;
    }
  }
  return true;
}

}  // namespace infill::test
