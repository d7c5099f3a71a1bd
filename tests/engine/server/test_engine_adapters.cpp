// LoRAs through infill-engine: uploaded to its adapter store (POST /v1/adapters), listed,
// named by an edit ("adapters": [{"id", "strength"}]), refused naming the key when a file does
// not fit the model (the engine keeps serving), kept across a restart, deleted.
#include "support/catch.h"
#include "support/tiny_flux2.h"

#include <filesystem>
#include <fstream>
#include <iterator>

#include "engine_process.h"
#include "server_fixture.h"

using namespace infill;
using namespace infill::test;

namespace {

std::string file_string(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The edit's result as pixels, or a failed REQUIRE naming the edit's last state.
PixelImage run_edit(const Endpoint& ep, const nlohmann::json& params) {
  auto img = decode_image(bytes_of(edit_result_body(ep, params)), "result", 1 << 20);
  REQUIRE(img.ok());
  return *img;
}

}  // namespace

TEST_CASE("infill-engine keeps uploaded LoRAs, applies them to edits that name them and refuses files that do not fit",
          "[server][process][flux2][lora]") {
  const std::string bin = required_engine_binary();
  c10::InferenceMode guard;
  TempDir dir("infill-engine-lora");
  write_tiny_flux2_folder(dir.file("flux2"));
  const Flux2Config config = tiny_flux2_config(3 * tiny_qwen3_config().hidden_size);
  write_random_lora(dir.file("style.safetensors"), config, 11);
  Flux2Config other = config;  // a LoRA for a wider model
  other.hidden_size = 128;
  other.mlp_hidden = 256;
  write_random_lora(dir.file("wider.safetensors"), other, 12);

  const std::string sock = dir.file("run/engine.sock");
  const std::vector<std::string> args = {bin, "--model", dir.file("flux2"), "--socket", sock, "--no-calibrate",
                                         "--threads", "1", "--journal", "off"};
  const std::vector<std::string> env = {"XDG_CACHE_HOME=" + dir.file("cache")};
  pid_t pid = spawn(args, dir.file("engine.log"), env);
  ReapOnExit reap{pid};
  REQUIRE(wait_healthy(sock, 120000));
  const Endpoint ep{sock, 0};

  const std::string lora = file_string(dir.file("style.safetensors"));
  Response up = request(ep, "POST", "/v1/adapters?name=style.safetensors", lora, {"Content-Type: application/octet-stream"});
  INFO(up.body);
  REQUIRE(up.status == 201);
  const std::string id = up.json()["id"];
  CHECK(id.size() == 64);
  CHECK(up.json()["format"] == "upstream");
  CHECK(up.json()["rank"] == 4);
  CHECK(up.json()["name"] == "style.safetensors");
  CHECK(up.json()["layers"] == int64_t(flux2_linear_layers(config).size()));
  // The same bytes again: the same adapter, not a new one.
  Response again = request(ep, "POST", "/v1/adapters", lora, {"Content-Type: application/octet-stream"});
  CHECK(again.status == 200);
  CHECK(again.json()["id"] == id);

  // A LoRA of another model size is refused naming the upload and a key; nothing is kept.
  Response wide = request(ep, "POST", "/v1/adapters?name=wider.safetensors", file_string(dir.file("wider.safetensors")),
                          {"Content-Type: application/octet-stream"});
  INFO(wide.body);
  CHECK(wide.status == 400);
  CHECK(wide.json()["error"]["code"] == "invalid_adapter");
  const std::string why = wide.json()["error"]["message"];
  CHECK(why.find("wider.safetensors") != std::string::npos);
  CHECK(why.find("diffusion_model.") != std::string::npos);
  // A truncated file too.
  Response cut = request(ep, "POST", "/v1/adapters?name=cut.safetensors", lora.substr(0, lora.size() / 2),
                         {"Content-Type: application/octet-stream"});
  CHECK(cut.status == 400);
  CHECK(cut.json()["error"]["message"].get<std::string>().find("cut.safetensors") != std::string::npos);
  Response list = request(ep, "GET", "/v1/adapters");
  REQUIRE(list.status == 200);
  REQUIRE(list.json()["adapters"].size() == 1);
  CHECK(list.json()["adapters"][0]["id"] == id);

  const PixelImage picture = serving_picture(5);
  Response t = request(ep, "POST", "/v1/templates?name=picture.png", png_string(picture), {"Content-Type: image/png"});
  REQUIRE(t.status == 201);
  const nlohmann::json base = {{"template", t.json()["id"]}, {"mask_rect", {16, 16, 32, 16}}, {"seed", 3},
                               {"prompt", "make the cup red"}};
  nlohmann::json with = base;
  with["adapters"] = {{{"id", id}, {"strength", 1.5}}};
  const PixelImage plain = run_edit(ep, base), adapted = run_edit(ep, with);
  // Outside the 32x16 rectangle at (16, 16) every byte is the template's, with or without the
  // LoRA; inside, the LoRA changes the result.
  const size_t row = static_cast<size_t>(picture.width) * 3;
  size_t changed_outside = 0, differs_inside = 0;
  for (int y = 0; y < picture.height; ++y) {
    for (size_t i = 0; i < row; ++i) {
      const bool inside = y >= 16 && y < 32 && i / 3 >= 16 && i / 3 < 48;
      if (!inside) changed_outside += adapted.data[y * row + i] != picture.data[y * row + i];
      if (inside) differs_inside += adapted.data[y * row + i] != plain.data[y * row + i];
    }
  }
  CHECK(changed_outside == 0);
  CHECK(differs_inside > 0);
  // The same edit without the LoRA again is the plain one: the base weights are untouched.
  CHECK((run_edit(ep, base).data == plain.data));

  // Bad adapter lists are refused naming the entry.
  nlohmann::json unknown = base;
  unknown["adapters"] = {{{"id", std::string(64, 'a')}}};
  Response r404 = request(ep, "POST", "/v1/edits", unknown.dump(), {"Content-Type: application/json"});
  CHECK(r404.status == 404);
  CHECK(r404.json()["error"]["code"] == "unknown_adapter");
  nlohmann::json strong = base;
  strong["adapters"] = {{{"id", id}, {"strength", 11}}};
  Response r400 = request(ep, "POST", "/v1/edits", strong.dump(), {"Content-Type: application/json"});
  CHECK(r400.status == 400);
  CHECK(r400.json()["error"]["message"] == "adapters[0].strength is 11, expected -10..10");

  // After a restart the store still holds it, and an edit naming it comes out as before.
  ::kill(pid, SIGTERM);
  REQUIRE(wait_exit(pid, 20000) == 0);
  pid = spawn(args, dir.file("engine2.log"), env);
  REQUIRE(wait_healthy(sock, 120000));
  Response listed = request(ep, "GET", "/v1/adapters/" + id);
  REQUIRE(listed.status == 200);
  CHECK(listed.json()["name"] == "style.safetensors");
  REQUIRE(request(ep, "POST", "/v1/templates?name=picture.png", png_string(picture), {"Content-Type: image/png"}).status == 201);
  CHECK((run_edit(ep, with).data == adapted.data));

  Response del = request(ep, "DELETE", "/v1/adapters/" + id);
  INFO(del.body);
  CHECK(del.status == 200);
  // What was recorded with it goes too: at least the template-keyed entry its edit read.
  CHECK(del.json()["cache_entries_dropped"].get<int64_t>() >= 1);
  CHECK(request(ep, "GET", "/v1/adapters/" + id).status == 404);
  CHECK(request(ep, "DELETE", "/v1/adapters/" + id).status == 404);
  CHECK(request(ep, "POST", "/v1/edits", with.dump(), {"Content-Type: application/json"}).status == 404);
  ::kill(pid, SIGTERM);
  CHECK(wait_exit(pid, 20000) == 0);
}
