// Bit depth and colour through the engine's image files: every sample type a template can
// have comes back from encode_image in its own depth, ICC profiles pass through, and
// scene-linear (OpenEXR) pixels reach the model through the sRGB view transform. Files are
// read back by OpenImageIO's readers (decode_image); the transfer curves are checked against
// IEC 61966-2-1's formulas written out here.
#include "support/catch.h"
#include "support/command_output.h"
#include "support/random_image.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/Half.h>

#include "pipeline/image_io.h"
#include "support/temp_dir.h"

using namespace infill;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kNoLimit = int64_t{1} << 40;

// A real ICC profile from a Debian package (libgs-common, installed by scripts/setup.sh).
const char* kIccProfile = "/usr/share/color/icc/ghostscript/srgb.icc";

double linear_to_srgb(double v) { return v <= 0.0031308 ? 12.92 * v : 1.055 * std::pow(v, 1 / 2.4) - 0.055; }
double srgb_to_linear(double v) { return v <= 0.04045 ? v / 12.92 : std::pow((v + 0.055) / 1.055, 2.4); }

PixelImage with_file_format(PixelImage image, const char* file_format, bool scene_linear = false) {
  image.file_format = file_format;
  image.scene_linear = scene_linear;
  return image;
}

PixelImage decoded(const Result<std::vector<std::byte>>& file, const char* what) {
  INFO(what);
  REQUIRE(file.ok());
  auto image = decode_image(*file, what, kNoLimit);
  REQUIRE(image.ok());
  return std::move(*image);
}

}  // namespace

TEST_CASE("encode_image keeps every depth a format can hold, bit for bit", "[image_io][depth]") {
  struct Case {
    ImageFileFormat file;
    PixelFormat format;
    int channels;
  };
  const Case cases[] = {
      {ImageFileFormat::kPng, PixelFormat::kU8, 3},   {ImageFileFormat::kPng, PixelFormat::kU16, 4},
      {ImageFileFormat::kPng, PixelFormat::kU16, 1},  {ImageFileFormat::kTiff, PixelFormat::kU8, 4},
      {ImageFileFormat::kTiff, PixelFormat::kU16, 3}, {ImageFileFormat::kTiff, PixelFormat::kF16, 3},
      {ImageFileFormat::kTiff, PixelFormat::kF32, 4}, {ImageFileFormat::kExr, PixelFormat::kF16, 3},
      {ImageFileFormat::kExr, PixelFormat::kF16, 4},  {ImageFileFormat::kExr, PixelFormat::kF32, 3},
      {ImageFileFormat::kExr, PixelFormat::kF32, 1},
  };
  uint32_t seed = 0;
  for (const Case& c : cases) {
    INFO(image_file_format_name(c.file) << " " << pixel_format_name(c.format) << " x" << c.channels);
    const PixelImage image = test::random_image(17, 9, c.channels, c.format, ++seed, -0.5f, 30.0f);
    auto file = encode_image(image, c.file);
    REQUIRE(file.ok());
    CHECK(sniff_image_file_format(*file) == c.file);
    const PixelImage back = decoded(file, "encoded");
    CHECK(back.channels == c.channels);
    if (c.file == ImageFileFormat::kTiff && c.format == PixelFormat::kF16) {
      // TIFF gets half as float: every value exactly.
      REQUIRE(back.format == PixelFormat::kF32);
      const auto* h = reinterpret_cast<const uint16_t*>(image.data.data());
      const auto* f = reinterpret_cast<const float*>(back.data.data());
      int64_t differ = 0;
      for (size_t i = 0; i < image.data.size() / 2; ++i) differ += f[i] != static_cast<float>(c10::Half(h[i], c10::Half::from_bits()));
      CHECK(differ == 0);
      continue;
    }
    CHECK(back.format == c.format);
    const bool same_bits = back.data == image.data;
    CHECK(same_bits);
  }
}

TEST_CASE("a half OpenEXR file decodes as f16, scene-linear, and names its format", "[image_io][depth]") {
  test::TempDir dir;
  const PixelImage image = test::random_image(8, 5, 3, PixelFormat::kF16, 4, 0.0f, 8.0f);
  REQUIRE(save_image(dir.file("plate.exr"), image).ok());
  auto loaded = load_image(dir.file("plate.exr"), kNoLimit);
  REQUIRE(loaded.ok());
  CHECK(loaded->format == PixelFormat::kF16);
  CHECK(loaded->file_format == "openexr");
  CHECK(loaded->scene_linear);
  CHECK(native_file_format(*loaded) == ImageFileFormat::kExr);
  const bool same_bits = loaded->data == image.data;
  CHECK(same_bits);

  // 16-bit PNG and TIFF files are display-referred, whatever their depth.
  REQUIRE(save_image(dir.file("plate.tif"), test::random_image(4, 4, 3, PixelFormat::kU16, 5)).ok());
  auto tiff = load_image(dir.file("plate.tif"), kNoLimit);
  REQUIRE(tiff.ok());
  CHECK(tiff->file_format == "tiff");
  CHECK_FALSE(tiff->scene_linear);
  CHECK(native_file_format(*tiff) == ImageFileFormat::kTiff);
}

TEST_CASE("native_file_format: PNG, TIFF and OpenEXR stay, other formats go where nothing is lost", "[image_io][depth]") {
  const PixelImage u8 = test::random_image(2, 2, 3, PixelFormat::kU8, 1);
  const PixelImage f32 = test::random_image(2, 2, 3, PixelFormat::kF32, 2);
  CHECK(native_file_format(with_file_format(u8, "png")) == ImageFileFormat::kPng);
  CHECK(native_file_format(with_file_format(u8, "tiff")) == ImageFileFormat::kTiff);
  CHECK(native_file_format(with_file_format(f32, "openexr", true)) == ImageFileFormat::kExr);
  CHECK(native_file_format(with_file_format(u8, "jpeg")) == ImageFileFormat::kPng);      // not lossy again
  CHECK(native_file_format(with_file_format(f32, "hdr", true)) == ImageFileFormat::kExr);  // not cut to 16 bits
  CHECK(native_file_format(u8) == ImageFileFormat::kPng);
  CHECK(parse_image_file_format("tif") == ImageFileFormat::kTiff);
  CHECK_FALSE(parse_image_file_format("jpeg").has_value());
  CHECK(std::string(image_media_type(ImageFileFormat::kExr)) == "image/x-exr");
}

TEST_CASE("formats that cannot hold the depth convert: float into PNG through the view transform, integers into EXR as linear light",
          "[image_io][depth][colour]") {
  PixelImage linear = PixelImage::allocate(3, 1, 3, PixelFormat::kF32);
  const float values[9] = {0.18f, 0.5f, 1.0f, 4.0f, -1.0f, 0.0f, 0.0031308f, 0.01f, 0.8f};
  std::memcpy(linear.data.data(), values, sizeof values);
  linear.scene_linear = true;
  const PixelImage png = decoded(encode_image(linear, ImageFileFormat::kPng), "linear into png");
  REQUIRE(png.format == PixelFormat::kU16);
  const auto* s = reinterpret_cast<const uint16_t*>(png.data.data());
  for (int i = 0; i < 9; ++i) {
    INFO("linear " << values[i]);
    const double expected = std::clamp(linear_to_srgb(std::max(0.0f, values[i])), 0.0, 1.0) * 65535;
    CHECK(std::abs(s[i] - expected) <= 8);  // OCIO's curve within 1.2e-4
  }
  // Display-referred float (a float TIFF) goes into PNG without a transform.
  PixelImage display = linear;
  display.scene_linear = false;
  const PixelImage plain = decoded(encode_image(display, ImageFileFormat::kPng), "display float into png");
  CHECK(reinterpret_cast<const uint16_t*>(plain.data.data())[1] == 32768);  // round(0.5 * 65535)

  PixelImage u16 = PixelImage::allocate(2, 1, 4, PixelFormat::kU16);
  const uint16_t px[8] = {32768, 65535, 0, 1000, 13107, 52428, 6553, 65535};
  std::memcpy(u16.data.data(), px, sizeof px);
  const PixelImage exr = decoded(encode_image(u16, ImageFileFormat::kExr), "u16 into exr");
  REQUIRE(exr.format == PixelFormat::kF32);
  CHECK(exr.scene_linear);
  const auto* f = reinterpret_cast<const float*>(exr.data.data());
  for (int i = 0; i < 8; ++i) {
    INFO("sample " << i << " = " << px[i]);
    const double v = px[i] / 65535.0;
    const double expected = i % 4 == 3 ? v : srgb_to_linear(v);  // alpha is not a colour
    CHECK(std::abs(f[i] - expected) <= 2e-4);
  }
}

TEST_CASE("the model sees scene-linear pixels through the view transform, clamped to [0, 1]", "[image_io][colour]") {
  PixelImage hdr = PixelImage::allocate(4, 1, 3, PixelFormat::kF16);
  const float values[12] = {0.18f, 0.18f, 0.18f, 4.0f, 16.0f, 1.0f, -1.0f, 0.0f, 0.05f, 0.5f, 0.02f, 0.9f};
  auto* bits = reinterpret_cast<uint16_t*>(hdr.data.data());
  for (int i = 0; i < 12; ++i) bits[i] = c10::Half(values[i]).x;
  hdr.scene_linear = true;
  const at::Tensor rgb = to_rgb_tensor(hdr);  // [3, 1, 4]
  for (int p = 0; p < 4; ++p)
    for (int c = 0; c < 3; ++c) {
      const double stored = static_cast<float>(c10::Half(values[p * 3 + c]));
      const double expected = std::clamp(linear_to_srgb(std::max(0.0, stored)), 0.0, 1.0);
      INFO("pixel " << p << " channel " << c << " linear " << stored);
      CHECK(std::abs(rgb[c][0][p].item<float>() - expected) <= 2e-4);
    }
  // The same half values as display-referred data are shown as they are.
  hdr.scene_linear = false;
  CHECK(std::abs(to_rgb_tensor(hdr)[0][0][0].item<float>() - static_cast<float>(c10::Half(0.18f))) < 1e-7);
}

TEST_CASE("ICC profiles pass through PNG and TIFF results byte for byte", "[image_io][depth][icc]") {
  test::require_package_file_or_skip(kIccProfile, "libgs-common");
  std::ifstream in(kIccProfile, std::ios::binary);
  const std::vector<char> chars((std::istreambuf_iterator<char>(in)), {});
  PixelImage image = test::random_image(6, 4, 3, PixelFormat::kU16, 8);
  image.icc_profile.resize(chars.size());
  std::memcpy(image.icc_profile.data(), chars.data(), chars.size());
  for (ImageFileFormat format : {ImageFileFormat::kPng, ImageFileFormat::kTiff}) {
    INFO(image_file_format_name(format));
    const PixelImage back = decoded(encode_image(image, format), "with icc");
    const bool same_profile = back.icc_profile == image.icc_profile;
    CHECK(same_profile);
    const bool same_bits = back.data == image.data;
    CHECK(same_bits);
  }
}
