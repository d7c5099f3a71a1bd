#pragma once
/// The cached activations of one prepared template: for every denoising step and every
/// transformer block, K and V of all tokens in fp16 (IEEE binary16 bit patterns).
/// Torch-free so that the cache tiers, checksums and disk format stay simple.
///
/// Layout of `data()`: [steps][blocks][2 (K, V)][tokens][hidden], contiguous, 64-byte aligned.
/// Threading: filled by one writer (the prepare job), then shared read-only as
/// `std::shared_ptr<const ActivationEntry>`.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "cache/host_memory.h"

namespace infill {

/// What a cached entry depends on. Two edits may share an entry only if every field matches.
struct ActivationKey {
  std::string model_id;       ///< model name plus a digest of its weights
  std::string template_hash;  ///< hex digest of the template image bytes
  int width = 0;              ///< latent grid width the model ran at (in latent pixels)
  int height = 0;
  int steps = 0;              ///< length of the sampler schedule
  std::string sampler;        ///< "euler_rf", "ddim", ...
  uint64_t seed = 0;          ///< seed of the template's fixed noise
  /// What else the entry was recorded under: "" for the template alone (the DiT family's
  /// entries, FLUX.2's template-keyed ones under the empty prompt); a prompt's digest for a
  /// FLUX.2 prompt-keyed entry.
  std::string conditioning;
  /// The LoRAs the entry was recorded with, with their strengths (adapter_set_key): a LoRA
  /// changes the K/V of every token. "" for none.
  std::string adapters;
  /// The reference images' ids in the entry's sequence, comma-separated; "" for none.
  std::string references;

  /// Canonical text form, e.g. "model=..;template=..;w=64;h=64;steps=20;sampler=euler_rf;seed=7".
  std::string canonical() const;
  /// 16 hex digits of a 64-bit hash of canonical(); used as the disk file name.
  std::string digest() const;
  bool operator==(const ActivationKey&) const = default;
};

/// The value of the field `name` ("cond", "adapters", "refs") in a canonical key, as a disk
/// file's header holds it; empty when the key has no such field.
std::string_view canonical_key_field(std::string_view canonical, std::string_view name);

struct ActivationLayout {
  int steps = 0;
  int blocks = 0;
  int tokens = 0;
  int hidden = 0;
  /// Elements in one K (or V) slab: tokens * hidden.
  size_t slab_elements() const { return static_cast<size_t>(tokens) * hidden; }
  /// Bytes of one block's K and V at one step (the unit a stream reads and a GPU copies).
  size_t block_bytes() const { return 2 * slab_elements() * sizeof(uint16_t); }
  size_t total_elements() const { return static_cast<size_t>(steps) * blocks * 2 * slab_elements(); }
  size_t total_bytes() const { return total_elements() * sizeof(uint16_t); }
  bool operator==(const ActivationLayout&) const = default;
};

class ActivationEntry {
 public:
  /// Allocates zero-filled storage for `layout` from `allocate` (plain host memory when empty;
  /// pinned memory on a GPU worker).
  explicit ActivationEntry(ActivationLayout layout, const HostAllocator& allocate = {});
  ~ActivationEntry();
  ActivationEntry(const ActivationEntry&) = delete;
  ActivationEntry& operator=(const ActivationEntry&) = delete;

  const ActivationLayout& layout() const { return layout_; }
  /// K of all tokens at (step, block): [tokens, hidden] fp16.
  uint16_t* k(int step, int block) { return slab(step, block, 0); }
  uint16_t* v(int step, int block) { return slab(step, block, 1); }
  const uint16_t* k(int step, int block) const { return slab(step, block, 0); }
  const uint16_t* v(int step, int block) const { return slab(step, block, 1); }
  uint16_t* data() { return data_; }
  const uint16_t* data() const { return data_; }
  size_t bytes() const { return layout_.total_bytes(); }

 private:
  uint16_t* slab(int step, int block, int kv) const;
  ActivationLayout layout_;
  HostBuffer storage_;
  uint16_t* data_ = nullptr;
};

}  // namespace infill
