#include "pipeline/device_kv_entry.h"

#include <ATen/ATen.h>

namespace infill {

int64_t device_kv_bytes(int64_t host_bytes, at::ScalarType dtype) {
  return host_bytes / static_cast<int64_t>(sizeof(uint16_t)) * static_cast<int64_t>(c10::elementSize(dtype));
}

Result<std::shared_ptr<const DeviceKvEntry>> DeviceKvEntry::upload(const ActivationEntry& entry,
                                                                   const ComputeDevice& device, at::ScalarType dtype) {
  INFILL_RETURN_IF_ERROR(check_compute_device(device));
  if (!c10::isFloatingType(dtype)) {
    return invalid_argument(std::string("device K/V tier on ") + device.name() + ": dtype " + c10::toString(dtype) +
                            " is not a floating type");
  }
  const ActivationLayout& layout = entry.layout();
  std::shared_ptr<DeviceKvEntry> out(new DeviceKvEntry());
  out->layout_ = layout;
  out->dtype_ = dtype;
  const at::Device where = device.torch_device();
  const int64_t H = layout.hidden;
  try {
    for (int step = 0; step < layout.steps; ++step) {
      for (int block = 0; block < layout.blocks; ++block) {
        at::Tensor kv = at::empty({layout.tokens, 2 * H}, at::TensorOptions().device(where).dtype(dtype));
        // The fp16 slab crosses as it is (half the bytes of float32) and widens on the device.
        auto put = [&](const uint16_t* data, int64_t column) {
          const at::Tensor slab = at::from_blob(const_cast<uint16_t*>(data), {layout.tokens, H}, at::kHalf);
          kv.narrow(1, column, H).copy_(slab.to(where));
        };
        put(entry.k(step, block), 0);
        put(entry.v(step, block), H);
        out->kv_.push_back(std::move(kv));
      }
    }
  } catch (const c10::Error& e) {
    return Status(ErrorCode::kResourceExhausted, "activation entry to " + device.name() + " (" +
                                                     std::to_string(out->bytes()) +
                                                     " bytes): " + e.what_without_backtrace());
  }
  return std::shared_ptr<const DeviceKvEntry>(std::move(out));
}

int64_t DeviceKvEntry::bytes() const { return device_kv_bytes(static_cast<int64_t>(layout_.total_bytes()), dtype_); }

const at::Tensor& DeviceKvEntry::kv(int step, int block) const {
  return kv_.at(static_cast<size_t>(step) * layout_.blocks + block);
}
at::Tensor DeviceKvEntry::k(int step, int block) const { return kv(step, block).narrow(1, 0, layout_.hidden); }
at::Tensor DeviceKvEntry::v(int step, int block) const {
  return kv(step, block).narrow(1, layout_.hidden, layout_.hidden);
}

void DeviceKvSource::fetch(int block, at::Tensor& k, at::Tensor& v) {
  k.copy_(entry_->k(step_, block));
  v.copy_(entry_->v(step_, block));
}

bool DeviceKvSource::device_tensors(int block, const at::Device& device, at::Tensor* k, at::Tensor* v) {
  if (entry_->kv(step_, block).device() != device) return false;
  *k = entry_->k(step_, block);
  *v = entry_->v(step_, block);
  return true;
}

bool DeviceKvSource::device_kv_rows(int block, const at::Device& device, at::Tensor* kv) {
  const at::Tensor& rows = entry_->kv(step_, block);
  if (rows.device() != device) return false;
  *kv = rows;
  return true;
}

}  // namespace infill
