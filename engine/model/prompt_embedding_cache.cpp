#include "model/prompt_embedding_cache.h"

namespace infill {

int64_t PromptEmbedding::bytes() const { return rows.defined() ? static_cast<int64_t>(rows.nbytes()) : 0; }

std::string PromptEmbeddingCache::key_of(const std::string& encoder, const std::string& prompt) {
  std::string key = encoder;
  key += '\0';  // no encoder id holds a NUL, so (encoder, prompt) pairs cannot collide
  key += prompt;
  return key;
}

std::shared_ptr<const PromptEmbedding> PromptEmbeddingCache::find(const std::string& encoder, const std::string& prompt) {
  std::lock_guard lock(mutex_);
  const auto it = index_.find(key_of(encoder, prompt));
  if (it == index_.end()) {
    ++counters_.misses;
    return nullptr;
  }
  lru_.splice(lru_.begin(), lru_, it->second);
  ++counters_.hits;
  return it->second->value;
}

void PromptEmbeddingCache::insert(const std::string& encoder, const std::string& prompt,
                                  std::shared_ptr<const PromptEmbedding> value) {
  if (!value || value->bytes() > budget_) return;
  std::lock_guard lock(mutex_);
  const std::string key = key_of(encoder, prompt);
  if (const auto it = index_.find(key); it != index_.end()) {
    bytes_ -= it->second->value->bytes();
    lru_.erase(it->second);
    index_.erase(it);
  }
  bytes_ += value->bytes();
  lru_.push_front(Entry{key, std::move(value)});
  index_[key] = lru_.begin();
  while (bytes_ > budget_ && !lru_.empty()) {
    bytes_ -= lru_.back().value->bytes();
    index_.erase(lru_.back().key);
    lru_.pop_back();
    ++counters_.evictions;
  }
}

PromptEmbeddingCache::Stats PromptEmbeddingCache::stats() const {
  std::lock_guard lock(mutex_);
  Stats s = counters_;
  s.entries = static_cast<int64_t>(lru_.size());
  s.bytes = bytes_;
  s.budget = budget_;
  return s;
}

}  // namespace infill
