// The byte-level BPE tokenizer on a small tokenizer.json written here (the Qwen3 file itself is
// checked against Tokenizers.js by tests/reference/tokenizer/check.sh).
#include "support/catch.h"

#include <fstream>

#include <nlohmann/json.hpp>

#include "support/temp_dir.h"
#include "text/bpe_tokenizer.h"
#include "text/prompt_tokenizer.h"
#include "text/utf8.h"

namespace infill {
namespace {

// GPT-2's byte characters in id order 0..255 (printable bytes first, as the table is built).
std::vector<std::string> byte_characters() {
  std::vector<std::string> out(256);
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    out[static_cast<size_t>(b)] = utf8_encode(printable ? static_cast<char32_t>(b) : next++);
  }
  return out;
}

const std::string kQwenSplit =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// A byte-level BPE with merges l+o, lo+w, Ġ+low ("Ġ" is the space byte), Qwen's pre-tokenizer
// and two added tokens.
nlohmann::json small_tokenizer() {
  nlohmann::json vocab = nlohmann::json::object();
  const auto bytes = byte_characters();
  for (int b = 0; b < 256; ++b) vocab[bytes[static_cast<size_t>(b)]] = b;
  vocab["lo"] = 256;
  vocab["low"] = 257;
  vocab["\xC4\xA0low"] = 258;
  nlohmann::json doc;
  doc["version"] = "1.0";
  doc["normalizer"] = {{"type", "NFC"}};
  doc["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"Regex", kQwenSplit}}}, {"behavior", "Isolated"}, {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}}}};
  doc["decoder"] = {{"type", "ByteLevel"}};
  doc["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"l o", "lo w", "\xC4\xA0 low"}}, {"ignore_merges", false}};
  doc["added_tokens"] = {{{"id", 259}, {"content", "<|im_start|>"}, {"special", true}},
                         {{"id", 260}, {"content", "<|im_end|>"}, {"special", true}}};
  return doc;
}

std::string write(const test::TempDir& dir, const std::string& name, const std::string& text) {
  std::ofstream(dir.file(name)) << text;
  return dir.file(name);
}

}  // namespace

TEST_CASE("BPE merges apply in rank order and the pre-tokenizer splits as Qwen's regex does", "[text]") {
  test::TempDir dir;
  auto tok = BpeTokenizer::load(write(dir, "tokenizer.json", small_tokenizer().dump()));
  REQUIRE(tok.ok());
  CHECK((*tok)->encode("low") == std::vector<int32_t>{257});
  // " low" is one piece (the space joins the letters), merged to "Ġlow"; "lower" keeps e, r.
  CHECK((*tok)->encode("low low") == std::vector<int32_t>{257, 258});
  CHECK((*tok)->encode("lower") == std::vector<int32_t>{257, 'e', 'r'});
  // A digit run splits per digit (\p{N}), so no merge crosses digits.
  CHECK((*tok)->encode("12") == std::vector<int32_t>{'1', '2'});
  CHECK((*tok)->id_count() == 261);
  CHECK((*tok)->token_id("<|im_end|>") == 260);
  CHECK((*tok)->token_id("no such token") == -1);
}

TEST_CASE("Byte-level BPE round-trips any text, and added tokens are single ids", "[text]") {
  test::TempDir dir;
  auto tok = BpeTokenizer::load(write(dir, "tokenizer.json", small_tokenizer().dump()));
  REQUIRE(tok.ok());
  for (const std::string text : {"hello world", "emoji \xF0\x9F\x8E\xA8 and \xE4\xB8\xAD\xE6\x96\x87", "tabs\tand\r\nnewlines  ", ""}) {
    CHECK((*tok)->decode((*tok)->encode(text)) == text);
  }
  const auto ids = (*tok)->encode("<|im_start|>user low<|im_end|>");
  REQUIRE(ids.size() >= 3);
  CHECK(ids.front() == 259);
  CHECK(ids.back() == 260);
  CHECK((*tok)->decode(ids) == "<|im_start|>user low<|im_end|>");
  CHECK((*tok)->decode(ids, /*skip_special=*/true) == "user low");
  // NFC: a decomposed é encodes as the composed one.
  CHECK((*tok)->encode("cafe\xCC\x81") == (*tok)->encode("caf\xC3\xA9"));
}

TEST_CASE("Invalid UTF-8 becomes U+FFFD, as the tokenizers library's lossy conversion does", "[text]") {
  CHECK(utf8_lossy("ok") == "ok");
  CHECK(utf8_lossy("a\xFF" "b") == "a\xEF\xBF\xBD" "b");
  CHECK(utf8_lossy("\xE4\xB8") == "\xEF\xBF\xBD");            // truncated 3-byte sequence: one U+FFFD
  CHECK(utf8_lossy("\xC0\xAF") == "\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong: two invalid bytes
  CHECK(utf8_lossy("\xED\xA0\x80") == "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // a surrogate
  test::TempDir dir;
  auto tok = BpeTokenizer::load(write(dir, "tokenizer.json", small_tokenizer().dump()));
  REQUIRE(tok.ok());
  CHECK((*tok)->decode((*tok)->encode("x\xFFy")) == "x\xEF\xBF\xBDy");
}

TEST_CASE("Bad tokenizer files are refused, naming the file and what was expected", "[text]") {
  test::TempDir dir;
  const auto error_of = [&](const std::string& text) {
    auto tok = BpeTokenizer::load(write(dir, "tokenizer.json", text));
    REQUIRE_FALSE(tok.ok());
    return tok.status().to_string();
  };
  auto missing = BpeTokenizer::load(dir.file("absent.json"));
  REQUIRE_FALSE(missing.ok());
  CHECK_THAT(missing.status().to_string(), Catch::Contains("absent.json is missing"));

  const std::string full = small_tokenizer().dump();
  CHECK_THAT(error_of(full.substr(0, full.size() / 2)), Catch::Contains("not valid JSON"));

  nlohmann::json wordpiece = small_tokenizer();
  wordpiece["model"]["type"] = "WordPiece";
  CHECK_THAT(error_of(wordpiece.dump()), Catch::Contains("model.type") && Catch::Contains("tokenizer.json"));

  nlohmann::json bad_merge = small_tokenizer();
  bad_merge["model"]["merges"].push_back("q zz");
  CHECK_THAT(error_of(bad_merge.dump()), Catch::Contains("outside model.vocab"));

  nlohmann::json no_bytes = small_tokenizer();
  no_bytes["model"]["vocab"].erase("!");
  CHECK_THAT(error_of(no_bytes.dump()), Catch::Contains("byte-level token"));

  nlohmann::json bad_regex = small_tokenizer();
  bad_regex["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  CHECK_THAT(error_of(bad_regex.dump()), Catch::Contains("does not compile"));

  nlohmann::json nfkc = small_tokenizer();
  nfkc["normalizer"] = {{"type", "NFKC"}};
  CHECK_THAT(error_of(nfkc.dump()), Catch::Contains("normalizer"));
}

TEST_CASE("A tokenizer folder needs a pad token and a chat template the engine knows", "[text]") {
  test::TempDir dir;
  write(dir, "tokenizer.json", small_tokenizer().dump());
  nlohmann::json config = {{"pad_token", "<|im_end|>"}, {"chat_template", "{{ messages[0].content }}"}};
  write(dir, "tokenizer_config.json", config.dump());
  auto unknown = PromptTokenizer::load(dir.path());
  REQUIRE_FALSE(unknown.ok());
  CHECK_THAT(unknown.status().to_string(), Catch::Contains("tokenizer_config.json") && Catch::Contains("sha256") &&
                                               Catch::Contains("not one the engine can render"));

  write(dir, "chat_template.jinja", "{{ other }}\n");
  auto jinja = PromptTokenizer::load(dir.path());
  REQUIRE_FALSE(jinja.ok());
  CHECK_THAT(jinja.status().to_string(), Catch::Contains("chat_template.jinja"));

  config.erase("pad_token");
  write(dir, "tokenizer_config.json", config.dump());
  auto no_pad = PromptTokenizer::load(dir.path());
  REQUIRE_FALSE(no_pad.ok());
  CHECK_THAT(no_pad.status().to_string(), Catch::Contains("pad_token"));

  config["pad_token"] = "<|nope|>";
  write(dir, "tokenizer_config.json", config.dump());
  auto bad_pad = PromptTokenizer::load(dir.path());
  REQUIRE_FALSE(bad_pad.ok());
  CHECK_THAT(bad_pad.status().to_string(), Catch::Contains("<|nope|>"));
}

}  // namespace infill
