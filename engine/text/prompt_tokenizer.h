#pragma once
/// A model's tokenizer folder (`tokenizer/` of a diffusers folder, or any folder holding
/// `tokenizer.json` and `tokenizer_config.json`) turned into the fixed-length token rows a
/// text encoder reads, as FLUX.2 [klein]'s pipeline makes them: the prompt rendered through
/// the folder's chat template, tokenized, truncated at the end to `max_length` and padded at
/// the end with the pad token, with an attention mask of 1 for real tokens and 0 for padding.
/// Threading: immutable after load; encode may run on several threads at once.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "text/bpe_tokenizer.h"
#include "text/chat_template.h"

namespace infill {

struct PromptTokens {
  std::vector<int32_t> ids;    ///< max_length ids
  std::vector<uint8_t> mask;   ///< 1 for real tokens, 0 for padding
  int real_length = 0;         ///< tokens before padding (<= max_length)
  bool truncated = false;      ///< the rendered prompt had more than max_length tokens
  int full_length = 0;         ///< tokens of the rendered prompt before truncation
};

class PromptTokenizer {
 public:
  /// Reads `dir`/tokenizer.json and `dir`/tokenizer_config.json; the chat template comes from
  /// `dir`/chat_template.jinja when present, else the config's "chat_template". Errors name the
  /// file and what was expected (a missing pad token, an unknown template, ...).
  static Result<PromptTokenizer> load(const std::string& dir);

  /// The chat text for `prompt` (the template's user turn and generation prompt).
  std::string render(std::string_view prompt) const;
  PromptTokens encode(std::string_view prompt, int max_length) const;

  const BpeTokenizer& tokenizer() const { return *tokenizer_; }
  int32_t pad_id() const { return pad_id_; }
  const ChatTemplate& chat_template() const { return template_; }

 private:
  std::shared_ptr<const BpeTokenizer> tokenizer_;
  ChatTemplate template_;
  int32_t pad_id_ = 0;
};

}  // namespace infill
