#include "pipeline/streamed_kv.h"

#include <chrono>

#include <ATen/ATen.h>

#include "pipeline/cached_kv.h"

namespace infill {

StreamedKvSource::StreamedKvSource(std::shared_ptr<ActivationStore> store, ActivationKey key,
                                   ActivationLayout layout)
    : store_(std::move(store)),
      key_(std::move(key)),
      layout_(layout),
      k_slabs_(layout.blocks, std::vector<uint16_t>(layout.slab_elements())),
      v_slabs_(layout.blocks, std::vector<uint16_t>(layout.slab_elements())),
      thread_([this] { io_loop(); }) {}

StreamedKvSource::~StreamedKvSource() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void StreamedKvSource::start_step(int step, int first_block) {
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
    Status st = store_->read_slab(key_, step, block, k_slabs_[block].data(), v_slabs_[block].data());
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

void StreamedKvSource::fetch(int block, at::Tensor& k, at::Tensor& v) {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return ready_below_ > block || next_block_ >= end_block_; });
  const bool failed = !status_.ok();
  lock.unlock();
  if (failed) {
    k.zero_();
    v.zero_();
    return;
  }
  fp16_slab_to_float(k_slabs_[block].data(), k);
  fp16_slab_to_float(v_slabs_[block].data(), v);
}

bool StreamedKvSource::fp16_slabs(int block, const uint16_t** k, const uint16_t** v) {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return ready_below_ > block || next_block_ >= end_block_; });
  if (!status_.ok()) return false;
  *k = k_slabs_[block].data();
  *v = v_slabs_[block].data();
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
