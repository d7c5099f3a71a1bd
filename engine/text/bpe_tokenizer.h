#pragma once
/// A byte-level BPE tokenizer read from a Hugging Face `tokenizer.json` (the Qwen, GPT-2 and
/// Llama-3 family), encoding and decoding as the `tokenizers` library does for the parts the
/// file declares:
///
/// - added tokens (special or not) are split out of the text first, leftmost and longest
///   match, honouring their `lstrip` / `rstrip` / `single_word` flags;
/// - normalizer: none, or NFC (ICU), or a Sequence of those;
/// - pre-tokenizer: `Split` by a regex (behaviour Isolated or Removed, PCRE2 in UTF and
///   Unicode-property mode, so `\p{L}`, `\s` and look-ahead mean what Oniguruma means by
///   them) followed by `ByteLevel` without its own regex; or `ByteLevel` with the GPT-2
///   regex; or a Sequence of those;
/// - model: BPE with `vocab`, `merges` (as "a b" strings or ["a", "b"] pairs) and
///   `ignore_merges`, without dropout, continuing-subword prefix or end-of-word suffix;
/// - decoder: ByteLevel (invalid UTF-8 becomes U+FFFD, as `errors="replace"` does).
///
/// Anything else the file declares (another model type, a normalizer the library does not
/// implement) is refused at load, naming the file and the field, never silently ignored.
/// Threading: immutable after load except an internal word cache guarded by a mutex; encode
/// and decode may run on several threads at once.

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "text/pretokenizer.h"

namespace infill {

class BpeTokenizer {
 public:
  struct AddedToken {
    int32_t id = 0;
    std::string content;
    bool special = false;
    bool lstrip = false;
    bool rstrip = false;
    bool single_word = false;
  };

  /// Reads and checks `path` (a tokenizer.json). Errors name the file and the field.
  static Result<std::shared_ptr<const BpeTokenizer>> load(const std::string& path);
  ~BpeTokenizer();

  /// Token ids of `text`. Added tokens in the text are recognised (the chat template's
  /// `<|im_start|>` becomes one id).
  std::vector<int32_t> encode(std::string_view text) const;
  /// Text of `ids`; `skip_special` drops special added tokens. Unknown ids are skipped.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const;

  /// The id of a token (vocabulary or added), or -1.
  int32_t token_id(std::string_view token) const;
  /// One past the largest id (vocabulary and added tokens): rows an embedding must have.
  int32_t id_count() const { return id_count_; }
  const std::string& path() const { return path_; }
  const std::vector<AddedToken>& added_tokens() const { return added_; }

 private:
  BpeTokenizer() = default;
  void encode_word(const std::string& word, std::vector<int32_t>& out) const;

  std::string path_;
  PreTokenizer pre_tokenizer_;
  bool ignore_merges_ = false;
  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;  // vocabulary and added tokens by id
  std::vector<bool> id_is_special_;
  // Merge ranks keyed by "left\x01right" (byte-level strings never contain U+0001).
  std::unordered_map<std::string, int32_t> merge_rank_;
  std::vector<AddedToken> added_;  // longest content first, for leftmost-longest matching
  int32_t id_count_ = 0;

  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> word_cache_;
};

}  // namespace infill
