#pragma once
/// Streams one step's cached K/V from the activation store while the step loop computes:
/// an I/O thread reads the (step, block) slabs in block order and `fetch(block)` waits only
/// for the slab it needs, so loading block b+1 overlaps the compute of block b (the
/// overlapped loading of FlashPS). Used when a template's entry is in the disk tier; blocks
/// before `first_block` are recomputed on all tokens instead (see cache/load_plan.h).
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

#include "cache/activation_store.h"
#include "common/status.h"
#include "model/dit.h"

namespace infill {

class StreamedKvSource final : public KvSource {
 public:
  StreamedKvSource(std::shared_ptr<ActivationStore> store, ActivationKey key, ActivationLayout layout);
  ~StreamedKvSource() override;
  StreamedKvSource(const StreamedKvSource&) = delete;
  StreamedKvSource& operator=(const StreamedKvSource&) = delete;

  /// Begins reading the slabs of `step` for blocks [first_block, blocks). Waits for the reads
  /// of the previous step to finish first (their buffers are reused).
  void start_step(int step, int first_block);
  void fetch(int block, at::Tensor& k, at::Tensor& v) override;
  /// Waits for the block like fetch; false after a read error (fetch then gives zeros).
  bool fp16_slabs(int block, const uint16_t** k, const uint16_t** v) override;

  const ActivationLayout& layout() const { return layout_; }
  /// The first read error, or ok.
  Status status() const;
  /// Mean milliseconds one slab (K and V of one block) took to read so far; 0 before any read.
  double mean_slab_read_ms() const;

 private:
  void io_loop();

  std::shared_ptr<ActivationStore> store_;
  ActivationKey key_;
  ActivationLayout layout_;
  std::vector<std::vector<uint16_t>> k_slabs_, v_slabs_;  // per block, [tokens * hidden]

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
  std::thread thread_;
};

}  // namespace infill
