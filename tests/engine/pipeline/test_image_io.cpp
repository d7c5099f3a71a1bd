#include "support/catch.h"
#include "support/shared_data.h"
#include "support/random_image.h"
#include "support/temp_dir.h"
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <thread>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "pipeline/image_io.h"

using infill::test::TempDir;

using namespace infill;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kNoLimit = int64_t{1} << 40;


PixelImage random_image(int width, int height, int channels, PixelFormat format, uint32_t seed) {
  return test::random_image(width, height, channels, format, seed, -1.0f, 4.0f);
}

std::vector<std::byte> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), {});
  std::vector<std::byte> bytes(chars.size());
  std::memcpy(bytes.data(), chars.data(), chars.size());
  return bytes;
}

void check_same(const PixelImage& a, const PixelImage& b) {
  CHECK(a.width == b.width);
  CHECK(a.height == b.height);
  CHECK(a.channels == b.channels);
  CHECK(a.format == b.format);
  const bool same_bytes = a.data == b.data;  // Catch cannot print std::byte vectors
  CHECK(same_bytes);
}

}  // namespace

TEST_CASE("save_image + load_image round-trip exactly", "[image_io]") {
  TempDir dir;
  struct Case {
    const char* ext;
    PixelFormat format;
    int channels;
  };
  const Case cases[] = {
      {"png", PixelFormat::kU8, 1},  {"png", PixelFormat::kU8, 2},  {"png", PixelFormat::kU8, 3},
      {"png", PixelFormat::kU8, 4},  {"png", PixelFormat::kU16, 3}, {"png", PixelFormat::kU16, 4},
      {"tif", PixelFormat::kU8, 3},  {"tif", PixelFormat::kU16, 4}, {"tif", PixelFormat::kF32, 3},
      {"exr", PixelFormat::kF32, 3}, {"exr", PixelFormat::kF32, 4}, {"exr", PixelFormat::kF32, 1},
  };
  int n = 0;
  for (const Case& c : cases) {
    INFO(c.ext << " " << pixel_format_name(c.format) << " x" << c.channels);
    const std::string path = dir.file("img" + std::to_string(n++) + "." + c.ext);
    const PixelImage image = random_image(13, 7, c.channels, c.format, n);
    REQUIRE(save_image(path, image).ok());
    auto loaded = load_image(path, kNoLimit);
    REQUIRE(loaded.ok());
    check_same(image, *loaded);
  }
  // Only the saved files remain: no temporaries left behind.
  CHECK(dir.entries() == std::size(cases));
}

TEST_CASE("save_image is atomic and fails cleanly", "[image_io]") {
  TempDir dir;
  const PixelImage image = random_image(4, 4, 3, PixelFormat::kU8, 1);
  SECTION("missing directory: not_found, nothing created") {
    const std::string path = dir.file("no_such_dir/out.png");
    const Status status = save_image(path, image);
    CHECK(status.code() == ErrorCode::kNotFound);
    CHECK(status.message().find("no_such_dir") != std::string::npos);
    CHECK_FALSE(fs::exists(path));
    CHECK(dir.entries() == 0);
  }
  SECTION("unknown extension: invalid_argument, nothing created") {
    const Status status = save_image(dir.file("out.notaformat"), image);
    CHECK(status.code() == ErrorCode::kInvalidArgument);
    CHECK(status.message().find("out.notaformat") != std::string::npos);
    CHECK(dir.entries() == 0);
  }
  SECTION("inconsistent image: invalid_argument, nothing created") {
    PixelImage broken = image;
    broken.data.pop_back();
    CHECK(save_image(dir.file("out.png"), broken).code() == ErrorCode::kInvalidArgument);
    CHECK(dir.entries() == 0);
  }
  SECTION("overwriting replaces the file whole") {
    const std::string path = dir.file("out.png");
    REQUIRE(save_image(path, image).ok());
    const PixelImage second = random_image(6, 5, 4, PixelFormat::kU16, 2);
    REQUIRE(save_image(path, second).ok());
    auto loaded = load_image(path, kNoLimit);
    REQUIRE(loaded.ok());
    check_same(second, *loaded);
    CHECK(dir.entries() == 1);
  }
}

TEST_CASE("load_image errors name the file and the limit", "[image_io]") {
  TempDir dir;
  auto missing = load_image(dir.file("missing.png"), kNoLimit);
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().code() == ErrorCode::kNotFound);
  CHECK(missing.status().message().find("missing.png") != std::string::npos);

  const std::string path = dir.file("big.png");
  REQUIRE(save_image(path, random_image(16, 16, 3, PixelFormat::kU8, 3)).ok());
  auto too_big = load_image(path, 255);
  REQUIRE_FALSE(too_big.ok());
  CHECK(too_big.status().code() == ErrorCode::kOutOfRange);
  CHECK(too_big.status().message().find("256") != std::string::npos);
  CHECK(too_big.status().message().find("255") != std::string::npos);
  CHECK(load_image(path, 256).ok());

  // A PNG cut after its header: opens, then fails while decoding.
  std::vector<std::byte> bytes = read_bytes(path);
  bytes.resize(bytes.size() / 2);
  const std::string cut = dir.file("cut.png");
  std::ofstream(cut, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  auto truncated = load_image(cut, kNoLimit);
  REQUIRE_FALSE(truncated.ok());
  CHECK(truncated.status().code() == ErrorCode::kCorruptData);
  CHECK(truncated.status().message().find("cut.png") != std::string::npos);
}

TEST_CASE("decode_image reads uploads from memory", "[image_io]") {
  const PixelImage image = random_image(9, 11, 4, PixelFormat::kU16, 4);
  auto png = encode_png(image);
  REQUIRE(png.ok());
  CHECK(png->size() > 8);
  auto decoded = decode_image(*png, "upload", kNoLimit);
  REQUIRE(decoded.ok());
  check_same(image, *decoded);

  SECTION("max_pixels is enforced from the header") {
    auto limited = decode_image(*png, "upload.png", 98);
    REQUIRE_FALSE(limited.ok());
    CHECK(limited.status().code() == ErrorCode::kOutOfRange);
    CHECK(limited.status().message().find("99") != std::string::npos);
  }
  SECTION("corrupt PNG bytes are an error naming the upload") {
    std::vector<std::byte> cut(png->begin(), png->begin() + png->size() / 2);
    auto truncated = decode_image(cut, "broken.png", kNoLimit);
    REQUIRE_FALSE(truncated.ok());
    CHECK(truncated.status().code() == ErrorCode::kCorruptData);
    CHECK(truncated.status().message().find("broken.png") != std::string::npos);

    std::vector<std::byte> junk(200, std::byte{0x5a});
    auto garbage = decode_image(junk, "junk.png", kNoLimit);
    REQUIRE_FALSE(garbage.ok());
    CHECK(garbage.status().code() == ErrorCode::kCorruptData);
    CHECK(garbage.status().message().find("junk.png") != std::string::npos);
    CHECK_FALSE(decode_image({}, "empty.png", kNoLimit).ok());
  }
  SECTION("formats without in-memory readers go through a temporary file") {
    TempDir dir;
    const PixelImage rgb = random_image(5, 3, 3, PixelFormat::kU8, 5);
    const std::string path = dir.file("img.sgi");
    REQUIRE(save_image(path, rgb).ok());
    auto sgi = decode_image(read_bytes(path), "img.sgi", kNoLimit);
    REQUIRE(sgi.ok());
    check_same(rgb, *sgi);
  }
  SECTION("u8 and f32 PNG encoding") {
    const PixelImage u8 = random_image(3, 2, 3, PixelFormat::kU8, 6);
    auto u8_png = encode_png(u8);
    REQUIRE(u8_png.ok());
    auto u8_back = decode_image(*u8_png, "u8", kNoLimit);
    REQUIRE(u8_back.ok());
    check_same(u8, *u8_back);

    // Every compression level decodes to the same pixels; level 0 stores them uncompressed.
    const PixelImage smooth = PixelImage::allocate(64, 64, 3, PixelFormat::kU8);
    auto stored = encode_png(smooth, 0);
    auto smallest = encode_png(smooth, 9);
    REQUIRE(stored.ok());
    REQUIRE(smallest.ok());
    CHECK(stored->size() > 64 * 64 * 3);
    CHECK(smallest->size() < stored->size());
    auto back = decode_image(*smallest, "level9.png", kNoLimit);
    REQUIRE(back.ok());
    check_same(smooth, *back);

    PixelImage f32 = PixelImage::allocate(2, 1, 1, PixelFormat::kF32);
    const float values[2] = {-3.0f, 0.5f};
    std::memcpy(f32.data.data(), values, sizeof(values));
    auto f32_png = encode_png(f32);
    REQUIRE(f32_png.ok());
    auto f32_back = decode_image(*f32_png, "f32", kNoLimit);
    REQUIRE(f32_back.ok());
    CHECK(f32_back->format == PixelFormat::kU16);
    const auto* s = reinterpret_cast<const uint16_t*>(f32_back->data.data());
    CHECK(s[0] == 0);
    CHECK(s[1] == 32768);  // round(0.5 * 65535)
  }
}

TEST_CASE("to_rgb_tensor normalises, replicates grey and drops alpha", "[image_io]") {
  PixelImage grey_alpha = PixelImage::allocate(2, 1, 2, PixelFormat::kU8);
  const uint8_t ga[4] = {51, 7, 255, 9};
  std::memcpy(grey_alpha.data.data(), ga, 4);
  const at::Tensor g = to_rgb_tensor(grey_alpha);
  REQUIRE(g.sizes() == at::IntArrayRef({3, 1, 2}));
  CHECK(at::allclose(g, at::tensor({0.2f, 1.0f}).reshape({1, 1, 2}).expand({3, 1, 2}), 0, 1e-7));

  PixelImage rgba16 = PixelImage::allocate(1, 1, 4, PixelFormat::kU16);
  const uint16_t px[4] = {0, 65535, 13107, 1};
  std::memcpy(rgba16.data.data(), px, sizeof(px));
  const at::Tensor c = to_rgb_tensor(rgba16);
  REQUIRE(c.sizes() == at::IntArrayRef({3, 1, 1}));
  CHECK(at::allclose(c.reshape({3}), at::tensor({0.0f, 1.0f, 0.2f}), 0, 1e-7));

  PixelImage hdr = PixelImage::allocate(3, 1, 1, PixelFormat::kF32);
  const float f[3] = {-1.0f, 0.25f, 9.0f};
  std::memcpy(hdr.data.data(), f, sizeof(f));
  CHECK(at::equal(to_rgb_tensor(hdr)[1], at::tensor({0.0f, 0.25f, 1.0f}).reshape({1, 3})));
}

TEST_CASE("the shared astronaut test image loads as 512x512", "[image_io]") {
  const std::string path = infill::test::shared_path("testdata/astronaut.png");
  infill::test::require_shared_or_skip({path});
  auto image = load_image(path, kNoLimit);
  REQUIRE(image.ok());
  CHECK(image->width == 512);
  CHECK(image->height == 512);
  CHECK(image->channels >= 3);
  CHECK(image->format == PixelFormat::kU8);
  const at::Tensor rgb = to_rgb_tensor(*image);
  CHECK(rgb.sizes() == at::IntArrayRef({3, 512, 512}));
  CHECK(rgb.min().item<float>() >= 0.0f);
  CHECK(rgb.max().item<float>() <= 1.0f);
  // The same bytes decode to the same pixels from memory.
  auto decoded = decode_image(read_bytes(path), "astronaut.png", kNoLimit);
  REQUIRE(decoded.ok());
  const bool same_bytes = decoded->data == image->data;
  CHECK(same_bytes);
}

TEST_CASE("decode_image and encode_png are safe from many threads at once", "[image_io][threads]") {
  // Clients decode results on many threads; each image must decode the same as alone.
  std::vector<PixelImage> images;
  std::vector<std::vector<std::byte>> pngs;
  for (uint32_t i = 0; i < 4; ++i) {
    images.push_back(random_image(64, 48, 3, PixelFormat::kU8, 100 + i));
    auto png = encode_png(images.back());
    REQUIRE(png.ok());
    pngs.push_back(std::move(*png));
  }
  std::atomic<int> failures{0}, mismatches{0};
  std::string first_error;
  std::mutex mu;
  std::vector<std::thread> threads;
  for (int t = 0; t < 32; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 40; ++i) {
        const size_t which = size_t(t + i) % pngs.size();
        // Names without an extension make the reader probe every format.
        auto decoded = decode_image(pngs[which], i % 2 ? "result" : "result.png", kNoLimit);
        auto encoded = encode_png(images[which]);
        if (!decoded.ok() || !encoded.ok()) {
          std::lock_guard lock(mu);
          if (first_error.empty()) first_error = decoded.ok() ? encoded.status().message() : decoded.status().message();
          ++failures;
          continue;
        }
        if (decoded->data != images[which].data) ++mismatches;
      }
    });
  }
  for (auto& th : threads) th.join();
  INFO(first_error);
  CHECK(failures == 0);
  CHECK(mismatches == 0);
}
