#include "pipeline/streamed_kv.h"

#include <chrono>
#include <cstring>

#include <ATen/ATen.h>

#include "pipeline/cached_kv.h"
#include "pipeline/pinned_host_memory.h"

namespace infill {

namespace {

HostBuffer allocate_slabs(const ActivationLayout& layout, const c10::Device& device) {
  const size_t bytes = static_cast<size_t>(layout.blocks) * layout.block_bytes();
  const HostAllocator pinned = entry_allocator_for(device);
  return pinned ? pinned(bytes) : allocate_plain_host(bytes);
}

}  // namespace

StreamedKvSource::StreamedKvSource(std::shared_ptr<ActivationStore> store, ActivationKey key,
                                   ActivationLayout layout, c10::Device compute_device)
    : store_(std::move(store)),
      key_(std::move(key)),
      layout_(layout),
      slabs_(allocate_slabs(layout, compute_device)),
      thread_([this] { io_loop(); }) {}

uint16_t* StreamedKvSource::k_slab(int block) const {
  return static_cast<uint16_t*>(slabs_.get()) + static_cast<size_t>(block) * 2 * layout_.slab_elements();
}

uint16_t* StreamedKvSource::v_slab(int block) const { return k_slab(block) + layout_.slab_elements(); }

StreamedKvSource::~StreamedKvSource() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void StreamedKvSource::start_step(int step, int first_block) {
  // The slabs are read again for this step: the copies of the last one must be done with them.
  if (device_copies_) device_copies_->synchronize();
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return next_block_ >= end_block_; });
  step_ = step;
  next_block_ = first_block;
  ready_below_ = first_block;
  end_block_ = layout_.blocks;
  lock.unlock();
  cv_.notify_all();
}

void StreamedKvSource::io_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || next_block_ < end_block_; });
    if (stop_) return;
    const int block = next_block_;
    const int step = step_;
    lock.unlock();  // never hold the lock during disk I/O
    const auto t0 = std::chrono::steady_clock::now();
    Status st = store_->read_slab(key_, step, block, k_slab(block), v_slab(block));
    if (!st.ok()) std::memset(k_slab(block), 0, layout_.block_bytes());  // zeros, as fetch gives
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    lock.lock();
    if (!st.ok() && status_.ok()) status_ = st;
    read_ms_total_ += ms;
    ++slabs_read_;
    ready_below_ = block + 1;
    ++next_block_;
    cv_.notify_all();
  }
}

void StreamedKvSource::wait_for(int block, std::unique_lock<std::mutex>& lock) {
  cv_.wait(lock, [&] { return ready_below_ > block || next_block_ >= end_block_; });
}

void StreamedKvSource::fetch(int block, at::Tensor& k, at::Tensor& v) {
  std::unique_lock<std::mutex> lock(mutex_);
  wait_for(block, lock);
  const bool failed = !status_.ok();
  lock.unlock();
  if (failed) {
    k.zero_();
    v.zero_();
    return;
  }
  fp16_slab_to_float(k_slab(block), k);
  fp16_slab_to_float(v_slab(block), v);
}

bool StreamedKvSource::fp16_slabs(int block, const uint16_t** k, const uint16_t** v) {
  std::unique_lock<std::mutex> lock(mutex_);
  wait_for(block, lock);
  if (!status_.ok()) return false;
  *k = k_slab(block);
  *v = v_slab(block);
  return true;
}

bool StreamedKvSource::device_tensors(int block, const at::Device& device, at::Tensor* k, at::Tensor* v) {
  if (device.is_cpu()) return false;
  int step = 0;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    wait_for(block, lock);  // the copy reads the slab: its read must be done
    step = step_;
  }
  if (!device_copies_ || device_copies_->device() != device) {
    device_copies_ = std::make_unique<DeviceKvPrefetch>(
        device, layout_.steps, layout_.blocks, layout_.tokens, layout_.hidden,
        [this](int, int b) { return std::pair<const uint16_t*, const uint16_t*>(k_slab(b), v_slab(b)); },
        /*read_ahead=*/false);
  }
  device_copies_->get(step, block, k, v);
  return true;
}

Status StreamedKvSource::status() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return status_;
}

double StreamedKvSource::mean_slab_read_ms() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return slabs_read_ == 0 ? 0.0 : read_ms_total_ / static_cast<double>(slabs_read_);
}

}  // namespace infill
