#include "support/catch.h"
#include "support/random_image.h"
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/Half.h>

#include "pipeline/composite.h"

using namespace infill;

namespace {

using test::random_image;

// Sample (pixel, channel) as a double in the [0, 1] convention of its format.
double sample(const PixelImage& image, int64_t pixel, int c) {
  const int64_t i = pixel * image.channels + c;
  switch (image.format) {
    case PixelFormat::kU8:
      return reinterpret_cast<const uint8_t*>(image.data.data())[i] / 255.0;
    case PixelFormat::kU16:
      return reinterpret_cast<const uint16_t*>(image.data.data())[i] / 65535.0;
    case PixelFormat::kF32:
      return reinterpret_cast<const float*>(image.data.data())[i];
    case PixelFormat::kF16:
      return static_cast<float>(
          c10::Half(reinterpret_cast<const uint16_t*>(image.data.data())[i], c10::Half::from_bits()));
  }
  return 0;
}

bool same_pixel_bytes(const PixelImage& a, const PixelImage& b, int64_t pixel) {
  const size_t px = a.channels * bytes_per_sample(a.format);
  return std::memcmp(a.data.data() + pixel * px, b.data.data() + pixel * px, px) == 0;
}

// Quantisation step of a format in [0, 1] units (0 for float; half: its step at 2, the
// largest value random_image makes).
double quantum(PixelFormat format) {
  switch (format) {
    case PixelFormat::kU8: return 1.0 / 255;
    case PixelFormat::kU16: return 1.0 / 65535;
    case PixelFormat::kF16: return 2.0 / 1024;
    case PixelFormat::kF32: return 0.0;
  }
  return 0.0;
}

bool is_float(PixelFormat format) { return format == PixelFormat::kF32 || format == PixelFormat::kF16; }

// IEC 61966-2-1's decoding curve: the independent reference for display_to_linear.
double srgb_to_linear(double v) { return v <= 0.04045 ? v / 12.92 : std::pow((v + 0.055) / 1.055, 2.4); }

}  // namespace

TEST_CASE("composite keeps alpha-0 pixels bit-identical and blends the rest", "[composite]") {
  const int w = 23;
  const int h = 17;
  at::manual_seed(11);
  const at::Tensor generated = at::rand({3, h, w});
  // About half exact zeros, some exact ones, the rest grey.
  at::Tensor alpha = at::rand({h, w});
  alpha = at::where(alpha < 0.5, at::zeros_like(alpha),
                    at::where(alpha > 0.9, at::ones_like(alpha), alpha));
  auto a = alpha.accessor<float, 2>();
  auto g = generated.accessor<float, 3>();

  for (PixelFormat format : {PixelFormat::kU8, PixelFormat::kU16, PixelFormat::kF32, PixelFormat::kF16}) {
    for (int channels : {1, 2, 3, 4}) {
      INFO("format " << pixel_format_name(format) << " channels " << channels);
      const PixelImage original = random_image(w, h, channels, format, 100 + channels);
      const PixelImage out = composite(original, generated, alpha);
      REQUIRE(out.width == w);
      REQUIRE(out.height == h);
      REQUIRE(out.channels == channels);
      REQUIRE(out.format == format);
      REQUIRE(out.data.size() == original.data.size());
      const int colour = channels >= 3 ? 3 : 1;
      int64_t zero_pixels = 0;
      int64_t bad_kept = 0;
      int64_t bad_alpha_channel = 0;
      double worst = 0;
      for (int y = 0; y < h; ++y) {
        for (int x = 0; x < w; ++x) {
          const int64_t p = static_cast<int64_t>(y) * w + x;
          if (a[y][x] == 0.0f) {
            ++zero_pixels;
            bad_kept += !same_pixel_bytes(original, out, p);
            continue;
          }
          if (channels == 2 || channels == 4) {
            bad_alpha_channel += sample(out, p, channels - 1) != sample(original, p, channels - 1);
          }
          for (int c = 0; c < colour; ++c) {
            const double gen =
                colour == 3 ? g[c][y][x] : (double(g[0][y][x]) + g[1][y][x] + g[2][y][x]) / 3.0;
            const double expected = sample(original, p, c) * (1.0 - a[y][x]) + gen * a[y][x];
            const double clamped = is_float(format) ? expected : std::clamp(expected, 0.0, 1.0);
            worst = std::max(worst, std::abs(sample(out, p, c) - clamped));
          }
        }
      }
      CHECK(zero_pixels > 0);
      CHECK(bad_kept == 0);
      CHECK(bad_alpha_channel == 0);
      // Rounding to nearest: at most half a quantum, plus float arithmetic.
      CHECK(worst <= quantum(format) / 2 + 1e-6);
    }
  }
}

TEST_CASE("composite into scene-linear half pixels: generated sRGB becomes linear light, the rest keeps its bits", "[composite]") {
  const int w = 9, h = 6;
  at::manual_seed(3);
  const at::Tensor generated = at::rand({3, h, w});
  at::Tensor alpha = at::zeros({h, w});
  alpha.narrow(0, 2, 3).narrow(1, 3, 4).fill_(1.0f);
  PixelImage original = random_image(w, h, 4, PixelFormat::kF16, 9, -0.25f, 40.0f);  // HDR highlights
  original.scene_linear = true;
  original.file_format = "openexr";
  // Values no arithmetic would keep: infinity and a NaN with a payload, outside the mask.
  auto* bits = reinterpret_cast<uint16_t*>(original.data.data());
  bits[0] = 0x7C00;  // +inf
  bits[1] = 0x7E01;  // NaN
  const PixelImage out = composite(original, generated, alpha);
  REQUIRE(out.format == PixelFormat::kF16);
  CHECK(out.scene_linear);
  auto g = generated.accessor<float, 3>();
  double worst = 0;
  int64_t kept_bad = 0;
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      const int64_t p = int64_t{y} * w + x;
      if (alpha[y][x].item<float>() == 0.0f) {
        kept_bad += !same_pixel_bytes(original, out, p);
        continue;
      }
      for (int c = 0; c < 3; ++c) {
        // Relative to the value: half keeps 11 significant bits; OCIO's curve within 1e-4.
        const double expected = srgb_to_linear(g[c][y][x]);
        worst = std::max(worst, std::abs(sample(out, p, c) - expected) / std::max(expected, 1e-2));
      }
      CHECK(sample(out, p, 3) == sample(original, p, 3));  // alpha is not a colour
    }
  CHECK(kept_bad == 0);
  CHECK(worst <= 2e-3);
}

TEST_CASE("composite with alpha 1 gives the generated values", "[composite]") {
  at::manual_seed(5);
  const at::Tensor generated = at::rand({3, 4, 5});
  const at::Tensor ones = at::ones({4, 5});
  auto g = generated.accessor<float, 3>();
  const PixelImage u8 = composite(random_image(5, 4, 3, PixelFormat::kU8, 1), generated, ones);
  const PixelImage u16 = composite(random_image(5, 4, 4, PixelFormat::kU16, 2), generated, ones);
  const PixelImage f32 = composite(random_image(5, 4, 3, PixelFormat::kF32, 3), generated, ones);
  for (int y = 0; y < 4; ++y) {
    for (int x = 0; x < 5; ++x) {
      const int64_t p = y * 5 + x;
      for (int c = 0; c < 3; ++c) {
        CHECK(reinterpret_cast<const uint8_t*>(u8.data.data())[p * 3 + c] ==
              std::lround(g[c][y][x] * 255.0));
        CHECK(reinterpret_cast<const uint16_t*>(u16.data.data())[p * 4 + c] ==
              std::lround(g[c][y][x] * 65535.0));
        CHECK(reinterpret_cast<const float*>(f32.data.data())[p * 3 + c] == g[c][y][x]);
      }
    }
  }
}

TEST_CASE("composite of a region equals the full composite with zero alpha outside",
          "[composite]") {
  at::manual_seed(9);
  const PixelImage original = random_image(32, 24, 4, PixelFormat::kU8, 77);
  const PixelRect rect{8, 4, 16, 12};
  const at::Tensor gen_crop = at::rand({3, rect.height, rect.width});
  const at::Tensor alpha_crop = at::rand({rect.height, rect.width});
  at::Tensor gen_full = at::rand({3, 24, 32});
  at::Tensor alpha_full = at::zeros({24, 32});
  gen_full.narrow(1, rect.y, rect.height).narrow(2, rect.x, rect.width).copy_(gen_crop);
  alpha_full.narrow(0, rect.y, rect.height).narrow(1, rect.x, rect.width).copy_(alpha_crop);
  const PixelImage a = composite(original, gen_crop, alpha_crop, rect);
  const PixelImage b = composite(original, gen_full, alpha_full);
  // Compared as booleans: Catch cannot print std::byte vectors.
  const bool same_as_full = a.data == b.data;
  const bool changed = a.data != original.data;
  CHECK(same_as_full);
  CHECK(changed);
}

TEST_CASE("composite input checks name the mismatch", "[composite]") {
  const PixelImage original = PixelImage::allocate(8, 6, 3, PixelFormat::kU8);
  CHECK(check_composite_inputs(original, at::zeros({3, 6, 8}), at::zeros({6, 8})).ok());
  const Status bad_rgb = check_composite_inputs(original, at::zeros({3, 6, 7}), at::zeros({6, 8}));
  CHECK(bad_rgb.code() == ErrorCode::kInvalidArgument);
  CHECK(bad_rgb.message().find("[3, 6, 7]") != std::string::npos);
  CHECK_FALSE(check_composite_inputs(original, at::zeros({3, 6, 8}), at::zeros({5, 8})).ok());
  CHECK_FALSE(check_composite_inputs(original, at::zeros({3, 4, 4}), at::zeros({4, 4}),
                                     PixelRect{6, 0, 4, 4})
                  .ok());
  CHECK_THROWS_AS(composite(original, at::zeros({3, 6, 7}), at::zeros({6, 8})),
                  std::invalid_argument);
}

TEST_CASE("pad_to_multiple replicates the edge and crop undoes it", "[composite]") {
  const at::Tensor image = at::rand({3, 5, 7});
  const at::Tensor padded = pad_to_multiple(image, 4);
  REQUIRE(padded.sizes() == at::IntArrayRef({3, 8, 8}));
  CHECK(at::equal(padded.narrow(1, 0, 5).narrow(2, 0, 7), image));
  // Right columns repeat column 6, bottom rows repeat row 4 (already padded on the right).
  CHECK(at::equal(padded.select(2, 7).narrow(1, 0, 5), image.select(2, 6)));
  CHECK(at::equal(padded.select(1, 7), padded.select(1, 4)));
  CHECK(at::equal(padded.select(1, 6).narrow(1, 0, 7), image.select(1, 4)));
  CHECK(padded[1][7][7].item<float>() == image[1][4][6].item<float>());
  CHECK(at::equal(crop(padded, 7, 5), image));
  CHECK(pad_to_multiple(image, 1).is_same(image));
  const at::Tensor even = at::rand({3, 16, 32});
  CHECK(pad_to_multiple(even, 16).is_same(even));
  CHECK(pad_to_multiple(at::rand({9, 10}), 8).sizes() == at::IntArrayRef({16, 16}));
  CHECK_THROWS(crop(image, 8, 5));
}
