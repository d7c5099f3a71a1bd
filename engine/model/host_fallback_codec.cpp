#include "model/host_fallback_codec.h"

#include <string_view>
#include <utility>

namespace infill {

namespace {

bool out_of_memory(const c10::Error& e) {
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr) return true;
  return std::string_view(e.what()).find("out of memory") != std::string_view::npos;
}

}  // namespace

HostFallbackCodec::HostFallbackCodec(std::shared_ptr<const LatentCodec> device, std::shared_ptr<const LatentCodec> host)
    : device_(std::move(device)), host_(std::move(host)) {
  TORCH_CHECK(device_ && host_, "HostFallbackCodec: both codecs are needed");
  TORCH_CHECK(device_->factor() == host_->factor() && device_->latent_channels() == host_->latent_channels(),
              "HostFallbackCodec: the device and host codecs differ (factor ", device_->factor(), " vs ",
              host_->factor(), ", latent channels ", device_->latent_channels(), " vs ", host_->latent_channels(), ")");
}

template <typename Call>
at::Tensor HostFallbackCodec::run(const Call& call) const {
  try {
    return call(*device_);
  } catch (const c10::Error& e) {
    if (!out_of_memory(e)) throw;
  }
  // Outside the handler: the device call's tensors are released before the CPU's run.
  host_fallbacks_.fetch_add(1);
  return call(*host_);
}

at::Tensor HostFallbackCodec::encode(const at::Tensor& rgb) const {
  return run([&](const LatentCodec& c) { return c.encode(rgb); });
}

at::Tensor HostFallbackCodec::decode(const at::Tensor& latent) const {
  return run([&](const LatentCodec& c) { return c.decode(latent); });
}

at::Tensor HostFallbackCodec::decode_crop(const at::Tensor& latent, int x0, int y0, int w, int h, int margin) const {
  return run([&](const LatentCodec& c) { return c.decode_crop(latent, x0, y0, w, h, margin); });
}

}  // namespace infill
