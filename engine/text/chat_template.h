#pragma once
/// The chat template a tokenizer folder declares, recognised rather than interpreted: the
/// engine renders exactly one conversation (one user turn holding the prompt, then the
/// generation prompt with thinking off, as FLUX.2 [klein] asks its Qwen3 encoder) and does so
/// only for templates whose text it knows by hash, each checked against the Jinja engine of
/// Hugging Face (`@huggingface/jinja`) by tests/reference/tokenizer. A template it does not
/// know is refused, naming the file and the hash, rather than rendered wrongly.
/// Pure functions; thread-safe.

#include <string>
#include <string_view>

#include "common/status.h"

namespace infill {

struct ChatTemplate {
  enum class Kind {
    /// Qwen3's template (Qwen3-4B, Qwen3-8B; the FLUX.2 [klein] text encoders), rendered
    /// with add_generation_prompt and enable_thinking false.
    kQwen3 = 1,
    /// The short template of the project's own tokenizers (tools/train/bpe_trainer writes
    /// it), whose rendering of one user turn is byte-identical to Qwen3's.
    kQwen3Compact = 2,
  };
  Kind kind = Kind::kQwen3;
  std::string sha256;  ///< of the template text with trailing white space removed
};

/// Recognises `text` (read from `where`, named in errors).
Result<ChatTemplate> recognise_chat_template(std::string_view text, const std::string& where);

/// The conversation text for one user prompt, generation prompt appended, thinking off.
std::string render_user_prompt(const ChatTemplate& chat_template, std::string_view prompt);

}  // namespace infill
