#pragma once
// Helpers shared by the cache tests: a self-removing temp directory and entries filled with
// reproducible random fp16 bit patterns.

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>

#include "cache/activation_entry.h"
#include "support/temp_dir.h"

namespace infill::test {


inline ActivationKey make_key(int id, const std::string& model = "dit-test@0123abcd") {
  ActivationKey key;
  key.model_id = model;
  key.template_hash = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
  key.width = 32;
  key.height = 32;
  key.steps = 4;
  key.sampler = "euler_rf";
  key.seed = static_cast<uint64_t>(id);
  return key;
}

/// Every element an arbitrary 16-bit pattern (NaNs and infinities included): the cache must
/// move bits, not values.
inline std::shared_ptr<ActivationEntry> make_entry(ActivationLayout layout, uint64_t seed) {
  auto entry = std::make_shared<ActivationEntry>(layout);
  std::mt19937_64 rng(seed);
  uint16_t* data = entry->data();
  const size_t n = layout.total_elements();
  for (size_t i = 0; i < n; ++i) data[i] = static_cast<uint16_t>(rng());
  return entry;
}

inline bool same_bits(const ActivationEntry& a, const ActivationEntry& b) {
  return a.layout() == b.layout() && std::memcmp(a.data(), b.data(), a.bytes()) == 0;
}

}  // namespace infill::test
