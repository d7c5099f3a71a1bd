#pragma once
/// A codec on a GPU that runs on its CPU copy where the GPU is out of memory.
///
/// The FLUX.2 VAE's weights are small (about 160 MB), but its activations are not: decoding a
/// 1024x1024 crop keeps several full-resolution feature maps of 128 to 512 channels alive, a
/// few GB at 2048x2048. Beside a transformer and a full K/V tier that can exceed what is left
/// on the card, and an edit would then fail at its last step (out of device memory fails the
/// step's requests, serving/device_fault.h). Here that call runs again on the CPU copy
/// instead: seconds rather than milliseconds, but the edit is delivered. The next call tries
/// the GPU again (the pressure may have passed). Results come back on the device of the input
/// either way, as every codec's do.
///
/// Only out-of-memory errors fall back (c10::OutOfMemoryError, or an error whose text says
/// "out of memory", as cuDNN's and cuBLAS's allocation failures do); any other error is the
/// call's own and propagates. Threading: as LatentCodec (the counter is atomic).

#include <atomic>
#include <cstdint>
#include <memory>

#include "model/latent_codec.h"

namespace infill {

class HostFallbackCodec : public LatentCodec {
 public:
  /// `device`: the codec on the GPU; `host`: the same codec on the CPU.
  HostFallbackCodec(std::shared_ptr<const LatentCodec> device, std::shared_ptr<const LatentCodec> host);

  int factor() const override { return device_->factor(); }
  int latent_channels() const override { return device_->latent_channels(); }
  at::Tensor encode(const at::Tensor& rgb) const override;
  at::Tensor decode(const at::Tensor& latent) const override;
  at::Tensor decode_crop(const at::Tensor& latent, int x0, int y0, int w, int h, int margin) const override;

  /// Calls that ran on the CPU copy because the device was out of memory.
  int64_t host_fallbacks() const { return host_fallbacks_.load(); }
  const LatentCodec& device_codec() const { return *device_; }

 private:
  template <typename Call>
  at::Tensor run(const Call& call) const;

  std::shared_ptr<const LatentCodec> device_, host_;
  mutable std::atomic<int64_t> host_fallbacks_{0};
};

}  // namespace infill
