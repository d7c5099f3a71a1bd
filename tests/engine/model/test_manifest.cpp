
#include "support/catch.h"
#include <nlohmann/json.hpp>

#include "model/manifest.h"

using namespace infill;
using nlohmann::json;

namespace {

json valid_manifest() {
  return json::parse(R"({
    "format": "infill-model/1",
    "name": "tiny",
    "dit": {"weights": "dit.safetensors", "hidden_size": 64, "depth": 2, "num_heads": 4,
            "patch_size": 2, "latent_channels": 4,
            "inputs": ["noisy_latent", "masked_latent", "mask"],
            "conditioning": "vector", "conditioning_dim": 8, "prompt_scope": "masked_tokens"},
    "autoencoder": {"type": "taesd", "encoder": "e.safetensors", "decoder": "d.safetensors", "latent_channels": 4},
    "sampler": {"default": "ddim", "steps": 12}
  })");
}

Result<ModelManifest> parse(const json& j) { return parse_manifest(j.dump(), "/models/tiny", "tiny/manifest.json"); }

}  // namespace

TEST_CASE("a valid manifest parses with defaults and round-trips", "[model][manifest]") {
  auto m = parse(valid_manifest());
  REQUIRE(m.ok());
  CHECK(m->dit.in_channels() == 9);
  CHECK(m->dit.prompt_scope == PromptScope::kMaskedTokens);
  CHECK(m->dit.mlp_ratio == 4.0);
  CHECK(m->sampler.sampler == "ddim");
  CHECK(m->sampler.steps == 12);
  CHECK(m->resolve("dit.safetensors") == "/models/tiny/dit.safetensors");
  auto again = parse_manifest(manifest_to_json(*m), "/models/tiny", "again");
  REQUIRE(again.ok());
  CHECK(again->dit.in_channels() == 9);
  CHECK(again->dit.conditioning_dim == 8);
  CHECK(again->autoencoder.encoder == "e.safetensors");
}

TEST_CASE("manifest errors name the field at fault", "[model][manifest]") {
  struct Case {
    const char* what;
    std::function<void(json&)> edit;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"unknown top-level field", [](json& j) { j["colour"] = 1; }, "colour is not a known field"},
      {"misspelled dit field", [](json& j) { j["dit"]["hiden_size"] = 64; }, "dit.hiden_size is not a known field"},
      {"missing depth", [](json& j) { j["dit"].erase("depth"); }, "dit.depth is required"},
      {"wrong type", [](json& j) { j["dit"]["num_heads"] = "four"; }, "dit.num_heads must be an integer"},
      {"heads do not divide", [](json& j) { j["dit"]["num_heads"] = 5; }, "not divisible by num_heads 5"},
      {"unknown input", [](json& j) { j["dit"]["inputs"] = {"noisy_latent", "depth"}; }, "unknown input depth"},
      {"bad conditioning", [](json& j) { j["dit"]["conditioning"] = "text"; }, "expected none, class or vector"},
      {"bad format", [](json& j) { j["format"] = "other/2"; }, "expected \"infill-model/1\""},
      {"channel mismatch", [](json& j) { j["autoencoder"]["latent_channels"] = 16; }, "autoencoder.latent_channels is 16"},
      {"steps range", [](json& j) { j["sampler"]["steps"] = 0; }, "sampler.steps must be in [1, 1000]"},
  };
  for (const auto& c : cases) {
    json j = valid_manifest();
    c.edit(j);
    auto m = parse(j);
    INFO(c.what);
    REQUIRE_FALSE(m.ok());
    CHECK(m.status().code() == ErrorCode::kInvalidArgument);
    CHECK_THAT(m.status().message(), Catch::Contains(c.message));
  }
  CHECK_FALSE(parse_manifest("{not json", "/", "broken.json").ok());
  CHECK(load_manifest("/nonexistent/manifest.json").status().code() == ErrorCode::kNotFound);
}
