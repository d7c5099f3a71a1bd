// The SDK's mask PNG: deflated (a painted mask is runs of 0 and 255), and decoded by the
// engine's own image reader (OpenImageIO's PNG plug-in) to exactly the pixels given.
#include "support/catch.h"

#include <cstring>
#include <vector>

#include "codec.h"
#include "pipeline/image_io.h"

using namespace infill;

TEST_CASE("sdk: a 4096x2048 mask is deflated to a few kB and decodes to the same pixels", "[sdk][mask]") {
  const uint32_t w = 4096, h = 2048;
  const size_t stride = w + 64;  // rows with padding, as a host's buffer may have
  std::vector<uint8_t> pixels(stride * h, 7);  // the padding must not leak into the PNG
  for (uint32_t y = 0; y < h; ++y)
    for (uint32_t x = 0; x < w; ++x) {
      const int dx = int(x) - 1500, dy = int(y) - 900;
      const bool inside = dx * dx + dy * dy < 600 * 600;                 // a painted disc
      const bool edge = !inside && dx * dx + dy * dy < 610 * 610;        // its soft edge
      pixels[y * stride + x] = inside ? 255 : edge ? uint8_t((x * 31 + y * 17) & 0xFF) : 0;
    }
  const std::string png = sdk::encode_grey_png(pixels.data(), w, h, stride);
  REQUIRE(!png.empty());
  const size_t raw = size_t(w + 1) * h;
  INFO("PNG " << png.size() << " bytes for " << raw << " bytes of scanlines");
  CHECK(png.size() < raw / 100);

  auto decoded = decode_image(std::as_bytes(std::span<const char>(png.data(), png.size())), "mask.png", size_t(1) << 30);
  REQUIRE(decoded.ok());
  REQUIRE(decoded->width == int(w));
  REQUIRE(decoded->height == int(h));
  REQUIRE(decoded->channels == 1);
  REQUIRE(decoded->format == PixelFormat::kU8);
  const auto* out = reinterpret_cast<const uint8_t*>(decoded->data.data());
  size_t differing = 0;
  for (uint32_t y = 0; y < h; ++y) differing += std::memcmp(out + size_t(y) * w, pixels.data() + y * stride, w) != 0;
  CHECK(differing == 0);
}

TEST_CASE("sdk: a 1x1 and a noisy mask round-trip too", "[sdk][mask]") {
  for (uint32_t w : {1u, 333u}) {
    const uint32_t h = w == 1 ? 1 : 257;
    std::vector<uint8_t> pixels(size_t(w) * h);
    uint32_t state = 12345;
    for (auto& p : pixels) p = uint8_t((state = state * 1664525u + 1013904223u) >> 24);  // incompressible
    const std::string png = sdk::encode_grey_png(pixels.data(), w, h, w);
    auto decoded = decode_image(std::as_bytes(std::span<const char>(png.data(), png.size())), "mask.png", size_t(1) << 30);
    REQUIRE(decoded.ok());
    CHECK(std::memcmp(decoded->data.data(), pixels.data(), pixels.size()) == 0);
  }
}
