// The Qwen3 text encoder at a reduced size with random weights: the structure a real checkpoint
// relies on (causality, the padding mask, grouped-query heads, which hidden states are read,
// the file layout) and the refusal of bad folders. Its numbers at Qwen3-4B size were compared
// with antirez/flux2.c (docs/architecture.md#text, bench/bench_text.cpp).
#include "support/catch.h"
#include "support/temp_dir.h"

#include <filesystem>
#include <fstream>
#include <limits>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>

#include "model/qwen3_encoder.h"
#include "model/safetensors.h"
#include "model/safetensors_torch.h"

namespace fs = std::filesystem;
using infill::Qwen3Config;
using infill::Qwen3Encoder;

namespace {

Qwen3Config small_config(int kv_heads = 2) {
  Qwen3Config c;
  c.vocab_size = 97;
  c.hidden_size = 64;
  c.num_layers = 4;
  c.num_heads = 4;
  c.num_kv_heads = kv_heads;
  c.head_dim = 16;
  c.intermediate_size = 96;
  c.rope_theta = 1000000.0;
  return c;
}

std::vector<uint8_t> real_then_padding(size_t real, size_t total) {
  std::vector<uint8_t> mask(total, 0);
  std::fill(mask.begin(), mask.begin() + static_cast<std::ptrdiff_t>(real), 1);
  return mask;
}

double max_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

// Rewrites one tensor of a saved single-file encoder.
void replace_tensor(const std::string& dir, const std::string& name, const at::Tensor& value) {
  const std::string path = dir + "/model.safetensors";
  auto file = infill::SafetensorsFile::open(path);
  REQUIRE(file.ok());
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& info : file->tensors()) {
    auto t = infill::load_stored_tensor(*file, info.name);
    REQUIRE(t.ok());
    tensors.emplace_back(info.name, info.name == name ? value : t->clone());
  }
  REQUIRE(infill::write_safetensors(path + ".new", tensors).ok());
  fs::rename(path + ".new", path);
}

}  // namespace

TEST_CASE("Qwen3 encoder is causal and reads the hidden states Hugging Face numbers", "[qwen3]") {
  c10::InferenceMode guard;
  const auto enc = Qwen3Encoder::random(small_config(), 7, at::kBFloat16);
  const std::vector<int32_t> ids{5, 17, 42, 3, 88, 9};
  const auto mask = real_then_padding(ids.size(), ids.size());
  auto all = enc->encode(ids, mask, {0, 1, 2, 3, 4});
  REQUIRE(all.ok());
  REQUIRE(all->sizes() == at::IntArrayRef({6, 5 * 64}));
  // hidden_states[0] is the embedding rows themselves.
  CHECK(max_diff(all->narrow(1, 0, 64), enc->encode(ids, mask, {0})->clone()) == 0.0);
  auto klein = enc->encode(ids, mask, {3, 1});
  REQUIRE(klein.ok());
  CHECK(max_diff(klein->narrow(1, 0, 64), all->narrow(1, 3 * 64, 64)) == 0.0);
  CHECK(max_diff(klein->narrow(1, 64, 64), all->narrow(1, 64, 64)) == 0.0);
  // Changing token 3 leaves rows 0..2 of every layer unchanged and changes rows 3.. .
  std::vector<int32_t> changed = ids;
  changed[3] = 60;
  auto other = enc->encode(changed, mask, {0, 1, 2, 3, 4});
  REQUIRE(other.ok());
  CHECK(max_diff(all->narrow(0, 0, 3), other->narrow(0, 0, 3)) == 0.0);
  CHECK(max_diff(all->narrow(0, 3, 3).narrow(1, 4 * 64, 64), other->narrow(0, 3, 3).narrow(1, 4 * 64, 64)) > 1e-3);
}

TEST_CASE("Qwen3 padding keys are masked: real rows do not depend on the padding", "[qwen3]") {
  c10::InferenceMode guard;
  const auto enc = Qwen3Encoder::random(small_config(), 11, at::kBFloat16);
  const std::vector<int32_t> real{4, 8, 15, 16, 23};
  std::vector<int32_t> short_pad = real, long_pad = real, other_pad = real;
  short_pad.resize(8, 0);
  long_pad.resize(16, 0);
  other_pad.resize(16, 1);
  auto a = enc->encode(short_pad, real_then_padding(5, 8), {2, 4});
  auto b = enc->encode(long_pad, real_then_padding(5, 16), {2, 4});
  auto c = enc->encode(other_pad, real_then_padding(5, 16), {2, 4});
  REQUIRE((a.ok() && b.ok() && c.ok()));
  CHECK(max_diff(a->narrow(0, 0, 5), b->narrow(0, 0, 5)) < 1e-5);
  CHECK(max_diff(b->narrow(0, 0, 5), c->narrow(0, 0, 5)) < 1e-5);
  // Padding rows exist (klein reads all of them), are finite, and differ by position (RoPE).
  CHECK(at::isfinite(*b).all().item<bool>());
  CHECK(max_diff(b->narrow(0, 6, 1), b->narrow(0, 7, 1)) > 1e-4);
  // Unmasking the padding changes the real rows no more (causal) but changes padding rows.
  auto unmasked = enc->encode(long_pad, real_then_padding(16, 16), {2, 4});
  REQUIRE(unmasked.ok());
  CHECK(max_diff(unmasked->narrow(0, 0, 5), b->narrow(0, 0, 5)) < 1e-5);
  CHECK(max_diff(unmasked->narrow(0, 8, 8), b->narrow(0, 8, 8)) > 1e-4);
}

TEST_CASE("Qwen3 grouped-query heads read key/value head n / group, as Hugging Face's repeat_kv", "[qwen3]") {
  c10::InferenceMode guard;
  infill::test::TempDir dir;
  const auto gqa = Qwen3Encoder::random(small_config(/*kv_heads=*/2), 3, at::kFloat);
  REQUIRE(gqa->save(dir.path()).ok());
  // The same model with 4 key/value heads, head n holding the weights of GQA head n / 2.
  for (int l = 0; l < 4; ++l) {
    for (const char* proj : {"k_proj", "v_proj"}) {
      const std::string name = "model.layers." + std::to_string(l) + ".self_attn." + proj + ".weight";
      auto file = infill::SafetensorsFile::open(dir.file("model.safetensors"));
      REQUIRE(file.ok());
      at::Tensor w = infill::load_float_tensor(*file, name).value().view({2, 16, 64});
      replace_tensor(dir.path(), name, w.repeat_interleave(2, 0).reshape({64, 64}).contiguous());
    }
  }
  nlohmann::json config = nlohmann::json::parse(std::ifstream(dir.file("config.json")));
  config["num_key_value_heads"] = 4;
  std::ofstream(dir.file("config.json")) << config.dump();
  auto mha = Qwen3Encoder::load(dir.path());
  REQUIRE(mha.ok());
  CHECK((*mha)->config().num_kv_heads == 4);
  const std::vector<int32_t> ids{1, 2, 3, 50, 60, 0, 0};
  const auto mask = real_then_padding(5, 7);
  auto a = gqa->encode(ids, mask, {4});
  auto b = (*mha)->encode(ids, mask, {4});
  REQUIRE((a.ok() && b.ok()));
  CHECK(max_diff(*a, *b) < 1e-5);
}

TEST_CASE("Qwen3 encoder round-trips through one file and through shards with an index", "[qwen3]") {
  c10::InferenceMode guard;
  infill::test::TempDir one, sharded;
  const auto enc = Qwen3Encoder::random(small_config(), 5, at::kBFloat16);
  REQUIRE(enc->save(one.path()).ok());
  REQUIRE(enc->save(sharded.path(), 3).ok());
  CHECK(fs::exists(sharded.file("model-00003-of-00003.safetensors")));
  CHECK(fs::exists(sharded.file("model.safetensors.index.json")));
  auto a = Qwen3Encoder::load(one.path());
  auto b = Qwen3Encoder::load(sharded.path());
  REQUIRE((a.ok() && b.ok()));
  CHECK((*a)->weight_bytes() == enc->weight_bytes());
  const std::vector<int32_t> ids{7, 7, 8, 90, 0};
  const auto mask = real_then_padding(4, 5);
  auto x = enc->encode(ids, mask, {1, 2, 3});
  auto y = (*a)->encode(ids, mask, {1, 2, 3});
  auto z = (*b)->encode(ids, mask, {1, 2, 3});
  REQUIRE((x.ok() && y.ok() && z.ok()));
  CHECK(max_diff(*x, *y) == 0.0);
  CHECK(max_diff(*x, *z) == 0.0);
  CHECK((*a)->config().family_size() == "custom");
}

TEST_CASE("Qwen3 bad folders and inputs are refused, naming the file, tensor or input", "[qwen3]") {
  c10::InferenceMode guard;
  infill::test::TempDir dir;
  const auto enc = Qwen3Encoder::random(small_config(), 9, at::kBFloat16);
  REQUIRE(enc->save(dir.path()).ok());
  const auto error_of = [&]() {
    auto r = Qwen3Encoder::load(dir.path());
    REQUIRE_FALSE(r.ok());
    return r.status().to_string();
  };
  // Inputs.
  CHECK_THAT(enc->encode({1, 200}, {1, 1}, {1}).status().to_string(), Catch::Contains("200") && Catch::Contains("97"));
  CHECK_THAT(enc->encode({1, 2}, {1}, {1}).status().to_string(), Catch::Contains("mask"));
  CHECK_THAT(enc->encode({1, 2}, {0, 1}, {1}).status().to_string(), Catch::Contains("padding"));
  CHECK_THAT(enc->encode({1, 2}, {1, 1}, {5}).status().to_string(), Catch::Contains("hidden state 5"));

  // Another model type.
  const std::string config_text = [&] {
    std::ifstream in(dir.file("config.json"));
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  nlohmann::json config = nlohmann::json::parse(config_text);
  config["model_type"] = "llama";
  std::ofstream(dir.file("config.json")) << config.dump();
  CHECK_THAT(error_of(), Catch::Contains("config.json") && Catch::Contains("qwen3"));
  // A vocabulary that does not match the embedding.
  config["model_type"] = "qwen3";
  config["vocab_size"] = 151936;
  std::ofstream(dir.file("config.json")) << config.dump();
  CHECK_THAT(error_of(), Catch::Contains("model.embed_tokens.weight"));
  std::ofstream(dir.file("config.json")) << config_text;
  REQUIRE(Qwen3Encoder::load(dir.path()).ok());

  // A NaN in one layer, named.
  at::Tensor bad = at::zeros({16}, at::kBFloat16);
  bad[3] = std::numeric_limits<float>::quiet_NaN();
  replace_tensor(dir.path(), "model.layers.2.self_attn.k_norm.weight", bad);
  CHECK_THAT(error_of(), Catch::Contains("model.layers.2.self_attn.k_norm.weight"));

  // A truncated weight file.
  REQUIRE(enc->save(dir.path()).ok());
  fs::resize_file(dir.file("model.safetensors"), fs::file_size(dir.file("model.safetensors")) / 2);
  CHECK_THAT(error_of(), Catch::Contains("model.safetensors"));

  // A missing shard.
  infill::test::TempDir sharded;
  REQUIRE(enc->save(sharded.path(), 2).ok());
  fs::remove(sharded.file("model-00002-of-00002.safetensors"));
  auto missing = Qwen3Encoder::load(sharded.path());
  REQUIRE_FALSE(missing.ok());
  CHECK_THAT(missing.status().to_string(), Catch::Contains("model-00002-of-00002.safetensors"));
}
