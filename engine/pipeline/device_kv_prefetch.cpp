#include "pipeline/device_kv_prefetch.h"

#include <ATen/ATen.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

namespace infill {

namespace {

c10::Stream copy_stream_for(const c10::Device& device) {
  TORCH_CHECK(!device.is_cpu(), "DeviceKvPrefetch copies to a GPU, not to ", device.str());
  return c10::impl::VirtualGuardImpl(device.type()).getStreamFromGlobalPool(device);
}

}  // namespace

DeviceKvPrefetch::DeviceKvPrefetch(c10::Device device, int steps, int blocks, int64_t tokens, int64_t hidden,
                                   HostSlabs slabs, bool read_ahead)
    : device_(device),
      steps_(steps),
      blocks_(blocks),
      tokens_(tokens),
      hidden_(hidden),
      slabs_(std::move(slabs)),
      read_ahead_(read_ahead),
      copy_stream_(copy_stream_for(device)) {}

void DeviceKvPrefetch::synchronize() const { copy_stream_.synchronize(); }

DeviceKvPrefetch::~DeviceKvPrefetch() {
  // A forward that threw may have left even the current block's copy unfinished.
  if (next_ || current_) copy_stream_.synchronize();
}

std::unique_ptr<DeviceKvPrefetch::Copy> DeviceKvPrefetch::start(int step, int block) {
  auto copy = std::make_unique<Copy>(device_.type());
  copy->step = step;
  copy->block = block;
  const auto [k, v] = slabs_(step, block);
  // Allocated and filled on the copy stream: the compute stream's queue is not in the way.
  c10::StreamGuard on_copy_stream(copy_stream_);
  const auto device_half = at::TensorOptions().dtype(at::kHalf).device(device_);
  copy->k = at::empty({tokens_, hidden_}, device_half);
  copy->v = at::empty({tokens_, hidden_}, device_half);
  copy->k.copy_(at::from_blob(const_cast<uint16_t*>(k), {tokens_, hidden_}, at::kHalf), /*non_blocking=*/true);
  copy->v.copy_(at::from_blob(const_cast<uint16_t*>(v), {tokens_, hidden_}, at::kHalf), /*non_blocking=*/true);
  copy->done.record(copy_stream_);
  bytes_copied_ += 2 * tokens_ * hidden_ * static_cast<int64_t>(sizeof(uint16_t));
  return copy;
}

void DeviceKvPrefetch::get(int step, int block, at::Tensor* k, at::Tensor* v) {
  TORCH_CHECK(step >= 0 && step < steps_ && block >= 0 && block < blocks_, "DeviceKvPrefetch: (step ", step,
              ", block ", block, ") is outside ", steps_, " steps x ", blocks_, " blocks");
  if (!current_ || current_->step != step || current_->block != block) {
    std::unique_ptr<Copy> copy;
    if (next_ && next_->step == step && next_->block == block) {
      copy = std::move(next_);
      ++prefetched_;
    } else {
      next_.reset();  // a guess that missed; its buffers return to the copy stream's pool
      copy = start(step, block);
      ++on_demand_;
    }
    const c10::Stream compute = c10::impl::VirtualGuardImpl(device_.type()).getStream(device_);
    copy->done.block(compute);
    copy->k.record_stream(compute);
    copy->v.record_stream(compute);
    current_ = std::move(copy);
    const bool last_block = block + 1 == blocks_;
    const int next_step = last_block ? step + 1 : step;
    if (read_ahead_ && next_step < steps_) next_ = start(next_step, last_block ? 0 : block + 1);
  }
  *k = current_->k;
  *v = current_->v;
}

}  // namespace infill
