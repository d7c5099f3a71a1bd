#include "text/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#ifdef INFILL_HAVE_ICU
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>
#endif

#include <unordered_map>

#include <nlohmann/json.hpp>

#include "text/utf8.h"

namespace infill {

namespace {

using json = nlohmann::json;

struct ByteLevelTable {
  std::array<std::string, 256> byte_to_text;
  std::unordered_map<char32_t, uint8_t> char_to_byte;
  ByteLevelTable() {
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable =
          (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t cp = printable ? static_cast<char32_t>(b) : next++;
      byte_to_text[b] = utf8_encode(cp);
      char_to_byte[cp] = static_cast<uint8_t>(b);
    }
  }
};

const ByteLevelTable& byte_level() {
  static const ByteLevelTable table;
  return table;
}

// GPT-2's pre-tokenizer pattern, which ByteLevel applies when its `use_regex` is true.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

#ifdef INFILL_HAVE_ICU
std::string to_nfc(const std::string& text) {
  UErrorCode err = U_ZERO_ERROR;
  const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(err);
  if (U_FAILURE(err)) return text;
  const icu::UnicodeString u = icu::UnicodeString::fromUTF8(text);
  if (nfc->isNormalized(u, err) && U_SUCCESS(err)) return text;
  err = U_ZERO_ERROR;
  const icu::UnicodeString n = nfc->normalize(u, err);
  if (U_FAILURE(err)) return text;
  std::string out;
  n.toUTF8String(out);
  return out;
}
#else
// Without ICU (INFILL_WITH_ICU=OFF, the engine core scripts/gpu_check.sh builds), text is
// tokenized as written: exact for ASCII and for text already in NFC (what keyboards type),
// not for decomposed input. The default build always has ICU.
std::string to_nfc(const std::string& text) { return text; }
#endif

Status unsupported(const std::string& path, const std::string& field, const json& value) {
  return invalid_argument(
      path + ": " + field + " " + value.dump() +
      " is not supported (expected a byte-level BPE tokenizer: NFC or no normalizer, "
      "Split + ByteLevel pre-tokenizer, BPE model, ByteLevel decoder)");
}

}  // namespace

const std::array<std::string, 256>& byte_level_alphabet() { return byte_level().byte_to_text; }

int byte_level_byte(char32_t character) {
  const auto& map = byte_level().char_to_byte;
  const auto it = map.find(character);
  return it == map.end() ? -1 : it->second;
}

struct PreTokenizer::Regex {
  pcre2_code* code = nullptr;
  std::string pattern;
  ~Regex() {
    if (code != nullptr) pcre2_code_free(code);
  }
  static Result<std::shared_ptr<const Regex>> compile(const std::string& pattern,
                                                      const std::string& where) {
    auto regex = std::make_shared<Regex>();
    regex->pattern = pattern;
    int error = 0;
    PCRE2_SIZE offset = 0;
    regex->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
    if (regex->code == nullptr) {
      std::array<PCRE2_UCHAR, 256> message{};
      pcre2_get_error_message(error, message.data(), message.size());
      return invalid_argument(where + ": the pre-tokenizer pattern does not compile at offset " +
                              std::to_string(offset) + " (" +
                              reinterpret_cast<const char*>(message.data()) + ")");
    }
    pcre2_jit_compile(regex->code,
                      PCRE2_JIT_COMPLETE);  // best effort: falls back to the interpreter
    return std::shared_ptr<const Regex>(std::move(regex));
  }
  // [begin, end) byte ranges of every match in `text` (valid UTF-8).
  std::vector<std::pair<size_t, size_t>> matches(std::string_view text) const {
    std::vector<std::pair<size_t, size_t>> out;
    pcre2_match_data* data = pcre2_match_data_create_from_pattern(code, nullptr);
    size_t start = 0;
    while (start <= text.size()) {
      const int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(),
                                 start, 0, data, nullptr);
      if (rc < 0) break;
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(data);
      const size_t b = ov[0], e = ov[1];
      if (e == b) {  // an empty match: step over one character
        if (b >= text.size()) break;
        start = b + utf8_sequence_length(static_cast<unsigned char>(text[b]));
        continue;
      }
      out.emplace_back(b, e);
      start = e;
    }
    pcre2_match_data_free(data);
    return out;
  }
};

Result<PreTokenizer> PreTokenizer::from_json(const json& doc, const std::string& path) {
  PreTokenizer out;

  const auto read_normalizer = [&](const json& n, auto& self) -> Status {
    if (n.is_null()) return {};
    const std::string type = n.value("type", "");
    if (type == "NFC") {
      out.nfc_ = true;
      return {};
    }
    if (type == "Sequence" && n.contains("normalizers")) {
      for (const json& part : n["normalizers"]) INFILL_RETURN_IF_ERROR(self(part, self));
      return {};
    }
    return unsupported(path, "normalizer", n);
  };
  INFILL_RETURN_IF_ERROR(read_normalizer(doc.value("normalizer", json()), read_normalizer));

  bool byte_level = false;
  const auto read_pre = [&](const json& p, auto& self) -> Status {
    if (p.is_null()) return {};
    const std::string type = p.value("type", "");
    if (type == "Sequence" && p.contains("pretokenizers")) {
      for (const json& part : p["pretokenizers"]) INFILL_RETURN_IF_ERROR(self(part, self));
      return {};
    }
    if (type == "Split") {
      const json& pattern = p.value("pattern", json());
      if (!pattern.is_object() || !(pattern.contains("Regex") || pattern.contains("String"))) {
        return unsupported(path, "pre_tokenizer Split pattern", pattern);
      }
      const std::string behavior = p.value("behavior", "");
      if ((behavior != "Isolated" && behavior != "Removed") || p.value("invert", false)) {
        return unsupported(path, "pre_tokenizer Split behaviour", p);
      }
      std::string regex;
      if (pattern.contains("Regex")) {
        regex = pattern["Regex"].get<std::string>();
      } else {  // a literal string: quote it for PCRE2
        regex = "\\Q" + pattern["String"].get<std::string>() + "\\E";
      }
      INFILL_ASSIGN_OR_RETURN(auto compiled, Regex::compile(regex, path));
      out.splits_.push_back(std::move(compiled));
      out.split_removes_.push_back(behavior == "Removed");
      return {};
    }
    if (type == "ByteLevel") {
      byte_level = true;
      out.byte_level_prefix_space_ = p.value("add_prefix_space", false);
      if (p.value("use_regex", true)) {
        INFILL_ASSIGN_OR_RETURN(auto compiled, Regex::compile(kGpt2Pattern, path));
        out.splits_.push_back(std::move(compiled));
        out.split_removes_.push_back(false);
      }
      return {};
    }
    return unsupported(path, "pre_tokenizer", p);
  };
  INFILL_RETURN_IF_ERROR(read_pre(doc.value("pre_tokenizer", json()), read_pre));
  if (!byte_level)
    return unsupported(path, "pre_tokenizer (no ByteLevel step)",
                       doc.value("pre_tokenizer", json()));
  return out;
}

std::vector<std::string> PreTokenizer::split(std::string_view text) const {
  std::string normalized = nfc_ ? to_nfc(std::string(text)) : std::string(text);
  if (byte_level_prefix_space_ && !normalized.empty() && normalized[0] != ' ')
    normalized = " " + normalized;
  std::vector<std::string> pieces{normalized};
  for (size_t s = 0; s < splits_.size(); ++s) {
    std::vector<std::string> next;
    for (const std::string& piece : pieces) {
      size_t last = 0;
      for (const auto& [b, e] : splits_[s]->matches(piece)) {
        if (b > last) next.push_back(piece.substr(last, b - last));
        if (!split_removes_[s]) next.push_back(piece.substr(b, e - b));
        last = e;
      }
      if (last < piece.size()) next.push_back(piece.substr(last));
    }
    pieces = std::move(next);
  }
  const auto& alphabet = byte_level().byte_to_text;
  for (std::string& piece : pieces) {
    std::string mapped;
    mapped.reserve(piece.size() * 2);
    for (const char c : piece) mapped += alphabet[static_cast<unsigned char>(c)];
    piece = std::move(mapped);
  }
  return pieces;
}

}  // namespace infill
