#include "pipeline/device_kv_entry.h"

#include <ATen/ATen.h>

namespace infill {

Result<std::shared_ptr<const DeviceKvEntry>> DeviceKvEntry::upload(const ActivationEntry& entry,
                                                                   const ComputeDevice& device) {
  INFILL_RETURN_IF_ERROR(check_compute_device(device));
  const ActivationLayout& layout = entry.layout();
  std::shared_ptr<DeviceKvEntry> out(new DeviceKvEntry());
  out->layout_ = layout;
  const at::Device where = device.torch_device();
  try {
    for (int step = 0; step < layout.steps; ++step) {
      for (int block = 0; block < layout.blocks; ++block) {
        auto slab = [&](const uint16_t* data) {
          return at::from_blob(const_cast<uint16_t*>(data), {layout.tokens, layout.hidden}, at::kHalf).to(where);
        };
        out->k_.push_back(slab(entry.k(step, block)));
        out->v_.push_back(slab(entry.v(step, block)));
      }
    }
  } catch (const c10::Error& e) {
    return Status(ErrorCode::kResourceExhausted, "activation entry to " + device.name() + " (" +
                                                     std::to_string(layout.total_bytes()) +
                                                     " bytes): " + e.what_without_backtrace());
  }
  return std::shared_ptr<const DeviceKvEntry>(std::move(out));
}

const at::Tensor& DeviceKvEntry::k(int step, int block) const { return k_.at(static_cast<size_t>(step) * layout_.blocks + block); }
const at::Tensor& DeviceKvEntry::v(int step, int block) const { return v_.at(static_cast<size_t>(step) * layout_.blocks + block); }

void DeviceKvSource::fetch(int block, at::Tensor& k, at::Tensor& v) {
  k.copy_(entry_->k(step_, block));
  v.copy_(entry_->v(step_, block));
}

bool DeviceKvSource::device_tensors(int block, const at::Device& device, at::Tensor* k, at::Tensor* v) {
  const at::Tensor& kd = entry_->k(step_, block);
  if (kd.device() != device) return false;
  *k = kd;
  *v = entry_->v(step_, block);
  return true;
}

}  // namespace infill
