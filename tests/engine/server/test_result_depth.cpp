// Bit depth through the API: 16-bit PNG, 16-bit TIFF, half and float OpenEXR templates are
// uploaded, edited with a rectangle mask and fetched back. The result comes in the template's
// own format and depth, and every pixel outside the mask equals the upload bit for bit.
// The uploads are written and the results read by OpenImageIO.
#include <c10/core/InferenceMode.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

#include "http_test_client.h"
#include "server_fixture.h"
#include "support/catch.h"
#include "support/command_output.h"
#include "support/random_image.h"

using namespace infill;
using namespace infill::test;

namespace {

constexpr int kW = 64, kH = 48;
constexpr int kMaskX = 16, kMaskY = 8, kMaskW = 24, kMaskH = 16;

bool inside_mask(int x, int y) { return x >= kMaskX && x < kMaskX + kMaskW && y >= kMaskY && y < kMaskY + kMaskH; }

struct Submitted {
  Response result;
  nlohmann::json status;
};

// Uploads `file`, edits it with the fixture's mask rectangle (more `params` merged in) and
// returns the result once the "done" event came.
Submitted edit_file(ServerFixture& f, const std::string& file, const std::string& name, nlohmann::json params = {}) {
  Response up = request(f.unix_ep, "POST", "/v1/templates?name=" + name, file);
  INFO(up.body);
  REQUIRE((up.status == 201 || up.status == 200));
  EventStream events(f.unix_ep, "depth");
  params["template"] = up.json()["id"];
  params["mask_rect"] = {kMaskX, kMaskY, kMaskW, kMaskH};
  params["steps"] = 2;
  params["seed"] = 3;
  Response sub = request(f.unix_ep, "POST", "/v1/edits", params.dump(), {"Content-Type: application/json", "X-Infill-Client: depth"});
  INFO(sub.body);
  REQUIRE(sub.status == 202);
  const uint64_t id = sub.json()["id"].get<uint64_t>();
  const auto& got = events.wait_for([&](const SseEvent& e) { return (e.type == "done" || e.type == "failed") && e.data["id"] == id; });
  REQUIRE(!got.empty());
  INFO(got.back().data.dump());
  REQUIRE(got.back().type == "done");
  Submitted s;
  s.result = request(f.unix_ep, "GET", "/v1/edits/" + std::to_string(id) + "/result");
  s.status = up.json();
  return s;
}

// Pixels outside the mask: identical bytes; inside: at least one sample changed.
void check_outside_kept(const PixelImage& input, const PixelImage& out) {
  REQUIRE(out.width == input.width);
  REQUIRE(out.height == input.height);
  REQUIRE(out.channels == input.channels);
  REQUIRE(out.format == input.format);
  const size_t px = input.channels * bytes_per_sample(input.format);
  int64_t kept_bad = 0, changed_inside = 0;
  for (int y = 0; y < kH; ++y)
    for (int x = 0; x < kW; ++x) {
      const size_t at = (size_t(y) * kW + x) * px;
      const bool same = std::memcmp(input.data.data() + at, out.data.data() + at, px) == 0;
      if (inside_mask(x, y)) changed_inside += !same;
      else kept_bad += !same;
    }
  CHECK(kept_bad == 0);
  CHECK(changed_inside > 0);
}

}  // namespace

TEST_CASE("16-bit PNG, 16-bit TIFF, half and float EXR templates come back at their depth, bit-identical outside the mask",
          "[server][depth]") {
  ServerFixture f;
  struct Case {
    const char* name;
    ImageFileFormat file;
    PixelFormat format;
    int channels;
    const char* media_type;
  };
  const Case cases[] = {
      {"plate16.png", ImageFileFormat::kPng, PixelFormat::kU16, 3, "image/png"},
      {"plate16.tif", ImageFileFormat::kTiff, PixelFormat::kU16, 4, "image/tiff"},
      {"plate_half.exr", ImageFileFormat::kExr, PixelFormat::kF16, 4, "image/x-exr"},
      {"plate_float.exr", ImageFileFormat::kExr, PixelFormat::kF32, 3, "image/x-exr"},
  };
  uint32_t seed = 10;
  for (const Case& c : cases) {
    INFO(c.name);
    // HDR values up to 6 for the float formats: above 1 must survive outside the mask.
    const PixelImage input = random_image(kW, kH, c.channels, c.format, ++seed, 0.0f, 6.0f);
    auto file = encode_image(input, c.file);
    REQUIRE(file.ok());
    const Submitted s = edit_file(f, to_string(*file), c.name);
    CHECK(s.status["format"] == pixel_format_name(c.format));
    CHECK(s.status["result_format"] == image_file_format_name(c.file));
    CHECK(s.status["colour"] == (c.file == ImageFileFormat::kExr ? "scene_linear" : "display"));
    REQUIRE(s.result.status == 200);
    CHECK(s.result.headers.at("content-type") == c.media_type);
    auto out = decode_image(bytes_of(s.result.body), "result", 1 << 20);
    REQUIRE(out.ok());
    check_outside_kept(input, *out);
  }
}

TEST_CASE("output_format asks for another format: a float EXR template as a 16-bit PNG, a PNG as EXR", "[server][depth]") {
  ServerFixture f;
  const PixelImage exr_input = random_image(kW, kH, 3, PixelFormat::kF32, 21, 0.0f, 1.0f);
  auto exr = encode_image(exr_input, ImageFileFormat::kExr);
  REQUIRE(exr.ok());
  const Submitted as_png = edit_file(f, to_string(*exr), "plate.exr", {{"output_format", "png"}});
  REQUIRE(as_png.result.status == 200);
  CHECK(as_png.result.headers.at("content-type") == "image/png");
  auto png = decode_image(bytes_of(as_png.result.body), "result", 1 << 20);
  REQUIRE(png.ok());
  CHECK(png->format == PixelFormat::kU16);

  const Submitted as_exr = edit_file(f, f.template_png, "picture.png", {{"output_format", "exr"}});
  REQUIRE(as_exr.result.status == 200);
  CHECK(as_exr.result.headers.at("content-type") == "image/x-exr");
  auto linear = decode_image(bytes_of(as_exr.result.body), "result", 1 << 20);
  REQUIRE(linear.ok());
  CHECK(linear->format == PixelFormat::kF32);
  CHECK(linear->scene_linear);

  Response bad = request(f.unix_ep, "POST", "/v1/edits",
                         nlohmann::json{{"template", "x"}, {"mask_rect", {0, 0, 8, 8}}, {"output_format", "jpeg"}}.dump(),
                         {"Content-Type: application/json"});
  CHECK(bad.status == 400);
  CHECK(bad.body.find("output_format") != std::string::npos);
  CHECK(bad.body.find("template|png|tiff|exr") != std::string::npos);
}

TEST_CASE("an ICC profile uploaded with a 16-bit TIFF template comes back with the result", "[server][depth][icc]") {
  const char* profile_path = "/usr/share/color/icc/ghostscript/srgb.icc";
  require_package_file_or_skip(profile_path, "libgs-common");
  std::ifstream in(profile_path, std::ios::binary);
  const std::string profile((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ServerFixture f;
  PixelImage input = random_image(kW, kH, 3, PixelFormat::kU16, 31);
  input.icc_profile.resize(profile.size());
  std::memcpy(input.icc_profile.data(), profile.data(), profile.size());
  auto file = encode_image(input, ImageFileFormat::kTiff);
  REQUIRE(file.ok());
  const Submitted s = edit_file(f, to_string(*file), "profiled.tif");
  CHECK(s.status["icc_profile_bytes"] == profile.size());
  REQUIRE(s.result.status == 200);
  auto out = decode_image(bytes_of(s.result.body), "result", 1 << 20);
  REQUIRE(out.ok());
  const bool same_profile = out->icc_profile == input.icc_profile;
  CHECK(same_profile);
  check_outside_kept(input, *out);
}
