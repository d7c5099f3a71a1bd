#include "bpe_trainer.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <queue>
#include <set>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "text/pretokenizer.h"
#include "text/utf8.h"

namespace infill::train {

namespace fs = std::filesystem;
using ordered_json = nlohmann::ordered_json;

namespace {

struct AddedToken {
  const char* text;
  bool special;
};
// Qwen3's flags: the think tags are added tokens but not special (decode keeps them).
constexpr AddedToken kAddedTokens[] = {{"<|endoftext|>", true},
                                       {"<|im_start|>", true},
                                       {"<|im_end|>", true},
                                       {"<think>", false},
                                       {"</think>", false}};

ordered_json pre_tokenizer_json() {
  return {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"},
             {"pattern", {{"Regex", kQwen3SplitPattern}}},
             {"behavior", "Isolated"},
             {"invert", false}},
            {{"type", "ByteLevel"},
             {"add_prefix_space", false},
             {"trim_offsets", false},
             {"use_regex", false}}}}};
}

ordered_json byte_level_json() {
  return {{"type", "ByteLevel"},
          {"add_prefix_space", false},
          {"trim_offsets", false},
          {"use_regex", false}};
}

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

// One distinct word of the corpus: its current symbols (token ids) and how often it occurs.
struct Word {
  std::vector<int32_t> symbols;
  int64_t count = 0;
};

class Trainer {
 public:
  explicit Trainer(const std::map<std::string, int64_t>& word_counts) {
    for (const std::string& text : byte_level_alphabet()) add_token(text);
    words_.reserve(word_counts.size());
    for (const auto& [text, count] : word_counts) {  // std::map: words in a fixed order
      Word w;
      w.count = count;
      for (size_t i = 0; i < text.size();) {
        const size_t len = utf8_sequence_length(static_cast<unsigned char>(text[i]));
        w.symbols.push_back(token_ids_.at(text.substr(i, len)));
        i += len;
      }
      words_.push_back(std::move(w));
    }
    for (size_t w = 0; w < words_.size(); ++w) count_pairs(w, +1);
    for (const auto& [key, count] : pair_counts_) push(key, count);
    touched_.clear();
  }

  BpeVocabulary run(int vocab_size) {
    BpeVocabulary out;
    while (static_cast<int>(tokens_.size()) < vocab_size) {
      const auto best = pop_best();
      if (!best) break;
      const auto [left, right] = *best;
      const std::string text = tokens_[left] + tokens_[right];
      const int32_t merged = add_token(text);
      out.merges.emplace_back(tokens_[left], tokens_[right]);
      apply(left, right, merged);
    }
    out.tokens = tokens_;
    return out;
  }

 private:
  struct Entry {
    int64_t count;
    int32_t left, right;
  };
  // Heap order: the top is the highest count, then the smallest (left, right) texts.
  struct Below {
    const std::vector<std::string>* tokens;
    bool operator()(const Entry& a, const Entry& b) const {
      if (a.count != b.count) return a.count < b.count;
      const std::string &al = (*tokens)[a.left], &bl = (*tokens)[b.left];
      if (al != bl) return al > bl;
      return (*tokens)[a.right] > (*tokens)[b.right];
    }
  };

  int32_t add_token(const std::string& text) {
    const auto [it, inserted] = token_ids_.emplace(text, static_cast<int32_t>(tokens_.size()));
    if (inserted) tokens_.push_back(text);
    return it->second;
  }

  // Adds (sign +1) or removes (-1) the adjacent pairs of word `w` from the counts.
  void count_pairs(size_t w, int sign) {
    const Word& word = words_[w];
    for (size_t i = 0; i + 1 < word.symbols.size(); ++i) {
      const uint64_t key = pair_key(word.symbols[i], word.symbols[i + 1]);
      pair_counts_[key] += sign * word.count;
      if (sign > 0) pair_words_[key].insert(w);
      touched_.insert(key);
    }
  }

  void push(uint64_t key, int64_t count) {
    if (count >= kMinPairCount) {
      heap_.push({count, static_cast<int32_t>(key >> 32), static_cast<int32_t>(key & 0xFFFFFFFFu)});
    }
  }

  // The pair to merge next (Below's order). Heap entries go
  // stale when counts change; a stale entry is dropped when it surfaces (its pair was pushed
  // again with the new count).
  std::optional<std::pair<int32_t, int32_t>> pop_best() {
    while (!heap_.empty()) {
      const Entry e = heap_.top();
      heap_.pop();
      const auto it = pair_counts_.find(pair_key(e.left, e.right));
      if (it == pair_counts_.end() || it->second != e.count) continue;
      return std::make_pair(e.left, e.right);
    }
    return std::nullopt;
  }

  void apply(int32_t left, int32_t right, int32_t merged) {
    const uint64_t key = pair_key(left, right);
    const auto where = pair_words_.find(key);
    if (where == pair_words_.end()) return;
    const std::vector<size_t> affected(where->second.begin(), where->second.end());
    touched_.clear();
    for (const size_t w : affected) {
      count_pairs(w, -1);
      std::vector<int32_t>& s = words_[w].symbols;
      std::vector<int32_t> next;
      next.reserve(s.size());
      for (size_t i = 0; i < s.size(); ++i) {
        if (i + 1 < s.size() && s[i] == left && s[i + 1] == right) {
          next.push_back(merged);
          ++i;
        } else {
          next.push_back(s[i]);
        }
      }
      s = std::move(next);
      count_pairs(w, +1);
    }
    // Stale word lists are harmless (a word no longer holding a pair contributes nothing when
    // recounted), so only the counts need care: push every changed pair again, drop zeros.
    for (const uint64_t k : touched_) {
      const auto it = pair_counts_.find(k);
      if (it->second <= 0) {
        pair_counts_.erase(it);
        pair_words_.erase(k);
      } else {
        push(k, it->second);
      }
    }
  }

  std::vector<std::string> tokens_;
  std::unordered_map<std::string, int32_t> token_ids_;
  std::vector<Word> words_;
  std::unordered_map<uint64_t, int64_t> pair_counts_;
  std::unordered_map<uint64_t, std::set<size_t>> pair_words_;
  std::unordered_set<uint64_t> touched_;
  std::priority_queue<Entry, std::vector<Entry>, Below> heap_{Below{&tokens_}};
};

// The stretches of `text` between added-token texts, which the engine's encode splits out
// first (leftmost, longest at a position; our added tokens have no strip or word flags).
std::vector<std::string_view> plain_stretches(std::string_view text) {
  std::vector<std::string_view> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t found_at = std::string_view::npos, found_size = 0;
    for (const AddedToken& t : kAddedTokens) {
      const std::string_view token(t.text);
      const size_t at = text.find(token, pos);
      if (at < found_at ||
          (at == found_at && at != std::string_view::npos && token.size() > found_size)) {
        found_at = at;
        found_size = token.size();
      }
    }
    if (found_at == std::string_view::npos) {
      out.push_back(text.substr(pos));
      break;
    }
    if (found_at > pos) out.push_back(text.substr(pos, found_at - pos));
    pos = found_at + found_size;
  }
  return out;
}

Status write_text(const fs::path& path, const std::string& text) {
  const fs::path partial = path.string() + ".partial";
  {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    out << text;
    if (!out.flush())
      return io_error(partial.string() + ": cannot write (disk full or read-only folder?)");
  }
  std::error_code ec;
  fs::rename(partial, path, ec);
  if (ec)
    return io_error(path.string() + ": cannot replace it with " + partial.string() + ": " +
                    ec.message());
  return {};
}

}  // namespace

const std::vector<std::string>& added_token_texts() {
  static const std::vector<std::string> texts = [] {
    std::vector<std::string> out;
    for (const AddedToken& t : kAddedTokens) out.emplace_back(t.text);
    return out;
  }();
  return texts;
}

Result<BpeVocabulary> train_bpe(const std::vector<std::string>& corpus, int vocab_size) {
  if (vocab_size < 256) {
    return invalid_argument(
        "vocab_size " + std::to_string(vocab_size) +
        " is too small (expected >= 256: the byte-level alphabet alone has 256 tokens)");
  }
  INFILL_ASSIGN_OR_RETURN(
      const PreTokenizer pre,
      PreTokenizer::from_json(tokenizer_json(BpeVocabulary{}), "the trainer's tokenizer.json"));
  std::map<std::string, int64_t> word_counts;
  for (size_t i = 0; i < corpus.size(); ++i) {
    if (utf8_lossy(corpus[i]) != corpus[i]) {
      return invalid_argument("corpus line " + std::to_string(i + 1) +
                              " is not valid UTF-8 (expected text)");
    }
    for (const std::string_view stretch : plain_stretches(corpus[i])) {
      for (std::string& word : pre.split(stretch)) ++word_counts[std::move(word)];
    }
  }
  return Trainer(word_counts).run(vocab_size);
}

ordered_json tokenizer_json(const BpeVocabulary& vocabulary) {
  ordered_json added = ordered_json::array();
  int32_t id = static_cast<int32_t>(vocabulary.tokens.size());
  for (const AddedToken& t : kAddedTokens) {
    added.push_back({{"id", id++},
                     {"content", t.text},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", t.special}});
  }
  ordered_json vocab = ordered_json::object();
  for (size_t i = 0; i < vocabulary.tokens.size(); ++i) vocab[vocabulary.tokens[i]] = i;
  ordered_json merges = ordered_json::array();
  for (const auto& [left, right] : vocabulary.merges) merges.push_back({left, right});
  ordered_json model = {{"type", "BPE"},
                        {"dropout", nullptr},
                        {"unk_token", nullptr},
                        {"continuing_subword_prefix", ""},
                        {"end_of_word_suffix", ""},
                        {"fuse_unk", false},
                        {"byte_fallback", false},
                        {"ignore_merges", false},
                        {"vocab", std::move(vocab)},
                        {"merges", std::move(merges)}};
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", std::move(added)},
          {"normalizer", {{"type", "NFC"}}},
          {"pre_tokenizer", pre_tokenizer_json()},
          {"post_processor", byte_level_json()},
          {"decoder", byte_level_json()},
          {"model", std::move(model)}};
}

ordered_json tokenizer_config_json(const BpeVocabulary& vocabulary) {
  ordered_json decoder = ordered_json::object();
  int32_t id = static_cast<int32_t>(vocabulary.tokens.size());
  for (const AddedToken& t : kAddedTokens) {
    decoder[std::to_string(id++)] = {{"content", t.text},    {"lstrip", false},
                                     {"normalized", false},  {"rstrip", false},
                                     {"single_word", false}, {"special", t.special}};
  }
  return {{"add_bos_token", false},
          {"add_prefix_space", false},
          {"added_tokens_decoder", std::move(decoder)},
          {"additional_special_tokens", ordered_json::array({"<|im_start|>", "<|im_end|>"})},
          {"bos_token", nullptr},
          {"clean_up_tokenization_spaces", false},
          {"eos_token", "<|im_end|>"},
          {"errors", "replace"},
          {"pad_token", "<|endoftext|>"},
          {"split_special_tokens", false},
          {"tokenizer_class", "Qwen2Tokenizer"},
          {"unk_token", nullptr}};
}

Status write_tokenizer_folder(const std::string& dir, const BpeVocabulary& vocabulary) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return io_error(dir + ": cannot create the tokenizer folder: " + ec.message());
  const fs::path root(dir);
  const auto dump = [](const ordered_json& j) { return j.dump(2, ' ', false) + "\n"; };
  INFILL_RETURN_IF_ERROR(write_text(root / "tokenizer.json", dump(tokenizer_json(vocabulary))));
  INFILL_RETURN_IF_ERROR(
      write_text(root / "tokenizer_config.json", dump(tokenizer_config_json(vocabulary))));
  // No trailing newline: Jinja engines differ on whether they keep one, and it would be output.
  return write_text(root / "chat_template.jinja", kCompactChatTemplate);
}

Status write_tokenizer_folder(const std::string& dir, const std::vector<std::string>& corpus,
                              int vocab_size) {
  INFILL_ASSIGN_OR_RETURN(const BpeVocabulary vocabulary, train_bpe(corpus, vocab_size));
  return write_tokenizer_folder(dir, vocabulary);
}

}  // namespace infill::train
