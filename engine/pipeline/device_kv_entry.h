#pragma once
/// An activation entry's K/V resident on a GPU: the device tier of templates in active use
/// (live painting edits one template stroke after stroke), so that a mask-aware step reads
/// its cached rows where it computes instead of copying every block from host memory.
///
/// Each (step, block) is one tensor [tokens, 2 * hidden], K in the first hidden columns and V
/// in the rest, in the dtype it was uploaded in: the model's compute dtype (bf16 on a GPU),
/// so that a masked step swaps its fresh rows into it and back (KvSource::device_kv_rows,
/// model/attention_over_cache.h) instead of converting a copy of every row every step.

#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include "cache/activation_entry.h"
#include "common/status.h"
#include "model/compute_device.h"
#include "model/kv_io.h"

namespace infill {

class DeviceKvEntry {
 public:
  /// Copies every slab of `entry` to `device`, converted from fp16 to `dtype` there (a
  /// floating type: fp16 keeps the entry's values, bf16 rounds them as a bf16 forward does
  /// when it reads them). Errors name the device and the bytes asked for (out of device
  /// memory: nothing stays allocated).
  static Result<std::shared_ptr<const DeviceKvEntry>> upload(const ActivationEntry& entry, const ComputeDevice& device,
                                                             at::ScalarType dtype = at::kHalf);

  /// [tokens, 2 * hidden] on the device: K | V side by side.
  const at::Tensor& kv(int step, int block) const;
  /// [tokens, hidden] views of kv(step, block) (rows strided by 2 * hidden).
  at::Tensor k(int step, int block) const;
  at::Tensor v(int step, int block) const;
  const ActivationLayout& layout() const { return layout_; }
  at::ScalarType dtype() const { return dtype_; }
  /// Device bytes held: device_kv_bytes of the host entry's.
  int64_t bytes() const;

 private:
  DeviceKvEntry() = default;
  ActivationLayout layout_;
  at::ScalarType dtype_ = at::kHalf;
  std::vector<at::Tensor> kv_;  // step-major, then block
};

/// Device bytes an entry of `host_bytes` (fp16) takes when uploaded in `dtype`: the host
/// bytes scaled by dtype's element size to fp16's.
int64_t device_kv_bytes(int64_t host_bytes, at::ScalarType dtype);

/// Reads one step of a device-resident entry (KvSource::device_tensors, device_kv_rows);
/// fetch copies to the host for callers on another device.
class DeviceKvSource final : public KvSource {
 public:
  DeviceKvSource(std::shared_ptr<const DeviceKvEntry> entry, int step) : entry_(std::move(entry)), step_(step) {}
  void set_step(int step) { step_ = step; }
  void fetch(int block, at::Tensor& k, at::Tensor& v) override;
  bool device_tensors(int block, const at::Device& device, at::Tensor* k, at::Tensor* v) override;
  bool device_kv_rows(int block, const at::Device& device, at::Tensor* kv) override;

 private:
  std::shared_ptr<const DeviceKvEntry> entry_;
  int step_;
};

}  // namespace infill
