#include "pipeline/cached_kv.h"

#include <cstring>

#include <ATen/ATen.h>

#include "kernels/half_convert.h"

namespace infill {

void fp16_slab_to_float(const uint16_t* slab, at::Tensor& out) {
  TORCH_CHECK(out.is_contiguous() && out.scalar_type() == at::kFloat, "fp16_slab_to_float needs a contiguous float tensor");
  kernels::half_to_float(slab, out.data_ptr<float>(), out.numel());
}

void float_to_fp16_slab(const at::Tensor& in, uint16_t* slab) {
  if (!in.device().is_cpu() || in.scalar_type() != at::kFloat) {
    // A GPU forward's K/V (bf16 or float): narrowed to fp16 on the device, so half the bytes
    // (of float32) cross to the host. bf16 -> fp16 keeps every bit of a bf16 value in range.
    const at::Tensor half = in.to(at::kHalf).contiguous().to(at::kCPU);
    std::memcpy(slab, half.data_ptr<at::Half>(), static_cast<size_t>(half.numel()) * sizeof(uint16_t));
    return;
  }
  const at::Tensor rows = in.contiguous();  // K and V arrive as strided views of the qkv rows
  kernels::float_to_half(rows.data_ptr<float>(), slab, rows.numel());
}

EntryKvSource::EntryKvSource(std::shared_ptr<const ActivationEntry> entry, int step,
                             std::shared_ptr<const DeviceKvEntry> resident, int block_offset, int block_count)
    : entry_(std::move(entry)),
      resident_(std::move(resident)),
      step_(step),
      block_offset_(block_offset),
      block_count_(block_count > 0 ? block_count : entry_->layout().blocks - block_offset) {
  TORCH_CHECK(block_offset >= 0 && block_count_ > 0 && block_offset + block_count_ <= entry_->layout().blocks,
              "EntryKvSource: blocks [", block_offset, ", ", block_offset + block_count_, ") of an entry of ",
              entry_->layout().blocks);
}

std::unique_ptr<EntryKvSource> EntryKvSource::another_reader() const {
  return std::make_unique<EntryKvSource>(entry_, step_, resident_, block_offset_, block_count_);
}

void EntryKvSource::fetch(int block, at::Tensor& k, at::Tensor& v) {
  fp16_slab_to_float(entry_->k(step_, block_offset_ + block), k);
  fp16_slab_to_float(entry_->v(step_, block_offset_ + block), v);
}

bool EntryKvSource::fp16_slabs(int block, const uint16_t** k, const uint16_t** v) {
  *k = entry_->k(step_, block_offset_ + block);
  *v = entry_->v(step_, block_offset_ + block);
  return true;
}

bool EntryKvSource::device_kv_rows(int block, const at::Device& device, at::Tensor* kv) {
  if (!resident_ || resident_->kv(step_, block_offset_ + block).device() != device) return false;
  *kv = resident_->kv(step_, block_offset_ + block);
  return true;
}

bool EntryKvSource::device_tensors(int block, const at::Device& device, at::Tensor* k, at::Tensor* v) {
  if (resident_ && resident_->kv(step_, block_offset_ + block).device() == device) {
    *k = resident_->k(step_, block_offset_ + block);
    *v = resident_->v(step_, block_offset_ + block);
    return true;
  }
  if (device.is_cpu()) return false;
  if (!prefetch_ || prefetch_->device() != device) {
    const ActivationLayout& layout = entry_->layout();
    prefetch_ = std::make_unique<DeviceKvPrefetch>(
        device, layout.steps, block_count_, layout.tokens, layout.hidden, [this](int step, int b) {
          return std::pair<const uint16_t*, const uint16_t*>(entry_->k(step, block_offset_ + b),
                                                             entry_->v(step, block_offset_ + b));
        });
  }
  prefetch_->get(step_, block, k, v);
  return true;
}

void EntryKvSink::store(int block, const at::Tensor& k, const at::Tensor& v) {
  float_to_fp16_slab(k, entry_.k(step_, block_offset_ + block));
  float_to_fp16_slab(v, entry_.v(step_, block_offset_ + block));
}

void EntryKvSink::store_rows(int block, const at::Tensor& positions, const at::Tensor& k, const at::Tensor& v) {
  const int64_t rows = positions.size(0), H = k.size(1);
  TORCH_CHECK(k.size(0) == rows && v.size(0) == rows, "EntryKvSink::store_rows: ", rows, " positions for ", k.size(0),
              " rows");
  const int64_t* p = positions.data_ptr<int64_t>();
  uint16_t* k_slab = entry_.k(step_, block_offset_ + block);
  uint16_t* v_slab = entry_.v(step_, block_offset_ + block);
  // A rank's rows are a few runs of consecutive positions (its text and its image share).
  for (int64_t begin = 0; begin < rows;) {
    int64_t end = begin + 1;
    while (end < rows && p[end] == p[end - 1] + 1) ++end;
    float_to_fp16_slab(k.narrow(0, begin, end - begin), k_slab + p[begin] * H);
    float_to_fp16_slab(v.narrow(0, begin, end - begin), v_slab + p[begin] * H);
    begin = end;
  }
}

void RepeatingKvSource::fetch(int block, at::Tensor& k, at::Tensor& v) {
  if (block != block_) {
    if (!k_.defined() || !k_.sizes().equals(k.sizes())) {
      k_ = at::empty_like(k);
      v_ = at::empty_like(v);
    }
    inner_->fetch(block, k_, v_);
    block_ = block;
  }
  k.copy_(k_);
  v.copy_(v_);
}

bool RepeatingKvSource::fp16_slabs(int block, const uint16_t** k, const uint16_t** v) {
  return inner_->fp16_slabs(block, k, v);
}

}  // namespace infill
