#pragma once
/// Text-encoder outputs kept per (encoder, prompt), least recently used first out, within a
/// byte budget: live painting and batch jobs repeat one prompt many times, and a Qwen3-4B
/// encoding costs seconds on a CPU while a hit costs a map lookup.
/// Threading: every member may be called from several threads at once.

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include <ATen/core/Tensor.h>

namespace infill {

/// One encoded prompt: the rows a FLUX.2 transformer reads as text tokens.
struct PromptEmbedding {
  at::Tensor rows;         ///< float32 [max_length, context_dim], padding rows included
  int real_length = 0;     ///< tokens before padding
  int full_length = 0;     ///< tokens of the rendered prompt before truncation
  bool truncated = false;  ///< the prompt was cut to max_length tokens (upstream truncates too)
  int64_t bytes() const;
};

class PromptEmbeddingCache {
 public:
  explicit PromptEmbeddingCache(int64_t budget_bytes) : budget_(budget_bytes) {}

  /// The entry for (`encoder`, `prompt`), now the most recently used, or nullptr.
  std::shared_ptr<const PromptEmbedding> find(const std::string& encoder, const std::string& prompt);
  /// Adds or replaces an entry and evicts the least recently used until the budget holds. An
  /// entry larger than the whole budget is not kept.
  void insert(const std::string& encoder, const std::string& prompt, std::shared_ptr<const PromptEmbedding> value);

  struct Stats {
    int64_t hits = 0, misses = 0, evictions = 0, entries = 0, bytes = 0, budget = 0;
  };
  Stats stats() const;

 private:
  struct Entry {
    std::string key;
    std::shared_ptr<const PromptEmbedding> value;
  };
  static std::string key_of(const std::string& encoder, const std::string& prompt);

  mutable std::mutex mutex_;
  const int64_t budget_;
  int64_t bytes_ = 0;
  std::list<Entry> lru_;  // front: most recently used
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
  Stats counters_;
};

}  // namespace infill
