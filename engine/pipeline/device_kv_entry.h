#pragma once
/// An activation entry's K/V resident on a GPU: the device tier of templates in active use
/// (live painting edits one template stroke after stroke), so that a mask-aware step reads
/// its cached rows where it computes instead of copying every block from host memory.

#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "cache/activation_entry.h"
#include "common/status.h"
#include "model/compute_device.h"
#include "model/kv_io.h"

namespace infill {

class DeviceKvEntry {
 public:
  /// Copies every slab of `entry` to `device` as fp16 tensors. Errors name the device and the
  /// bytes asked for (out of device memory: nothing stays allocated).
  static Result<std::shared_ptr<const DeviceKvEntry>> upload(const ActivationEntry& entry, const ComputeDevice& device);

  /// [tokens, hidden] fp16 on the device.
  const at::Tensor& k(int step, int block) const;
  const at::Tensor& v(int step, int block) const;
  const ActivationLayout& layout() const { return layout_; }
  int64_t bytes() const { return static_cast<int64_t>(layout_.total_bytes()); }

 private:
  DeviceKvEntry() = default;
  ActivationLayout layout_;
  std::vector<at::Tensor> k_, v_;  // step-major, then block
};

/// Reads one step of a device-resident entry (KvSource::device_tensors); fetch copies to the
/// host for callers on another device.
class DeviceKvSource final : public KvSource {
 public:
  DeviceKvSource(std::shared_ptr<const DeviceKvEntry> entry, int step) : entry_(std::move(entry)), step_(step) {}
  void set_step(int step) { step_ = step; }
  void fetch(int block, at::Tensor& k, at::Tensor& v) override;
  bool device_tensors(int block, const at::Device& device, at::Tensor* k, at::Tensor* v) override;

 private:
  std::shared_ptr<const DeviceKvEntry> entry_;
  int step_;
};

}  // namespace infill
