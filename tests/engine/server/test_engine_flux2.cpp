// infill-engine serving a FLUX.2 folder (single-file layout: transformer file, ae.safetensors,
// text_encoder/, tokenizer/; small random weights, Qwen3's real tokenizer) beside the bundled
// infill-tiny: /v1/models describes both, a free-text prompt edits on FLUX.2 and keeps every
// pixel outside the mask, the vocabulary model still refuses words it does not know. An FP8
// folder (transformer and text encoder) edits exactly as its bf16 twin.
#include "support/catch.h"
#include "support/float8_files.h"
#include "support/tiny_flux2.h"

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>

#include "engine_process.h"
#include "server_fixture.h"

using namespace infill;
using namespace infill::test;


TEST_CASE("infill-engine serves a FLUX.2 folder with free-text prompts beside infill-tiny", "[server][process][flux2]") {
  const std::string bin = required_engine_binary();
  c10::InferenceMode guard;
  TempDir dir("infill-engine-flux2");
  write_tiny_flux2_folder(dir.file("flux2"));
  const std::string tiny = std::string(INFILL_SOURCE_DIR) + "/resources/models/infill-tiny";
  const std::string sock = dir.file("run/engine.sock");
  pid_t pid = spawn({bin, "--model", dir.file("flux2"), "--model", tiny, "--socket", sock, "--no-calibrate", "--threads", "1",
                     "--journal", "off"},
                    dir.file("engine.log"));
  ReapOnExit reap{pid};
  REQUIRE(wait_healthy(sock, 120000));
  const Endpoint ep{sock, 0};

  Response models = request(ep, "GET", "/v1/models");
  REQUIRE(models.status == 200);
  const auto list = models.json()["models"];
  REQUIRE(list.size() == 2);
  CHECK(list[0]["family"] == "flux2");
  CHECK(list[0]["prompt"] == "free_text");
  CHECK(list[0]["default_steps"] == 4);  // "klein" without "base": distilled
  CHECK(list[0]["grid_pixels"] == 16);
  CHECK(list[1]["family"] == "dit");
  CHECK(list[1]["prompt"] == "vocabulary");
  const std::string tiny_id = list[1]["id"];

  const PixelImage picture = serving_picture(5);
  Response t = request(ep, "POST", "/v1/templates?name=picture.png", png_string(picture), {"Content-Type: image/png"});
  REQUIRE(t.status == 201);
  const std::string tmpl = t.json()["id"];

  nlohmann::json p = {{"template", tmpl}, {"mask_rect", {16, 16, 32, 16}}, {"seed", 3}, {"prompt", "make the cup red, please!"}};
  const std::string png = edit_result_body(ep, p);
  auto img = decode_image(bytes_of(png), "result", 1 << 20);
  REQUIRE(img.ok());
  REQUIRE(img->width == picture.width);
  // Outside the 32x16 rectangle at (16, 16) every byte is the template's.
  const size_t row = static_cast<size_t>(picture.width) * 3;
  size_t changed_outside = 0, changed_inside = 0;
  for (int y = 0; y < picture.height; ++y) {
    for (size_t i = 0; i < row; ++i) {
      const bool inside = y >= 16 && y < 32 && i / 3 >= 16 && i / 3 < 48;
      const bool differs = img->data[y * row + i] != picture.data[y * row + i];
      (inside ? changed_inside : changed_outside) += differs ? 1 : 0;
    }
  }
  CHECK(changed_outside == 0);
  CHECK(changed_inside > 0);

  // The vocabulary model keeps its checks: a sentence is not one of its words.
  p["model"] = tiny_id;
  Response bad = request(ep, "POST", "/v1/edits", p.dump(), {"Content-Type: application/json"});
  CHECK(bad.status == 400);
  CHECK(bad.json()["error"]["code"] == "invalid_prompt");

  ::kill(pid, SIGTERM);
  CHECK(wait_exit(pid, 20000) == 0);
}

TEST_CASE("infill-engine serves an FP8 FLUX.2 folder: its edits are the bf16 twin's byte for byte",
          "[server][process][flux2][float8]") {
  const std::string bin = required_engine_binary();
  c10::InferenceMode guard;
  TempDir dir("infill-engine-fp8");
  write_tiny_flux2_folder(dir.file("source"));
  // The FP8 folder as BFL and ComfyUI publish one (E4M3 weights with their scales, the text
  // encoder too), and its twin: the same numbers dequantized, in bf16.
  const Fp8Checkpoint transformer = quantize(float_tensors(dir.file("source/flux-2-klein-tiny.safetensors")),
                                             Quantizer(Float8Format::kE4M3FN), Companions::kComfyQuant);
  const Fp8Checkpoint text = quantize(float_tensors(dir.file("source/text_encoder/model.safetensors")),
                                      Quantizer(Float8Format::kE4M3FN), Companions::kComfyQuant);
  for (const std::string folder : {"fp8", "bf16"}) {
    std::filesystem::create_directories(dir.file(folder + "/text_encoder"));
    std::filesystem::copy(dir.file("source/tokenizer"), dir.file(folder + "/tokenizer"));
    std::filesystem::copy_file(dir.file("source/ae.safetensors"), dir.file(folder + "/ae.safetensors"));
    std::filesystem::copy_file(dir.file("source/text_encoder/config.json"), dir.file(folder + "/text_encoder/config.json"));
  }
  write_raw(dir.file("fp8/flux-2-klein-tiny-fp8.safetensors"), transformer.fp8, transformer.metadata);
  write_raw(dir.file("fp8/text_encoder/model.safetensors"), text.fp8, text.metadata);
  REQUIRE(write_safetensors(dir.file("bf16/flux-2-klein-tiny.safetensors"), transformer.expected).ok());
  REQUIRE(write_safetensors(dir.file("bf16/text_encoder/model.safetensors"), text.expected).ok());

  const std::string sock = dir.file("run/engine.sock");
  pid_t pid = spawn({bin, "--model", dir.file("fp8"), "--model", dir.file("bf16"), "--socket", sock, "--no-calibrate",
                     "--threads", "1", "--journal", "off"},
                    dir.file("engine.log"));
  ReapOnExit reap{pid};
  REQUIRE(wait_healthy(sock, 120000));
  const Endpoint ep{sock, 0};
  Response models = request(ep, "GET", "/v1/models");
  REQUIRE(models.status == 200);
  const auto list = models.json()["models"];
  REQUIRE(list.size() == 2);
  CHECK(list[0]["default_steps"] == 4);  // "klein" without "base": distilled, FP8 or not

  const PixelImage picture = serving_picture(6);
  Response t = request(ep, "POST", "/v1/templates?name=picture.png", png_string(picture), {"Content-Type: image/png"});
  REQUIRE(t.status == 201);
  std::vector<PixelImage> results;
  for (const auto& model : list) {
    nlohmann::json p = {{"template", t.json()["id"]}, {"mask_rect", {8, 16, 40, 24}}, {"seed", 11},
                        {"prompt", "a red cup on the table"}, {"model", model["id"]}};
    auto img = decode_image(bytes_of(edit_result_body(ep, p)), "result", 1 << 20);
    REQUIRE(img.ok());
    results.push_back(std::move(*img));
  }
  REQUIRE(results[0].data.size() == picture.data.size());
  const bool same = results[0].data == results[1].data;
  CHECK(same);
  const bool repainted = results[0].data != picture.data;
  CHECK(repainted);

  ::kill(pid, SIGTERM);
  CHECK(wait_exit(pid, 20000) == 0);
}

TEST_CASE("infill-engine refuses the GPU-only options on the CPU at start naming the option the device and the model",
          "[server][process][flux2][float8][fused-norms]") {
  const std::string bin = required_engine_binary();
  c10::InferenceMode guard;
  TempDir dir("infill-engine-gpu-options-cpu");
  write_tiny_flux2_folder(dir.file("flux2"));
  // Each option with what its refusal says of the CPU.
  const std::pair<std::string, std::string> options[] = {
      {"float8_weights", "cpu: FP8 weights are for CUDA devices"},
      {"fused_norm_kernels", "cpu: the fused norms are CUDA kernels"}};
  for (const auto& [key, why] : options) {
    INFO(key);
    std::ofstream(dir.file("engine.json"), std::ios::trunc) << "{\"" << key << "\": true}";
    pid_t pid = spawn({bin, "--config", dir.file("engine.json"), "--model", dir.file("flux2"), "--socket",
                       dir.file("run/engine.sock"), "--no-calibrate", "--threads", "1", "--journal", "off"},
                      dir.file(key + ".log"));
    ReapOnExit reap{pid};
    const int code = wait_exit(pid, 120000);
    std::ifstream in(dir.file(key + ".log"));
    const std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    INFO(log);
    CHECK(code != 0);
    CHECK(code != 128 + SIGKILL);  // it exited by itself
    CHECK(log.find(key) != std::string::npos);
    CHECK(log.find(why) != std::string::npos);
    CHECK(log.find(dir.file("flux2")) != std::string::npos);
  }
}
