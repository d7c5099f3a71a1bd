// The byte-level BPE trainer: its folders load in the engine, encode and decode losslessly,
// come out byte-identical from the same corpus, and on the caption corpus give the colour and
// tone words one token each.

#include "support/catch.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "support/temp_dir.h"
#include "text/chat_template.h"
#include "text/prompt_tokenizer.h"
#include "tools/train/bpe_trainer.h"
#include "tools/train/captions.h"
#include "tools/train/colour_words.h"

using namespace infill;
using namespace infill::train;

namespace {

// The BPE vocabulary size recommended for the bundled model's tokenizer (captions plus a few
// thousand generic words). The caption corpus alone runs out of pairs seen twice before it
// (at 555 tokens), so these tests also cover stopping early.
constexpr int kCaptionVocabSize = 1024;

// tests/reference/tokenizer/trained/ is this trainer's output for these inputs; check.sh
// compares the engine with Tokenizers.js on it.
constexpr int kGoldenVocabSize = 400;
const std::string kReferenceDir = std::string(INFILL_SOURCE_DIR) + "/tests/reference/tokenizer";

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::string> reference_prompts() {
  std::vector<std::string> out;
  std::ifstream in(kReferenceDir + "/prompts.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) out.push_back(nlohmann::json::parse(line).get<std::string>());
  }
  return out;
}

const std::string kQwen3Conversation =
    "<|im_start|>user\nmake it dark blue<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";

}  // namespace

TEST_CASE("a trained folder loads in the engine and renders Qwen3's conversation", "[train][bpe]") {
  test::TempDir dir;
  auto vocabulary = train_bpe(training_caption_corpus(), kCaptionVocabSize);
  REQUIRE(vocabulary.ok());
  const int size = static_cast<int>(vocabulary->tokens.size());
  CHECK((size > 256 && size <= kCaptionVocabSize));
  CHECK(vocabulary->merges.size() >= static_cast<size_t>(size - 256));
  REQUIRE(write_tokenizer_folder(dir.path(), *vocabulary).ok());
  auto tokenizer = PromptTokenizer::load(dir.path());
  REQUIRE(tokenizer.ok());
  CHECK(tokenizer->chat_template().kind == ChatTemplate::Kind::kQwen3Compact);
  CHECK(tokenizer->render("make it dark blue") == kQwen3Conversation);
  CHECK(tokenizer->tokenizer().id_count() == size + static_cast<int>(added_token_texts().size()));
  CHECK(tokenizer->pad_id() == size);  // "<|endoftext|>", the first added token
  for (size_t i = 0; i < added_token_texts().size(); ++i) {
    CHECK(tokenizer->tokenizer().token_id(added_token_texts()[i]) == size + static_cast<int>(i));
  }
  // The conversation's markers are single ids; padding fills up to max_length.
  const PromptTokens tokens = tokenizer->encode("make it dark blue", 64);
  CHECK(tokens.ids[0] == tokenizer->tokenizer().token_id("<|im_start|>"));
  CHECK(tokenizer->tokenizer().encode("make it dark blue").size() == 4);
  CHECK(tokens.real_length <
        40);  // "user" and "assistant" are not in the caption corpus: a few pieces each
  CHECK(tokens.ids[63] == tokenizer->pad_id());
  CHECK(tokenizer->tokenizer().decode(
            {tokens.ids.begin(), tokens.ids.begin() + tokens.real_length}) == kQwen3Conversation);
}

TEST_CASE("the compact chat template is recognised and renders as Qwen3's", "[train][bpe]") {
  auto recognised = recognise_chat_template(kCompactChatTemplate, "kCompactChatTemplate");
  REQUIRE(recognised.ok());
  CHECK(recognised->kind == ChatTemplate::Kind::kQwen3Compact);
  CHECK(recognised->sha256 == "55bf5ccac29c0767699ef02a373bdf10c4a20210ddad046aa4ce6e10cf43f398");
  CHECK(render_user_prompt(*recognised, "make it dark blue") == kQwen3Conversation);
  CHECK(render_user_prompt(*recognised, "") ==
        "<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  // A trailing newline (an editor's) does not change the hash; another byte does.
  CHECK(recognise_chat_template(std::string(kCompactChatTemplate) + "\n", "x").ok());
  CHECK(!recognise_chat_template(std::string(kCompactChatTemplate) + "x", "x").ok());
}

TEST_CASE("encode and decode round-trip captions and arbitrary Unicode", "[train][bpe]") {
  test::TempDir dir;
  REQUIRE(write_tokenizer_folder(dir.path(), training_caption_corpus(), kCaptionVocabSize).ok());
  auto tokenizer = PromptTokenizer::load(dir.path());
  REQUIRE(tokenizer.ok());
  const BpeTokenizer& bpe = tokenizer->tokenizer();
  std::vector<std::string> texts = {"emoji 🎨🖌️👩‍🎨 flags 🇫🇷 skin 👍🏽",
                                    "café naïve Ærøskøbing Straße İstanbul",
                                    "中文提示：把杯子变成红色。",
                                    "Ελληνικά русский עברית عربي",
                                    "tabs\tand\r\nlines\n\n",
                                    "  leading and trailing  ",
                                    "<|im_start|> inline <think>",
                                    ""};
  for (const auto split : {CaptionSplit::kTraining, CaptionSplit::kHeldOut}) {
    for (const std::string& caption : every_caption({5, kDarkWord}, split))
      texts.push_back(caption);
  }
  for (const std::string& text : texts) {
    INFO(text);
    const std::vector<int32_t> ids = bpe.encode(text);
    for (const int32_t id : ids) CHECK((id >= 0 && id < bpe.id_count()));
    CHECK(bpe.decode(ids) == text);
  }
}

TEST_CASE("training is deterministic and ties go to the smallest pair", "[train][bpe]") {
  const std::vector<std::string> corpus = training_caption_corpus();
  test::TempDir a, b;
  REQUIRE(write_tokenizer_folder(a.path(), corpus, kCaptionVocabSize).ok());
  REQUIRE(write_tokenizer_folder(b.path(), corpus, kCaptionVocabSize).ok());
  for (const char* file : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}) {
    INFO(file);
    CHECK(read_file(a.file(file)) == read_file(b.file(file)));
  }
  // "ab" and "cd" both occur twice: "a"+"b" sorts first. Then no pair occurs twice.
  auto tie = train_bpe({"ab", "cd", "ab", "cd", "ef"}, 300);
  REQUIRE(tie.ok());
  using Merge = std::pair<std::string, std::string>;
  CHECK(tie->merges == std::vector<Merge>{{"a", "b"}, {"c", "d"}});
  CHECK(tie->tokens.size() == 258);
  CHECK(tie->tokens[256] == "ab");
  // The size is a bound: a larger corpus stops at it.
  auto bounded = train_bpe(corpus, 300);
  REQUIRE(bounded.ok());
  CHECK(bounded->tokens.size() == 300);
}

TEST_CASE("the trainer refuses a vocabulary below the byte alphabet and invalid UTF-8",
          "[train][bpe]") {
  CHECK(!train_bpe({"blue"}, 255).ok());
  const auto bad = train_bpe({"blue", "bl\xFFue"}, 300);
  REQUIRE(!bad.ok());
  CHECK(bad.status().message().find("corpus line 2") != std::string::npos);
  test::TempDir dir;
  std::ofstream(dir.file("file")) << "x";
  CHECK(!write_tokenizer_folder(dir.file("file") + "/sub", {"blue"}, 300).ok());
}

TEST_CASE("on the caption corpus every colour and tone word is one token", "[train][bpe]") {
  test::TempDir dir;
  REQUIRE(write_tokenizer_folder(dir.path(), training_caption_corpus(), kCaptionVocabSize).ok());
  auto tokenizer = PromptTokenizer::load(dir.path());
  REQUIRE(tokenizer.ok());
  const BpeTokenizer& bpe = tokenizer->tokenizer();
  std::vector<std::string> words = vocabulary();
  words.push_back("grey");
  words.push_back("light");
  for (const std::string& word : words) {
    std::string capitalised = word;
    capitalised[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(word[0])));
    // As captions hold them: after a space, first in the caption, sentence-cased first.
    for (const std::string& form : {" " + word, word, capitalised}) {
      INFO("\"" << form << "\"");
      CHECK(bpe.encode(form).size() == 1);
    }
  }
  // Held-out captions use the same words, so they tokenize into known pieces.
  for (const std::vector<int>& label : every_label()) {
    for (const std::string& caption : every_caption(label, CaptionSplit::kHeldOut)) {
      const std::vector<int32_t> ids = bpe.encode(caption);
      CHECK(!ids.empty());
      CHECK(bpe.decode(ids) == caption);
    }
  }
}

TEST_CASE("added tokens in the corpus are split out, so rendered conversations train the frame",
          "[train][bpe]") {
  auto compact = recognise_chat_template(kCompactChatTemplate, "kCompactChatTemplate");
  REQUIRE(compact.ok());
  std::vector<std::string> corpus;
  for (const std::string& caption : training_caption_corpus())
    corpus.push_back(render_user_prompt(*compact, caption));
  auto vocabulary = train_bpe(corpus, kCaptionVocabSize);
  REQUIRE(vocabulary.ok());
  for (const std::string& token : vocabulary->tokens) {
    INFO(token);
    CHECK(token.find("<|") == std::string::npos);
    CHECK(token.find("think") == std::string::npos);
  }
  test::TempDir dir;
  REQUIRE(write_tokenizer_folder(dir.path(), *vocabulary).ok());
  auto tokenizer = PromptTokenizer::load(dir.path());
  REQUIRE(tokenizer.ok());
  for (const char* piece : {"user", "assistant", "\n\n", " blue"}) {
    INFO(piece);
    CHECK(tokenizer->tokenizer().encode(piece).size() == 1);
  }
  // Markers, "user", "\n", 4 words, marker, "\n", marker, "assistant", "\n", marker, "\n\n",
  // marker, "\n\n".
  CHECK(tokenizer->encode("make it dark blue", 64).real_length == 16);
}

TEST_CASE("the reference folder of check.sh is what the trainer writes", "[train][bpe]") {
  const std::string golden = kReferenceDir + "/trained";
  const std::vector<std::string> corpus = reference_prompts();
  REQUIRE(corpus.size() > 20);
  if (const char* update = std::getenv("INFILL_UPDATE_GOLDEN");
      update != nullptr && std::string(update) == "1") {
    REQUIRE(write_tokenizer_folder(golden, corpus, kGoldenVocabSize).ok());
  }
  test::TempDir dir;
  REQUIRE(write_tokenizer_folder(dir.path(), corpus, kGoldenVocabSize).ok());
  for (const char* file : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}) {
    INFO(golden << "/" << file
                << " differs from the trainer's output; after a deliberate change to the trainer "
                   "or prompts.jsonl, "
                   "regenerate it with INFILL_UPDATE_GOLDEN=1 infill_tests_train \"[bpe]\" and run "
                   "check.sh");
    CHECK(read_file(dir.file(file)) == read_file(golden + "/" + file));
  }
}
