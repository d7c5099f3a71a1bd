#pragma once
/// Copies a step's cached K/V from host memory to a GPU one block ahead of the forward that
/// reads them: block b + 1's copy runs on a copy stream while block b computes on the compute
/// stream (FlashPS's overlapped loading; on a GPU the bus is the slow tier), and the last
/// block of a step starts the copy of the next step's first block. From pinned host memory
/// (the RAM tier of a GPU worker, pipeline/pinned_host_memory.h) a copy is a DMA the host
/// never waits for; from pageable memory the driver stages it and the host waits for the
/// staging, but the GPU computes meanwhile.
///
/// Only the GPU waits: the compute stream waits on each block's copy event. Device buffers are
/// allocated on the copy stream and recorded as used by the compute stream, so libtorch's
/// caching allocator never hands one out again before the compute that reads it is done.
/// Device-generic c10 streams and events: no CUDA header, it builds against a CPU libtorch.
/// Threading: called by one step loop; not thread-safe.

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

namespace infill {

class DeviceKvPrefetch {
 public:
  /// The host slabs of (step, block): fp16 K and V, [tokens, hidden] row-major each, valid
  /// until the copies of that block are done (the owner keeps them alive).
  using HostSlabs = std::function<std::pair<const uint16_t*, const uint16_t*>(int step, int block)>;

  /// `steps` x `blocks` slabs of [tokens, hidden]; `device` must be a GPU (c10 streams).
  /// `read_ahead` false: a block's copy starts only when it is asked for (the host slabs of
  /// later blocks may not exist yet: a disk stream reads them meanwhile).
  DeviceKvPrefetch(c10::Device device, int steps, int blocks, int64_t tokens, int64_t hidden, HostSlabs slabs,
                   bool read_ahead = true);
  /// Waits for the copies still in flight: their host memory may be freed next.
  ~DeviceKvPrefetch();
  DeviceKvPrefetch(const DeviceKvPrefetch&) = delete;
  DeviceKvPrefetch& operator=(const DeviceKvPrefetch&) = delete;

  /// The device copies ([tokens, hidden] fp16) of (step, block), ready for whatever the
  /// compute stream runs next; starts the copy of the block after. Asking again for the
  /// block just returned (the second segment of a guided step) copies nothing.
  void get(int step, int block, at::Tensor* k, at::Tensor* v);
  /// Waits until every copy started so far is done: their host slabs may be rewritten next.
  void synchronize() const;

  const c10::Device& device() const { return device_; }
  /// Bytes copied to the device so far, and how many of the blocks asked for had their copy
  /// started ahead (the rest started when asked for: a step's first block, a skipped step).
  int64_t bytes_copied() const { return bytes_copied_; }
  int64_t prefetched() const { return prefetched_; }
  int64_t copied_on_demand() const { return on_demand_; }

 private:
  struct Copy {
    explicit Copy(c10::DeviceType type) : done(type) {}
    int step = -1;
    int block = -1;
    at::Tensor k, v;
    c10::Event done;
  };
  std::unique_ptr<Copy> start(int step, int block);

  const c10::Device device_;
  const int steps_, blocks_;
  const int64_t tokens_, hidden_;
  const HostSlabs slabs_;
  const bool read_ahead_;
  const c10::Stream copy_stream_;
  std::unique_ptr<Copy> current_;  // the block last returned
  std::unique_ptr<Copy> next_;     // the block after it, in flight
  int64_t bytes_copied_ = 0;
  int64_t prefetched_ = 0;
  int64_t on_demand_ = 0;
};

}  // namespace infill
