#include "cache/activation_entry.h"

#include <cstring>
#include <new>

#include "common/hash.h"

namespace infill {

std::string ActivationKey::canonical() const {
  return "model=" + model_id + ";template=" + template_hash + ";w=" + std::to_string(width) +
         ";h=" + std::to_string(height) + ";steps=" + std::to_string(steps) +
         ";sampler=" + sampler + ";seed=" + std::to_string(seed) + (conditioning.empty() ? "" : ";cond=" + conditioning) +
         (adapters.empty() ? "" : ";adapters=" + adapters) + (references.empty() ? "" : ";refs=" + references);
}

std::string ActivationKey::digest() const { return hex64(fnv1a64(canonical())); }

std::string_view canonical_key_field(std::string_view canonical, std::string_view name) {
  // Fields after the model's are ";name=value"; no value holds a ';'.
  std::string marker = ";";
  marker += name;
  marker += '=';
  const size_t at = canonical.find(marker);
  if (at == std::string_view::npos) return {};
  const size_t begin = at + marker.size();
  const size_t end = canonical.find(';', begin);
  return canonical.substr(begin, end == std::string_view::npos ? std::string_view::npos : end - begin);
}

ActivationEntry::ActivationEntry(ActivationLayout layout, const HostAllocator& allocate)
    : layout_(layout),
      storage_(allocate ? allocate(layout_.total_bytes()) : allocate_plain_host(layout_.total_bytes())) {
  if (storage_ == nullptr) throw std::bad_alloc();
  data_ = static_cast<uint16_t*>(storage_.get());
  std::memset(data_, 0, layout_.total_bytes());
}

ActivationEntry::~ActivationEntry() = default;

uint16_t* ActivationEntry::slab(int step, int block, int kv) const {
  const size_t index = (static_cast<size_t>(step) * layout_.blocks + block) * 2 + kv;
  return data_ + index * layout_.slab_elements();
}

}  // namespace infill
