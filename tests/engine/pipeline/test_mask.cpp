#include "support/catch.h"
#include "support/temp_dir.h"
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "pipeline/image_io.h"
#include "pipeline/mask.h"

using infill::test::TempDir;

using namespace infill;

namespace {


PixelImage u8_image(int width, int height, int channels, const std::vector<uint8_t>& samples) {
  PixelImage image = PixelImage::allocate(width, height, channels, PixelFormat::kU8);
  REQUIRE(samples.size() == image.data.size());
  std::memcpy(image.data.data(), samples.data(), samples.size());
  return image;
}

// Reference token selection by brute force: token (r, c) is selected if some masked token
// lies within Chebyshev distance `halo`.
std::vector<int64_t> reference_tokens(const at::Tensor& latent, int patch, int halo) {
  const int64_t h = latent.size(0);
  const int64_t w = latent.size(1);
  const int64_t gh = (h + patch - 1) / patch;
  const int64_t gw = (w + patch - 1) / patch;
  auto acc = latent.accessor<float, 2>();
  std::vector<char> base(gh * gw, 0);
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x)
      if (acc[y][x] > 0) base[(y / patch) * gw + x / patch] = 1;
  std::vector<int64_t> out;
  for (int64_t r = 0; r < gh; ++r) {
    for (int64_t c = 0; c < gw; ++c) {
      bool hit = false;
      for (int64_t r2 = 0; r2 < gh && !hit; ++r2)
        for (int64_t c2 = 0; c2 < gw && !hit; ++c2)
          hit = base[r2 * gw + c2] && std::max(std::abs(r2 - r), std::abs(c2 - c)) <= halo;
      if (hit) out.push_back(r * gw + c);
    }
  }
  return out;
}

std::vector<int64_t> to_vector(const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

}  // namespace

TEST_CASE("load_mask reads grey, RGB and RGBA files as [H, W] in [0, 1]", "[mask]") {
  TempDir dir;
  SECTION("grey u8: the channel / 255") {
    const std::string path = dir.file("grey.png");
    REQUIRE(save_image(path, u8_image(3, 2, 1, {0, 255, 128, 1, 0, 64})).ok());
    auto mask = load_mask(path, 3, 2);
    REQUIRE(mask.ok());
    CHECK(mask->sizes() == at::IntArrayRef({2, 3}));
    CHECK(mask->scalar_type() == at::kFloat);
    const at::Tensor expected =
        at::tensor({0.f, 255.f, 128.f, 1.f, 0.f, 64.f}).reshape({2, 3}) / 255.0f;
    CHECK(at::allclose(*mask, expected, 0, 1e-6));
  }
  SECTION("RGBA u8: the mean of RGB, alpha ignored") {
    const std::string path = dir.file("rgba.png");
    REQUIRE(save_image(path, u8_image(2, 1, 4, {255, 0, 0, 255, 30, 60, 90, 0})).ok());
    auto mask = load_mask(path, 2, 1);
    REQUIRE(mask.ok());
    CHECK((*mask)[0][0].item<float>() == Approx(1.0 / 3.0).margin(1e-6));
    CHECK((*mask)[0][1].item<float>() == Approx(60.0 / 255.0).margin(1e-6));
  }
  SECTION("float EXR: clamped to [0, 1]") {
    const std::string path = dir.file("float.exr");
    PixelImage image = PixelImage::allocate(3, 1, 1, PixelFormat::kF32);
    const float values[3] = {-0.5f, 0.25f, 7.0f};
    std::memcpy(image.data.data(), values, sizeof(values));
    REQUIRE(save_image(path, image).ok());
    auto mask = load_mask(path, 3, 1);
    REQUIRE(mask.ok());
    CHECK(at::allclose(*mask, at::tensor({0.f, 0.25f, 1.f}).reshape({1, 3}), 0, 1e-6));
  }
}

TEST_CASE("load_mask reports size mismatches and unreadable files", "[mask]") {
  TempDir dir;
  const std::string path = dir.file("m.png");
  REQUIRE(save_image(path, PixelImage::allocate(511, 512, 1, PixelFormat::kU8)).ok());
  auto wrong = load_mask(path, 512, 512);
  REQUIRE_FALSE(wrong.ok());
  CHECK(wrong.status().code() == ErrorCode::kInvalidArgument);
  CHECK(wrong.status().message() == "mask " + path + " is 511x512, template is 512x512");

  auto missing = load_mask(dir.file("nope.png"), 4, 4);
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().code() == ErrorCode::kNotFound);
  CHECK(missing.status().message().find("nope.png") != std::string::npos);

  const std::string junk = dir.file("junk.png");
  std::ofstream(junk) << "this is not a png file at all";
  auto corrupt = load_mask(junk, 4, 4);
  REQUIRE_FALSE(corrupt.ok());
  CHECK(corrupt.status().code() == ErrorCode::kCorruptData);
  CHECK(corrupt.status().message().find("junk.png") != std::string::npos);
}

TEST_CASE("latent_mask marks every block with a positive pixel", "[mask]") {
  at::Tensor pixel = at::zeros({17, 16});
  pixel[16][0] = 0.01f;  // in the padded last block row
  pixel[9][15] = 1.0f;
  const at::Tensor latent = latent_mask(pixel, 8);
  REQUIRE(latent.sizes() == at::IntArrayRef({3, 2}));
  CHECK(latent.scalar_type() == at::kFloat);
  const at::Tensor expected = at::tensor({0.f, 0.f, 0.f, 1.f, 1.f, 0.f}).reshape({3, 2});
  CHECK(at::equal(latent, expected));
  CHECK(at::equal(latent_mask(at::zeros({8, 8}), 8), at::zeros({1, 1})));
  CHECK(at::equal(latent_mask(at::ones({16, 24}), 8), at::ones({2, 3})));
}

TEST_CASE("masked_tokens selects patches, adds a Chebyshev halo and clamps to the grid", "[mask]") {
  SECTION("one latent pixel, no halo") {
    at::Tensor latent = at::zeros({8, 8});
    latent[3][5] = 1.0f;  // token (1, 2) of a 4x4 grid
    const TokenSet set = masked_tokens(latent, 2, 0);
    CHECK(set.grid_w == 4);
    CHECK(set.grid_h == 4);
    CHECK(to_vector(set.indices) == std::vector<int64_t>{6});
    CHECK(set.count() == 1);
    CHECK(set.ratio() == Approx(1.0 / 16.0));
    const at::Tensor tm = set.token_mask();
    CHECK(tm.scalar_type() == at::kBool);
    CHECK(tm.numel() == 16);
    CHECK(tm.sum().item<int64_t>() == 1);
    CHECK(tm[6].item<bool>());
  }
  SECTION("halo 1 around an interior token is a 3x3 square") {
    at::Tensor latent = at::zeros({8, 8});
    latent[3][5] = 1.0f;
    const TokenSet set = masked_tokens(latent, 2, 1);
    CHECK(to_vector(set.indices) == std::vector<int64_t>{1, 2, 3, 5, 6, 7, 9, 10, 11});
  }
  SECTION("halo at a corner is clamped to the grid") {
    at::Tensor latent = at::zeros({8, 8});
    latent[0][0] = 1.0f;
    CHECK(to_vector(masked_tokens(latent, 2, 1).indices) == std::vector<int64_t>{0, 1, 4, 5});
    CHECK(masked_tokens(latent, 2, 100).count() == 16);
    CHECK(masked_tokens(latent, 2, 100).ratio() == 1.0);
  }
  SECTION("latent size not a multiple of the patch") {
    at::Tensor latent = at::zeros({5, 5});
    latent[4][4] = 1.0f;
    const TokenSet set = masked_tokens(latent, 2, 0);
    CHECK(set.grid_w == 3);
    CHECK(set.grid_h == 3);
    CHECK(to_vector(set.indices) == std::vector<int64_t>{8});
  }
  SECTION("empty mask") {
    const TokenSet set = masked_tokens(at::zeros({8, 8}), 2, 2);
    CHECK(set.count() == 0);
    CHECK(set.ratio() == 0.0);
    CHECK(set.token_mask().sum().item<int64_t>() == 0);
  }
  SECTION("random masks against a brute-force reference") {
    at::manual_seed(7);
    for (int trial = 0; trial < 20; ++trial) {
      const at::Tensor latent = (at::rand({13, 11}) > 0.93).to(at::kFloat);
      for (int halo : {0, 1, 2}) {
        INFO("trial " << trial << " halo " << halo);
        CHECK(to_vector(masked_tokens(latent, 2, halo).indices) ==
              reference_tokens(latent, 2, halo));
      }
    }
  }
}

TEST_CASE("feather ramps inward and is exactly zero outside the mask", "[mask]") {
  SECTION("matches a brute-force Euclidean distance reference") {
    at::manual_seed(3);
    at::Tensor mask = (at::rand({21, 17}) > 0.3).to(at::kFloat) * at::rand({21, 17}).clamp_min(0.2);
    mask[0][0] = 0.0f;
    const float radius = 3.5f;
    const at::Tensor alpha = feather(mask, radius);
    REQUIRE(alpha.sizes() == mask.sizes());
    auto m = mask.accessor<float, 2>();
    auto a = alpha.accessor<float, 2>();
    double worst = 0;
    for (int y = 0; y < 21; ++y) {
      for (int x = 0; x < 17; ++x) {
        if (m[y][x] == 0.0f) {
          CHECK(a[y][x] == 0.0f);
          continue;
        }
        double best = 1e30;
        for (int y2 = 0; y2 < 21; ++y2)
          for (int x2 = 0; x2 < 17; ++x2)
            if (m[y2][x2] == 0.0f)
              best = std::min(best, std::hypot(double(y - y2), double(x - x2)));
        const double expected = m[y][x] * std::min(1.0, best / radius);
        worst = std::max(worst, std::abs(expected - a[y][x]));
      }
    }
    CHECK(worst < 1e-6);
  }
  SECTION("a square mask: ramp 1/r at the edge, 1 inside, 0 outside") {
    at::Tensor mask = at::zeros({40, 40});
    mask.narrow(0, 10, 20).narrow(1, 10, 20).fill_(1.0f);
    const at::Tensor alpha = feather(mask, 4.0f);
    CHECK(alpha[10][20].item<float>() == Approx(0.25f));
    CHECK(alpha[11][20].item<float>() == Approx(0.5f));
    CHECK(alpha[20][20].item<float>() == 1.0f);
    CHECK(at::equal(alpha.masked_select(mask == 0), at::zeros({40 * 40 - 400})));
    CHECK(alpha.max().item<float>() <= 1.0f);
  }
  SECTION("radius 0 returns the mask; a full mask is unchanged") {
    const at::Tensor mask = at::rand({9, 7});
    CHECK(at::equal(feather(mask, 0.0f), mask));
    const at::Tensor full = at::full({9, 7}, 0.75f);
    CHECK(at::equal(feather(full, 5.0f), full));
    CHECK(at::equal(feather(at::zeros({4, 4}), 2.0f), at::zeros({4, 4})));
  }
}

TEST_CASE("feather_region equals feather on the region, also at the image border", "[mask]") {
  at::manual_seed(11);
  for (int trial = 0; trial < 20; ++trial) {
    const int h = 30 + trial, w = 41 - trial / 2;
    // Ragged masks inside a random box (touching the image border in some trials), with
    // holes, so that nearest kept pixels lie both inside the box and on its ring.
    const int bx = trial % 4 == 0 ? 0 : trial % 7, by = trial % 3 == 0 ? 0 : trial % 5;
    const int bw = w - bx - (trial % 2 ? 0 : trial % 6), bh = h - by - (trial % 5 ? 3 : 0);
    at::Tensor mask = at::zeros({h, w});
    mask.narrow(0, by, bh).narrow(1, bx, bw).copy_((at::rand({bh, bw}) > 0.15).to(at::kFloat));
    const PixelRect box = bounding_box(mask, 0, 1);
    const at::Tensor expected = feather(mask, 5.0f).narrow(0, box.y, box.height).narrow(1, box.x, box.width);
    const at::Tensor got = feather_region(mask, 5.0f, box);
    REQUIRE(got.sizes() == expected.sizes());
    CHECK(at::equal(got, expected));  // the same distances, so bit for bit
  }
  at::Tensor mask = at::zeros({20, 20});
  mask.narrow(0, 5, 6).narrow(1, 5, 6).fill_(1.0f);
  CHECK_THROWS_WITH(feather_region(mask, 3.0f, {6, 6, 4, 4}), Catch::Contains("outside the region"));
  CHECK_THROWS_WITH(feather_region(mask, 3.0f, {18, 0, 4, 4}), Catch::Contains("leaves the 20x20 mask"));
  CHECK_THROWS_WITH(feather_region(mask, 3.0f, {0, 0, 0, 4}), Catch::Contains("is empty"));
}

TEST_CASE("bounding_box grows, aligns and clamps", "[mask]") {
  at::Tensor mask = at::zeros({48, 64});
  mask[20][10] = 0.5f;
  CHECK(bounding_box(mask, 0, 1) == PixelRect{10, 20, 1, 1});
  // x: [7, 14) -> [0, 16); y: [17, 24) -> [16, 24).
  CHECK(bounding_box(mask, 3, 8) == PixelRect{0, 16, 16, 8});
  mask[30][40] = 1.0f;
  CHECK(bounding_box(mask, 0, 1) == PixelRect{10, 20, 31, 11});

  at::Tensor corner = at::zeros({48, 64});
  corner[47][63] = 1.0f;
  // x: [59, 68) -> [56, 72) -> clamped [56, 64); y: [43, 52) -> [40, 56) -> [40, 48).
  CHECK(bounding_box(corner, 4, 8) == PixelRect{56, 40, 8, 8});
  corner[0][0] = 1.0f;
  CHECK(bounding_box(corner, 4, 16) == PixelRect{0, 0, 64, 48});

  at::Tensor odd = at::zeros({10, 50});
  odd[5][49] = 1.0f;
  CHECK(bounding_box(odd, 0, 16) == PixelRect{48, 0, 2, 10});

  const PixelRect empty = bounding_box(at::zeros({10, 10}), 4, 8);
  CHECK(empty.width == 0);
  CHECK(empty.empty());
}
