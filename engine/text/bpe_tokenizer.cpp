#include "text/bpe_tokenizer.h"

#include <algorithm>
#include <fstream>

#include <nlohmann/json.hpp>

#include "text/utf8.h"

namespace infill {

namespace {

using json = nlohmann::json;

char32_t decode_one(std::string_view s, size_t& i) {
  const auto lead = static_cast<unsigned char>(s[i]);
  const size_t len = utf8_sequence_length(lead);
  char32_t cp = len == 1 ? lead : len == 2 ? (lead & 0x1F) : len == 3 ? (lead & 0x0F) : (lead & 0x07);
  for (size_t k = 1; k < len && i + k < s.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += len;
  return cp;
}

bool is_word_char(unsigned char c) { return std::isalnum(c) || c == '_' || c >= 0x80; }

bool is_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

}  // namespace

BpeTokenizer::~BpeTokenizer() = default;

namespace {

Status unsupported(const std::string& path, const std::string& field, const json& value) {
  return invalid_argument(path + ": " + field + " " + value.dump() +
                          " is not supported (expected a byte-level BPE tokenizer: NFC or no normalizer, "
                          "Split + ByteLevel pre-tokenizer, BPE model, ByteLevel decoder)");
}

}  // namespace

Result<std::shared_ptr<const BpeTokenizer>> BpeTokenizer::load(const std::string& path) {
  std::ifstream in(path);
  if (!in) return not_found(path + " is missing (expected a Hugging Face tokenizer.json)");
  json doc;
  try {
    doc = json::parse(in);
  } catch (const json::exception& e) {
    return corrupt_data(path + " is not valid JSON (truncated?): " + e.what());
  }
  if (!doc.is_object() || !doc.contains("model") || !doc["model"].is_object()) {
    return corrupt_data(path + " has no \"model\" object (expected a Hugging Face tokenizer.json)");
  }
  std::shared_ptr<BpeTokenizer> tok(new BpeTokenizer());
  tok->path_ = path;

  INFILL_ASSIGN_OR_RETURN(tok->pre_tokenizer_, PreTokenizer::from_json(doc, path));
  const json& decoder = doc.value("decoder", json());
  if (!decoder.is_object() || decoder.value("type", "") != "ByteLevel") return unsupported(path, "decoder", decoder);

  // Model.
  const json& model = doc["model"];
  if (model.value("type", "BPE") != "BPE") return unsupported(path, "model.type", model["type"]);
  if (!model.value("dropout", json()).is_null() && model["dropout"].get<double>() > 0) {
    return unsupported(path, "model.dropout", model["dropout"]);
  }
  for (const char* field : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json& v = model.value(field, json());
    if (!v.is_null() && !(v.is_string() && v.get<std::string>().empty())) return unsupported(path, std::string("model.") + field, v);
  }
  tok->ignore_merges_ = model.value("ignore_merges", false);
  if (!model.contains("vocab") || !model["vocab"].is_object() || model["vocab"].empty()) {
    return corrupt_data(path + ": model.vocab is missing or empty (expected token -> id)");
  }
  int32_t max_id = -1;
  for (const auto& [token, id] : model["vocab"].items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > 10'000'000) {
      return corrupt_data(path + ": model.vocab[\"" + token + "\"] is " + id.dump() + " (expected an id >= 0)");
    }
    tok->vocab_.emplace(token, id.get<int32_t>());
    max_id = std::max(max_id, id.get<int32_t>());
  }
  for (const char* byte_char_check : {"!", "\xC4\xA0"}) {  // '!' and 'Ġ' (the space byte)
    if (!tok->vocab_.count(byte_char_check)) {
      return corrupt_data(path + ": model.vocab lacks the byte-level token \"" + std::string(byte_char_check) +
                          "\" (expected all 256 byte characters of a byte-level BPE)");
    }
  }
  if (!model.contains("merges") || !model["merges"].is_array()) {
    return corrupt_data(path + ": model.merges is missing (expected a list of merges)");
  }
  tok->merge_rank_.reserve(model["merges"].size() * 2);
  int32_t rank = 0;
  for (const json& m : model["merges"]) {
    std::string left, right;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos) return corrupt_data(path + ": merge " + m.dump() + " is not \"left right\"");
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      return corrupt_data(path + ": merge " + m.dump() + " is neither \"left right\" nor [left, right]");
    }
    if (!tok->vocab_.count(left) || !tok->vocab_.count(right) || !tok->vocab_.count(left + right)) {
      return corrupt_data(path + ": merge " + m.dump() + " names a token outside model.vocab");
    }
    tok->merge_rank_.emplace(left + '\x01' + right, rank++);
  }

  // Added tokens.
  for (const json& a : doc.value("added_tokens", json::array())) {
    AddedToken t;
    if (!a.contains("id") || !a.contains("content") || !a["content"].is_string() || a["content"].get<std::string>().empty()) {
      return corrupt_data(path + ": added token " + a.dump() + " has no id or content");
    }
    t.id = a["id"].get<int32_t>();
    t.content = a["content"].get<std::string>();
    t.special = a.value("special", false);
    t.lstrip = a.value("lstrip", false);
    t.rstrip = a.value("rstrip", false);
    t.single_word = a.value("single_word", false);
    max_id = std::max(max_id, t.id);
    tok->added_.push_back(std::move(t));
  }
  std::stable_sort(tok->added_.begin(), tok->added_.end(),
                   [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });

  tok->id_count_ = max_id + 1;
  tok->id_to_token_.assign(static_cast<size_t>(tok->id_count_), std::string());
  tok->id_is_special_.assign(static_cast<size_t>(tok->id_count_), false);
  for (const auto& [token, id] : tok->vocab_) tok->id_to_token_[static_cast<size_t>(id)] = token;
  for (const AddedToken& t : tok->added_) {
    tok->id_to_token_[static_cast<size_t>(t.id)] = t.content;
    tok->id_is_special_[static_cast<size_t>(t.id)] = true;  // decoded as written, never byte-mapped
  }
  return std::shared_ptr<const BpeTokenizer>(std::move(tok));
}

int32_t BpeTokenizer::token_id(std::string_view token) const {
  for (const AddedToken& t : added_) {
    if (t.content == token) return t.id;
  }
  const auto it = vocab_.find(std::string(token));
  return it == vocab_.end() ? -1 : it->second;
}

void BpeTokenizer::encode_word(const std::string& word, std::vector<int32_t>& out) const {
  if (ignore_merges_) {
    if (const auto it = vocab_.find(word); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  {
    std::lock_guard lock(cache_mutex_);
    if (const auto it = word_cache_.find(word); it != word_cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  // Symbols: the word's characters; then merge the adjacent pair of lowest rank (leftmost
  // among equals) until no pair has a rank, as the `tokenizers` BPE model does.
  std::vector<std::string> symbols;
  for (size_t i = 0; i < word.size();) {
    const size_t len = utf8_sequence_length(static_cast<unsigned char>(word[i]));
    symbols.push_back(word.substr(i, len));
    i += len;
  }
  while (symbols.size() > 1) {
    int32_t best_rank = INT32_MAX;
    size_t best = 0;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      const auto it = merge_rank_.find(symbols[i] + '\x01' + symbols[i + 1]);
      if (it != merge_rank_.end() && it->second < best_rank) {
        best_rank = it->second;
        best = i;
      }
    }
    if (best_rank == INT32_MAX) break;
    symbols[best] += symbols[best + 1];
    symbols.erase(symbols.begin() + static_cast<std::ptrdiff_t>(best) + 1);
  }
  std::vector<int32_t> ids;
  ids.reserve(symbols.size());
  for (const std::string& s : symbols) {
    // A character outside the vocabulary (impossible with all 256 byte characters present,
    // which load checks) is dropped, as the library does without an unk token.
    if (const auto it = vocab_.find(s); it != vocab_.end()) ids.push_back(it->second);
  }
  out.insert(out.end(), ids.begin(), ids.end());
  std::lock_guard lock(cache_mutex_);
  if (word_cache_.size() > 100'000) word_cache_.clear();  // bounded: prompts are short, words repeat
  word_cache_.emplace(word, std::move(ids));
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view raw) const {
  const std::string text = utf8_lossy(raw);
  std::vector<int32_t> out;
  // Split on added tokens first: leftmost match, longest at that position.
  size_t pos = 0;
  const auto encode_plain = [&](size_t begin, size_t end) {
    if (end <= begin) return;
    for (const std::string& word : pre_tokenizer_.split(std::string_view(text).substr(begin, end - begin))) {
      encode_word(word, out);
    }
  };
  while (pos < text.size()) {
    size_t found_at = std::string::npos;
    const AddedToken* found = nullptr;
    for (size_t i = pos; i < text.size() && found == nullptr; ++i) {
      for (const AddedToken& t : added_) {
        if (text.compare(i, t.content.size(), t.content) != 0) continue;
        if (t.single_word) {
          const bool before_ok = i == 0 || !is_word_char(static_cast<unsigned char>(text[i - 1]));
          const size_t after = i + t.content.size();
          const bool after_ok = after >= text.size() || !is_word_char(static_cast<unsigned char>(text[after]));
          if (!before_ok || !after_ok) continue;
        }
        found_at = i;
        found = &t;
        break;
      }
    }
    if (found == nullptr) {
      encode_plain(pos, text.size());
      break;
    }
    size_t plain_end = found_at;
    if (found->lstrip) {
      while (plain_end > pos && is_space(static_cast<unsigned char>(text[plain_end - 1]))) --plain_end;
    }
    encode_plain(pos, plain_end);
    out.push_back(found->id);
    pos = found_at + found->content.size();
    if (found->rstrip) {
      while (pos < text.size() && is_space(static_cast<unsigned char>(text[pos]))) ++pos;
    }
  }
  return out;
}

std::string BpeTokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string bytes;
  for (const int32_t id : ids) {
    if (id < 0 || id >= id_count_) continue;
    const std::string& token = id_to_token_[static_cast<size_t>(id)];
    if (id_is_special_[static_cast<size_t>(id)]) {
      const bool special = std::any_of(added_.begin(), added_.end(), [&](const AddedToken& t) { return t.id == id && t.special; });
      if (!(skip_special && special)) bytes += token;
      continue;
    }
    for (size_t i = 0; i < token.size();) {
      const char32_t cp = decode_one(token, i);
      if (const int byte = byte_level_byte(cp); byte >= 0) bytes += static_cast<char>(byte);
    }
  }
  return utf8_lossy(bytes);
}

}  // namespace infill
