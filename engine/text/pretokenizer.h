#pragma once
/// The normalisation and pre-tokenisation a byte-level BPE `tokenizer.json` declares: what
/// turns a stretch of text (between added tokens) into the words that BPE merges within, each
/// written in GPT-2's byte-level alphabet. BpeTokenizer encodes with it, and the project's BPE
/// trainer (tools/train/bpe_trainer) counts words with it, so a vocabulary is trained on
/// exactly the words the engine later encodes.
///
/// Supported, as BpeTokenizer documents: normalizer none, NFC or a Sequence of those;
/// pre-tokenizer `Split` by a regex (Isolated or Removed; PCRE2 in UTF and Unicode-property
/// mode) and `ByteLevel` (with or without GPT-2's regex), or a Sequence of those, which must
/// include a ByteLevel step. Anything else is refused, naming the file and the field.
/// Threading: immutable after from_json; split may run on several threads at once.

#include <array>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/status.h"

namespace infill {

class PreTokenizer {
 public:
  /// Reads the "normalizer" and "pre_tokenizer" fields of the tokenizer.json `doc`; `path`
  /// names the file in errors.
  static Result<PreTokenizer> from_json(const nlohmann::json& doc, const std::string& path);

  /// The words of `text` (valid UTF-8, added tokens already split out), normalised, split and
  /// mapped to byte-level characters, in order.
  std::vector<std::string> split(std::string_view text) const;

  struct Regex;  // compiled PCRE2 pattern (defined in the .cpp)

 private:
  bool nfc_ = false;
  std::vector<std::shared_ptr<const Regex>> splits_;  // applied in order
  std::vector<bool> split_removes_;                   // Removed (true) or Isolated (false)
  bool byte_level_prefix_space_ = false;
};

/// GPT-2's byte-level alphabet: the UTF-8 text of the character standing for each byte
/// (printable bytes stand for themselves, the others are shifted to U+0100 and up).
const std::array<std::string, 256>& byte_level_alphabet();

/// The byte that byte-level character `character` stands for, or -1 outside the alphabet.
int byte_level_byte(char32_t character);

}  // namespace infill
