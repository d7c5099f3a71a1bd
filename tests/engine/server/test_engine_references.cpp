// Reference images through infill-engine: an edit names uploaded templates as `references`;
// they change the result inside the mask and nothing outside it, the same edit repeats exactly
// (its entry is keyed by them), and bad lists are refused naming the entry.
#include "support/catch.h"
#include "support/random_image.h"
#include "support/tiny_flux2.h"

#include "engine_process.h"
#include "server_fixture.h"

using namespace infill;
using namespace infill::test;

namespace {

PixelImage run_edit(const Endpoint& ep, const nlohmann::json& params) {
  auto img = decode_image(bytes_of(edit_result_body(ep, params)), "result", 1 << 20);
  REQUIRE(img.ok());
  return *img;
}

std::string upload(const Endpoint& ep, const PixelImage& image, const std::string& name) {
  Response t = request(ep, "POST", "/v1/templates?name=" + name, png_string(image), {"Content-Type: image/png"});
  INFO(t.body);
  REQUIRE(t.status == 201);
  return t.json()["id"];
}

}  // namespace

TEST_CASE("infill-engine applies reference images an edit names and refuses bad reference lists",
          "[server][process][flux2][references]") {
  const std::string bin = required_engine_binary();
  c10::InferenceMode guard;
  TempDir dir("infill-engine-references");
  write_tiny_flux2_folder(dir.file("flux2"), /*attentive=*/true);
  const std::string sock = dir.file("run/engine.sock");
  pid_t pid = spawn({bin, "--model", dir.file("flux2"), "--socket", sock, "--no-calibrate", "--threads", "1", "--journal", "off"},
                    dir.file("engine.log"), {"XDG_CACHE_HOME=" + dir.file("cache")});
  ReapOnExit reap{pid};
  REQUIRE(wait_healthy(sock, 120000));
  const Endpoint ep{sock, 0};

  const PixelImage picture = serving_picture(5);
  const std::string tmpl = upload(ep, picture, "picture.png");
  const std::string ref_a = upload(ep, random_image(64, 96, 3, PixelFormat::kU8, 1), "a.png");
  const std::string ref_b = upload(ep, random_image(80, 64, 3, PixelFormat::kU8, 2), "b.png");
  const std::string tiny = upload(ep, random_image(48, 48, 3, PixelFormat::kU8, 3), "tiny.png");

  const nlohmann::json base = {{"template", tmpl}, {"mask_rect", {16, 16, 32, 16}}, {"seed", 3}, {"prompt", "make the cup red"}};
  nlohmann::json with = base;
  with["references"] = {ref_a, ref_b};
  const PixelImage plain = run_edit(ep, base), referenced = run_edit(ep, with);
  const size_t row = static_cast<size_t>(picture.width) * 3;
  size_t changed_outside = 0, differs_inside = 0;
  for (int y = 0; y < picture.height; ++y)
    for (size_t i = 0; i < row; ++i) {
      const bool inside = y >= 16 && y < 32 && i / 3 >= 16 && i / 3 < 48;
      if (!inside) changed_outside += referenced.data[y * row + i] != picture.data[y * row + i];
      if (inside) differs_inside += referenced.data[y * row + i] != plain.data[y * row + i];
    }
  CHECK(changed_outside == 0);
  // Most of the region's samples move (measured: 1138 of 1536), not a rounding here and there.
  INFO("samples differing inside: " << differs_inside);
  CHECK(differs_inside > 32 * 16 * 3 / 2);
  // Repeated (now reading the entry recorded with the references), and without: as before.
  CHECK((run_edit(ep, with).data == referenced.data));
  CHECK((run_edit(ep, base).data == plain.data));

  const auto refused = [&](const nlohmann::json& refs) {
    nlohmann::json p = base;
    p["references"] = refs;
    return request(ep, "POST", "/v1/edits", p.dump(), {"Content-Type: application/json"});
  };
  Response unknown = refused({ref_a, std::string(64, 'f')});
  CHECK(unknown.status == 404);
  CHECK(unknown.json()["error"]["code"] == "template_not_found");
  CHECK(unknown.json()["error"]["message"].get<std::string>().rfind("references[1]: template ffff", 0) == 0);
  Response small = refused({tiny});
  CHECK(small.status == 400);
  CHECK(small.json()["error"]["code"] == "invalid_reference");
  CHECK(small.json()["error"]["message"] == "references[0]: reference image " + tiny +
                                                " is 48x48 pixels; a reference is at least 64 pixels a side");
  Response five = refused({ref_a, ref_b, tiny, tmpl, std::string(64, 'e')});
  CHECK(five.status == 400);
  CHECK(five.json()["error"]["message"] ==
        "references has 5 template ids, expected an array of at most 4 template ids (from POST /v1/templates)");
  Response twice = refused({ref_a, ref_a});
  CHECK(twice.status == 400);
  CHECK(twice.json()["error"]["message"] == "references[1] repeats " + ref_a + " (each reference once)");
  Response number = refused({7});
  CHECK(number.status == 400);
  Response not_a_list = refused(nlohmann::json("pose.png"));
  CHECK(not_a_list.status == 400);
  CHECK(not_a_list.json()["error"]["message"] ==
        "references is string, expected an array of at most 4 template ids (from POST /v1/templates)");
  // The engine keeps serving.
  CHECK((run_edit(ep, with).data == referenced.data));
  ::kill(pid, SIGTERM);
  CHECK(wait_exit(pid, 20000) == 0);
}
