#pragma once
/// Bridges between the model's K/V hooks and the activation cache's fp16 entries.

#include <memory>

#include <ATen/core/Tensor.h>

#include "cache/activation_entry.h"
#include "model/kv_io.h"
#include "pipeline/device_kv_entry.h"
#include "pipeline/device_kv_prefetch.h"

namespace infill {

/// Reads the K/V of one step of a RAM-resident entry, converting fp16 to float32; with the
/// entry's copy on a GPU (`resident`, the device tier) a forward there reads that instead, and
/// without one a forward on a GPU gets each block copied there one block ahead
/// (DeviceKvPrefetch: the copy of block b + 1 overlaps the compute of block b).
/// The source reads the entry's blocks [block_offset, block_offset + block_count) as its
/// blocks 0, 1, ...: an entry may hold two sequences' K/V one after the other (a guided
/// prompt-keyed entry: the prompted half, then the null half). block_count 0: to the end.
class EntryKvSource final : public KvSource {
 public:
  EntryKvSource(std::shared_ptr<const ActivationEntry> entry, int step,
                std::shared_ptr<const DeviceKvEntry> resident = nullptr, int block_offset = 0, int block_count = 0);
  void set_step(int step) { step_ = step; }
  void fetch(int block, at::Tensor& k, at::Tensor& v) override;
  bool fp16_slabs(int block, const uint16_t** k, const uint16_t** v) override;
  bool device_tensors(int block, const at::Device& device, at::Tensor* k, at::Tensor* v) override;
  /// The resident copy's rows when it is on `device` (never the prefetched copies: they are
  /// fp16, and a bf16 forward converts them anyway).
  bool device_kv_rows(int block, const at::Device& device, at::Tensor* kv) override;
  /// The copies to a GPU so far (null before a forward on a GPU read a block it had no
  /// resident copy of).
  const DeviceKvPrefetch* prefetch() const { return prefetch_.get(); }
  /// A new source reading what this one reads at its step now, for another thread (a rank of
  /// a sequence-parallel step: sources are read by one thread each). Safe from any thread
  /// while this source is not set to another step.
  std::unique_ptr<EntryKvSource> another_reader() const;

 private:
  std::shared_ptr<const ActivationEntry> entry_;
  std::shared_ptr<const DeviceKvEntry> resident_;
  int step_;
  int block_offset_;
  int block_count_;
  // After entry_: destroyed first, so its copies in flight finish before the entry can go.
  std::unique_ptr<DeviceKvPrefetch> prefetch_;
};

/// Writes fresh K/V of one step into an entry being filled by the prepare job, as fp16; block b
/// lands in the entry's block `block_offset` + b (as EntryKvSource reads it).
class EntryKvSink final : public KvSink {
 public:
  EntryKvSink(ActivationEntry& entry, int step, int block_offset = 0)
      : entry_(entry), step_(step), block_offset_(block_offset) {}
  void set_step(int step) { step_ = step; }
  void store(int block, const at::Tensor& k, const at::Tensor& v) override;
  void store_rows(int block, const at::Tensor& positions, const at::Tensor& k, const at::Tensor& v) override;

 private:
  ActivationEntry& entry_;
  int step_;
  int block_offset_;
};

/// Lets two segments of one forward (the prompted and null-prompt halves of a guided step)
/// read the same K/V: the first fetch of a block reads `inner`, a repeated fetch of the same
/// block copies what was read. Sources such as the streamed one may be read once per block.
class RepeatingKvSource final : public KvSource {
 public:
  explicit RepeatingKvSource(KvSource* inner) : inner_(inner) {}
  /// Forgets the held block (call at every step: the same block ids come again).
  void reset() { block_ = -1; }
  void fetch(int block, at::Tensor& k, at::Tensor& v) override;
  /// The inner source's slabs: reading them twice costs nothing, so nothing is held.
  bool fp16_slabs(int block, const uint16_t** k, const uint16_t** v) override;

 private:
  KvSource* inner_;  // not owned
  int block_ = -1;
  at::Tensor k_, v_;  // [L, H] float32 of block_
};

/// [tokens, hidden] fp16 slab -> float32 `out` (same shape, contiguous).
void fp16_slab_to_float(const uint16_t* slab, at::Tensor& out);
/// [tokens, hidden] (any strides; float32 on the CPU, or any float dtype on a GPU) -> fp16 slab.
void float_to_fp16_slab(const at::Tensor& in, uint16_t* slab);

}  // namespace infill
