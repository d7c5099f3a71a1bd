#pragma once
/// Free-text prompts to the text rows of FLUX.2 [klein]: the model folder's tokenizer (chat
/// template, thinking off, truncated and padded to 512 tokens) and its Qwen3 encoder (hidden
/// states 9, 18 and 27 stacked), as diffusers' Flux2KleinPipeline._get_qwen3_prompt_embeds
/// makes them, with a PromptEmbeddingCache in front.
///
/// Memory: a 4B encoder beside a 4B transformer fits 24 GiB, a 9B pair does not. With
/// Residency::kUnloadAfterEncode the encoder's weights are unmapped after each encoding and
/// mapped again on the next cache miss (seconds: the load checks every weight);
/// text_encoder_residency() picks the policy from the sizes and the machine's memory.
/// Threading: encode may be called from several threads; encodings run one at a time.

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "model/prompt_embedding_cache.h"
#include "model/qwen3_encoder.h"
#include "text/prompt_tokenizer.h"

namespace infill {

enum class Residency { kKeep = 1, kUnloadAfterEncode = 2 };

/// kUnloadAfterEncode when the transformer and encoder weights with a quarter more for
/// activations exceed `memory_bytes` (the machine's RAM, or a device's memory).
Residency text_encoder_residency(int64_t transformer_bytes, int64_t encoder_bytes, int64_t memory_bytes);

/// Whether the encoder goes on the transformer's GPU: its weights (`encoder_bytes` at most)
/// with a quarter more for activations, beside `reserved_bytes` (the device K/V tier's
/// budget), fit in the device's `free_bytes` once the transformer is there. On a GPU a klein
/// prompt encodes in milliseconds, on the CPU in seconds.
bool text_encoder_fits_device(int64_t encoder_bytes, int64_t reserved_bytes, int64_t free_bytes);

/// Bytes the weights of a Qwen3 folder take once loaded (its files' tensors; FP8 ones held in
/// bf16, twice their size), or 0 when unreadable.
int64_t qwen3_folder_weight_bytes(const std::string& encoder_dir);

class Qwen3PromptEncoder {
 public:
  struct Options {
    int max_length = 512;
    std::vector<int> layers = klein_text_layers();
    Residency residency = Residency::kKeep;
    /// A CUDA device: the encoder computes there in bf16 (Qwen3Encoder::on_device), kept
    /// resident. Where it does not fit when loaded, it stays on the CPU (`placement` says why).
    ComputeDevice device;
  };

  /// Loads the tokenizer and (unless unloading after each encode) the encoder. `cache` may be
  /// shared by several encoders (entries are keyed by encoder); nullptr disables caching.
  static Result<std::unique_ptr<Qwen3PromptEncoder>> load(const std::string& tokenizer_dir, const std::string& encoder_dir,
                                                          std::shared_ptr<PromptEmbeddingCache> cache, Options options);

  /// The text rows for `prompt`, from the cache or encoded now. Errors: the encoder failed to
  /// (re)load, naming the file.
  Result<std::shared_ptr<const PromptEmbedding>> encode(std::string_view prompt);

  /// Unmaps the encoder's weights now (the next cache miss maps them again).
  void unload();
  bool resident() const;
  /// Width of a text row: layers x hidden size.
  int context_dim() const { return context_dim_; }
  const PromptTokenizer& tokenizer() const { return tokenizer_; }
  const std::string& id() const { return id_; }
  /// Where the encoder computes: "cpu", "cuda:0", or "cpu (cuda:0: <why not there>)".
  std::string placement() const;
  /// The encoder computes on Options::device, a GPU (its rows are bf16's).
  bool on_gpu() const;

 private:
  Qwen3PromptEncoder() = default;
  PromptTokenizer tokenizer_;
  std::string encoder_dir_;
  std::string id_;  // the cache's encoder key: folder, rows and layers
  Options options_;
  int context_dim_ = 0;
  std::shared_ptr<PromptEmbeddingCache> cache_;
  mutable std::mutex mutex_;  // guards encoder_ and serialises encodings
  std::shared_ptr<const Qwen3Encoder> encoder_;
  std::string placement_ = "cpu";
  // Loads the encoder and moves it to options_.device where one is given (falling back to
  // the CPU, noted in placement_). Called with mutex_ held, or before the object is shared.
  Status load_encoder();
  bool on_gpu_locked() const { return options_.device.cuda && placement_ == options_.device.name(); }
};

}  // namespace infill
