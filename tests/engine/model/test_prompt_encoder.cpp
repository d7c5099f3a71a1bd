// Prompt text -> multi-hot conditioning over the manifest's vocabulary.

#include "support/catch.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "model/manifest.h"
#include "model/prompt_encoder.h"

using namespace infill;

namespace {

ModelManifest manifest_with_vocabulary() {
  ModelManifest m;
  m.name = "tiny";
  m.has_prompt = true;
  m.prompt.vocabulary = {"red", "green", "blue", "dark"};
  return m;
}

}  // namespace

TEST_CASE("prompt words: case-folded, split at spaces and commas", "[model][prompt]") {
  CHECK(prompt_words("  Dark, RED\tblue ") == std::vector<std::string>{"dark", "red", "blue"});
  CHECK(prompt_words(" , ").empty());
}

TEST_CASE("encode_prompt: multi-hot over the vocabulary, null prompt for no words", "[model][prompt]") {
  c10::InferenceMode guard;
  const ModelManifest m = manifest_with_vocabulary();
  auto v = encode_prompt(m, "dark red");
  REQUIRE(v.ok());
  CHECK(at::equal(*v, at::tensor({1.0f, 0.0f, 0.0f, 1.0f})));
  auto empty = encode_prompt(m, "   ");
  REQUIRE(empty.ok());
  CHECK_FALSE(empty->defined());
}

TEST_CASE("encode_prompt: an unknown word is an error that lists the vocabulary", "[model][prompt]") {
  auto v = encode_prompt(manifest_with_vocabulary(), "red turquoise");
  REQUIRE_FALSE(v.ok());
  CHECK_THAT(v.status().message(), Catch::Contains("\"turquoise\""));
  CHECK_THAT(v.status().message(), Catch::Contains("red, green, blue, dark"));
  ModelManifest plain;
  plain.name = "plain";
  auto none = encode_prompt(plain, "red");
  REQUIRE_FALSE(none.ok());
  CHECK_THAT(none.status().message(), Catch::Contains("takes no text prompt"));
}

TEST_CASE("manifest: a prompt vocabulary must match vector conditioning", "[model][prompt][manifest]") {
  const std::string base = R"({"format": "infill-model/1", "name": "m",
    "dit": {"weights": "w.safetensors", "hidden_size": 64, "depth": 1, "num_heads": 4, "latent_channels": 4,
            "conditioning": "vector", "conditioning_dim": DIM},
    "prompt": {"vocabulary": VOCAB}})";
  auto make = [&](const std::string& dim, const std::string& vocab) {
    std::string s = base;
    s.replace(s.find("DIM"), 3, dim);
    s.replace(s.find("VOCAB"), 5, vocab);
    return parse_manifest(s, "/tmp", "m.json");
  };
  auto ok = make("2", R"(["red", "blue"])");
  REQUIRE(ok.ok());
  CHECK(ok->prompt.vocabulary == std::vector<std::string>{"red", "blue"});
  auto round_trip = parse_manifest(manifest_to_json(*ok), "/tmp", "again.json");
  REQUIRE(round_trip.ok());
  CHECK(round_trip->prompt.vocabulary == ok->prompt.vocabulary);

  auto mismatch = make("3", R"(["red", "blue"])");
  REQUIRE_FALSE(mismatch.ok());
  CHECK_THAT(mismatch.status().message(), Catch::Contains("conditioning_dim"));
  auto duplicate = make("2", R"(["red", "red"])");
  REQUIRE_FALSE(duplicate.ok());
  CHECK_THAT(duplicate.status().message(), Catch::Contains("twice"));
  auto spaced = make("2", R"(["red", "light blue"])");
  REQUIRE_FALSE(spaced.ok());
  CHECK_THAT(spaced.status().message(), Catch::Contains("light blue"));
}
