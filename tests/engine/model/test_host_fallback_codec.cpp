// A GPU codec that runs on its CPU copy when the GPU is out of memory
// (model/host_fallback_codec.h). No GPU here: the device side is a fault seam around the real
// FLUX.2 VAE that throws libtorch's out-of-memory error for the calls it is told to, as the
// CUDA caching allocator does; the CPU copy is the real VAE.
#include "support/catch.h"

#include <atomic>
#include <memory>
#include <string>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "model/flux2_autoencoder.h"
#include "model/host_fallback_codec.h"

using namespace infill;

namespace {

// The "device" codec: the real VAE, except that its next `failures` calls throw `error`.
class FaultyCodec : public LatentCodec {
 public:
  enum class Error { kOutOfMemory, kOutOfMemoryText, kOther };
  FaultyCodec(std::shared_ptr<const LatentCodec> real, int failures, Error error)
      : real_(std::move(real)), failures_(failures), error_(error) {}
  int factor() const override { return real_->factor(); }
  int latent_channels() const override { return real_->latent_channels(); }
  at::Tensor encode(const at::Tensor& rgb) const override {
    fail();
    return real_->encode(rgb);
  }
  at::Tensor decode(const at::Tensor& latent) const override {
    fail();
    return real_->decode(latent);
  }
  at::Tensor decode_crop(const at::Tensor& latent, int x0, int y0, int w, int h, int margin) const override {
    fail();
    return real_->decode_crop(latent, x0, y0, w, h, margin);
  }
  int calls() const { return calls_.load(); }

 private:
  void fail() const {
    calls_.fetch_add(1);
    if (failures_.fetch_sub(1) <= 0) return;
    // As c10's CUDA caching allocator reports it; as a library's allocation failure does; any other.
    TORCH_CHECK_WITH(OutOfMemoryError, error_ != Error::kOutOfMemory, "CUDA out of memory. Tried to allocate 2.00 GiB");
    TORCH_CHECK(error_ != Error::kOutOfMemoryText, "CUDNN_STATUS_INTERNAL_ERROR: cuDNN ran out of memory");
    TORCH_CHECK(false, "decode_crop box is not inside the latent");
  }
  std::shared_ptr<const LatentCodec> real_;
  mutable std::atomic<int> failures_;
  mutable std::atomic<int> calls_{0};
  Error error_;
};

std::shared_ptr<const Flux2Autoencoder> small_vae() {
  Flux2AutoencoderConfig c;  // factor 16 and 128 latent channels, as FLUX.2's VAE
  c.ch = 32;
  c.ch_mult = {1, 1, 1, 1};
  c.num_res_blocks = 1;
  c.z_channels = 32;
  return std::make_shared<const Flux2Autoencoder>(Flux2Autoencoder::random(c, 7));
}

}  // namespace

TEST_CASE("A codec call out of GPU memory runs on the CPU copy and gives its result", "[codec]") {
  c10::InferenceMode guard;
  const auto vae = small_vae();
  const at::Tensor rgb = at::rand({1, 3, 64, 48}, at::make_generator<at::CPUGeneratorImpl>(3));
  const at::Tensor latent = vae->encode(rgb);
  const at::Tensor decoded = vae->decode(latent);
  const at::Tensor crop = vae->decode_crop(latent, 1, 1, 2, 2, 2);

  for (const FaultyCodec::Error error : {FaultyCodec::Error::kOutOfMemory, FaultyCodec::Error::kOutOfMemoryText}) {
    INFO("error kind " << static_cast<int>(error));
    auto device = std::make_shared<FaultyCodec>(vae, 3, error);
    HostFallbackCodec codec(device, vae);
    CHECK(codec.factor() == 16);
    CHECK(codec.latent_channels() == vae->latent_channels());
    // The first three calls fail on the "device" and are run on the CPU copy.
    CHECK(at::equal(codec.encode(rgb), latent));
    CHECK(at::equal(codec.decode(latent), decoded));
    CHECK(at::equal(codec.decode_crop(latent, 1, 1, 2, 2, 2), crop));
    CHECK(codec.host_fallbacks() == 3);
    // The next calls find the device again: nothing more falls back.
    CHECK(at::equal(codec.decode_crop(latent, 1, 1, 2, 2, 2), crop));
    CHECK(at::equal(codec.decode(latent), decoded));
    CHECK(codec.host_fallbacks() == 3);
    CHECK(device->calls() == 5);
  }
}

TEST_CASE("A codec error that is not out of memory is the call's own and does not fall back", "[codec]") {
  c10::InferenceMode guard;
  const auto vae = small_vae();
  const at::Tensor latent = vae->encode(at::rand({1, 3, 32, 32}));
  HostFallbackCodec codec(std::make_shared<FaultyCodec>(vae, 1, FaultyCodec::Error::kOther), vae);
  CHECK_THROWS_WITH(codec.decode(latent), Catch::Contains("not inside the latent"));
  CHECK(codec.host_fallbacks() == 0);
  CHECK(codec.decode(latent).sizes() == at::IntArrayRef({1, 3, 32, 32}));

  // Codecs of different shapes are not copies of one another.
  Flux2AutoencoderConfig other;
  other.ch = 32;
  other.ch_mult = {1, 1, 1};  // factor 8
  other.num_res_blocks = 1;
  other.z_channels = 32;
  const auto smaller = std::make_shared<const Flux2Autoencoder>(Flux2Autoencoder::random(other, 7));
  CHECK_THROWS_WITH(HostFallbackCodec(vae, smaller), Catch::Contains("the device and host codecs differ"));
}
