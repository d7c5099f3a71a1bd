#include "cache/activation_entry.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "common/hash.h"

namespace infill {

std::string ActivationKey::canonical() const {
  return "model=" + model_id + ";template=" + template_hash + ";w=" + std::to_string(width) +
         ";h=" + std::to_string(height) + ";steps=" + std::to_string(steps) +
         ";sampler=" + sampler + ";seed=" + std::to_string(seed) + (conditioning.empty() ? "" : ";cond=" + conditioning);
}

std::string ActivationKey::digest() const { return hex64(fnv1a64(canonical())); }

ActivationEntry::ActivationEntry(ActivationLayout layout) : layout_(layout) {
  // Rounded up to the alignment, as std::aligned_alloc requires.
  const size_t bytes = (layout_.total_bytes() + 63) / 64 * 64;
  data_ = static_cast<uint16_t*>(std::aligned_alloc(64, bytes == 0 ? 64 : bytes));
  if (data_ == nullptr) throw std::bad_alloc();
  std::memset(data_, 0, bytes);
}

ActivationEntry::~ActivationEntry() { std::free(data_); }

uint16_t* ActivationEntry::slab(int step, int block, int kv) const {
  const size_t index = (static_cast<size_t>(step) * layout_.blocks + block) * 2 + kv;
  return data_ + index * layout_.slab_elements();
}

}  // namespace infill
