#pragma once
/// A byte-level BPE trainer for the bundled model's own tokenizer: learns merges from a corpus
/// of text the project may ship and writes a tokenizer folder the engine's PromptTokenizer
/// loads (tokenizer.json shaped as Qwen3's, tokenizer_config.json, chat_template.jinja).
///
/// Words are counted with the engine's own pre-tokenizer (engine/text/pretokenizer.h) built
/// from the very JSON this trainer writes (NFC, Qwen3's Split regex, ByteLevel), so training
/// and encoding see the same words. Training is deterministic: the most frequent adjacent pair
/// is merged first, ties going to the pair whose (left, right) token texts compare smallest
/// bytewise; the same corpus and size give a byte-identical tokenizer.json.
/// Pure functions; thread-safe.

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/status.h"

namespace infill::train {

/// Qwen3's pre-tokenizer regex (its tokenizer.json "Split" pattern), copied verbatim.
inline constexpr const char* kQwen3SplitPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

/// The chat template our tokenizer folders ship as chat_template.jinja (written by us, not
/// Qwen's): one `<|im_start|>role\ncontent<|im_end|>\n` per message, then Qwen3's generation
/// prompt, with the empty think block when enable_thinking is false. For one user turn it
/// renders byte-identically to Qwen3's template; the engine recognises it by its sha256
/// (ChatTemplate::Kind::kQwen3Compact in engine/text/chat_template.cpp).
inline constexpr const char* kCompactChatTemplate =
    R"({%- for message in messages %}{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}{%- endfor %})"
    R"({%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }})"
    R"({%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- endif %})"
    R"({%- endif %})";

/// The added tokens, in id order right after the BPE vocabulary: Qwen3's tokens that the chat
/// rendering uses, with Qwen3's flags (the first three special, the think tags not).
/// "<|endoftext|>" is the pad token, as in FLUX.2 [klein]'s tokenizer.
const std::vector<std::string>& added_token_texts();

/// Pairs that occur fewer times than this in the corpus are never merged.
inline constexpr long kMinPairCount = 2;

/// A trained byte-level BPE.
struct BpeVocabulary {
  /// Token texts (in GPT-2's byte-level alphabet) by id: the 256 byte characters in byte
  /// order, then each new merge result in the order it was learned.
  std::vector<std::string> tokens;
  /// Merges in rank order (left, right).
  std::vector<std::pair<std::string, std::string>> merges;
};

/// Learns merges from `corpus` until the vocabulary holds `vocab_size` tokens (256 byte
/// characters + merge results; the added tokens come on top) or no pair occurs
/// kMinPairCount times. Errors: vocab_size < 256; a corpus string that is not valid UTF-8.
/// Added-token texts inside corpus strings are split out first and never trained on, as the
/// engine's encode does, so a corpus may hold whole rendered conversations: then the
/// template's own text ("user", "assistant", "\n\n") gets tokens too.
Result<BpeVocabulary> train_bpe(const std::vector<std::string>& corpus, int vocab_size);

/// The tokenizer.json of `vocabulary`, structured as Qwen3's (NFC normalizer; Split with
/// kQwen3SplitPattern, Isolated, then ByteLevel without regex; BPE model; ByteLevel
/// post-processor and decoder; added_token_texts() with ids from vocabulary.tokens.size()).
nlohmann::ordered_json tokenizer_json(const BpeVocabulary& vocabulary);

/// The tokenizer_config.json matching tokenizer_json(vocabulary): pad token "<|endoftext|>",
/// eos "<|im_end|>", no BOS, added_tokens_decoder, no chat_template (it is in its own file).
nlohmann::ordered_json tokenizer_config_json(const BpeVocabulary& vocabulary);

/// Trains on `corpus` (train_bpe) and writes `dir`/tokenizer.json, `dir`/tokenizer_config.json
/// and `dir`/chat_template.jinja (kCompactChatTemplate), creating `dir` if needed; the folder
/// loads with PromptTokenizer::load. Errors name the file or argument at fault.
Status write_tokenizer_folder(const std::string& dir, const std::vector<std::string>& corpus,
                              int vocab_size);

/// Writes an already trained `vocabulary` as write_tokenizer_folder does.
Status write_tokenizer_folder(const std::string& dir, const BpeVocabulary& vocabulary);

}  // namespace infill::train
