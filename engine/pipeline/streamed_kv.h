#pragma once
/// Streams one step's cached K/V from the activation store while the step loop computes:
/// an I/O thread reads the (step, block) slabs in block order and `fetch(block)` waits only
/// for the slab it needs, so loading block b+1 overlaps the compute of block b (the
/// overlapped loading of FlashPS). Used when a template's entry is in the disk tier; blocks
/// before `first_block` are recomputed on all tokens instead (see cache/load_plan.h).
///
/// For a forward on a GPU the slabs are read into pinned memory and each block crosses the bus
/// on a copy stream once its read is done (DeviceKvPrefetch without read-ahead: a block's copy
/// starts when the forward asks for it, since later blocks may not be read yet). The host then
/// waits for the disk only; the copy and the compute queued before it overlap on the GPU.
///
/// Threading: start_step() and fetch() are called by the step loop; the I/O thread owns the
/// reads. A read error never throws across the thread: fetch() then fills zeros and
/// status() reports the error, which the caller must check after the forward.

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "cache/activation_store.h"
#include "cache/host_memory.h"
#include "common/status.h"
#include "model/dit.h"
#include "pipeline/device_kv_prefetch.h"

namespace infill {

class StreamedKvSource final : public KvSource {
 public:
  /// `compute_device`: where the forward that reads the slabs runs (a GPU gets pinned slabs).
  StreamedKvSource(std::shared_ptr<ActivationStore> store, ActivationKey key, ActivationLayout layout,
                   c10::Device compute_device = c10::Device(c10::kCPU));
  ~StreamedKvSource() override;
  StreamedKvSource(const StreamedKvSource&) = delete;
  StreamedKvSource& operator=(const StreamedKvSource&) = delete;

  /// Begins reading the slabs of `step` for blocks [first_block, blocks). Waits for the reads
  /// of the previous step to finish first (their buffers are reused).
  void start_step(int step, int first_block);
  void fetch(int block, at::Tensor& k, at::Tensor& v) override;
  /// Waits for the block like fetch; false after a read error (fetch then gives zeros).
  bool fp16_slabs(int block, const uint16_t** k, const uint16_t** v) override;
  /// On a GPU: waits for the block's read, then copies it there on the copy stream (zeros
  /// after a read error, as fetch).
  bool device_tensors(int block, const at::Device& device, at::Tensor* k, at::Tensor* v) override;
  /// The copies to a GPU so far (null before a forward on a GPU read a block).
  const DeviceKvPrefetch* device_copies() const { return device_copies_.get(); }

  const ActivationLayout& layout() const { return layout_; }
  /// The first read error, or ok.
  Status status() const;
  /// Mean milliseconds one slab (K and V of one block) took to read so far; 0 before any read.
  double mean_slab_read_ms() const;

 private:
  void io_loop();
  // Waits until `block` of the current step is read (or the reads ended).
  void wait_for(int block, std::unique_lock<std::mutex>& lock);
  uint16_t* k_slab(int block) const;
  uint16_t* v_slab(int block) const;

  std::shared_ptr<ActivationStore> store_;
  ActivationKey key_;
  ActivationLayout layout_;
  HostBuffer slabs_;  // per block its K then its V slab, [tokens * hidden] each; pinned for a GPU

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  int step_ = -1;
  int next_block_ = 0;   // next block the I/O thread reads
  int end_block_ = 0;    // reads stop here
  int ready_below_ = 0;  // blocks [first_block, ready_below_) are loaded
  bool stop_ = false;
  Status status_;
  double read_ms_total_ = 0;
  int64_t slabs_read_ = 0;
  // Declared after slabs_: destroyed first, so no copy still reads the slabs when they go.
  std::unique_ptr<DeviceKvPrefetch> device_copies_;
  std::thread thread_;
};

}  // namespace infill
