#include "support/catch.h"
#include "support/shared_data.h"
#include "support/temp_dir.h"
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <ATen/ATen.h>

#include "model/autoencoder.h"
#include "model/safetensors.h"
#include "model/safetensors_torch.h"

using infill::test::TempDir;

namespace fs = std::filesystem;
using infill::Autoencoder;
using infill::AutoencoderConfig;

namespace {

const std::string kShared = infill::test::shared_dir();
const std::string kEncoderPath = kShared + "/models/taef2/taef2_encoder.safetensors";
const std::string kDecoderPath = kShared + "/models/taef2/taef2_decoder.safetensors";
const std::string kReferencePath = kShared + "/testdata/astronaut_taef2_reference.safetensors";

/// Peak signal-to-noise ratio in dB for signals in [0, 1].
double psnr_db(const at::Tensor& a, const at::Tensor& b) {
  const double mse = (a - b).pow(2).mean().item<double>();
  return 10.0 * std::log10(1.0 / std::max(mse, 1e-20));
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void require_shared_or_skip() {
  infill::test::require_shared_or_skip({kEncoderPath, kDecoderPath, kReferencePath});
}


}  // namespace

TEST_CASE("TAEF2 matches the PyTorch reference tensors", "[autoencoder][shared]") {
  require_shared_or_skip();
  auto ae = Autoencoder::load(kEncoderPath, kDecoderPath);
  REQUIRE(ae.ok());
  CHECK(ae->config().latent_channels == 32);
  CHECK(ae->config().width == 64);
  CHECK(ae->config().context_blocks);

  auto ref = infill::SafetensorsFile::open(kReferencePath);
  REQUIRE(ref.ok());
  auto image = infill::load_float_tensor(*ref, "image", {1, 3, 512, 512});
  auto latent_ref = infill::load_float_tensor(*ref, "latent", {1, 32, 64, 64});
  auto recon_ref = infill::load_float_tensor(*ref, "reconstruction", {1, 3, 512, 512});
  REQUIRE(image.ok());
  REQUIRE(latent_ref.ok());
  REQUIRE(recon_ref.ok());

  auto start = std::chrono::steady_clock::now();
  const at::Tensor latent = ae->encode(*image);
  const double encode_s = seconds_since(start);
  REQUIRE(latent.sizes() == at::IntArrayRef({1, 32, 64, 64}));
  const double latent_diff = (latent - *latent_ref).abs().max().item<double>();

  start = std::chrono::steady_clock::now();
  const at::Tensor recon = ae->decode(latent);
  const double decode_s = seconds_since(start);
  REQUIRE(recon.sizes() == at::IntArrayRef({1, 3, 512, 512}));
  CHECK(recon.is_contiguous());
  const double psnr_vs_ref = psnr_db(recon, *recon_ref);
  const double psnr_vs_image = psnr_db(recon, *image);

  WARN("TAEF2 512x512: encoder max |diff| vs reference latent "
       << latent_diff << "; decoder PSNR vs reference reconstruction " << psnr_vs_ref
       << " dB; round trip PSNR vs image " << psnr_vs_image << " dB (reference 31.19 dB); encode "
       << encode_s << " s, decode " << decode_s << " s");
  CHECK(latent_diff <= 1e-2);
  CHECK(psnr_vs_ref >= 45.0);
  CHECK(psnr_vs_image >= 31.0);
  CHECK(recon.min().item<float>() >= 0.0f);
  CHECK(recon.max().item<float>() <= 1.0f);

  // A crop of the real model, against the same region of the full decode.
  const int x0 = 20, y0 = 12, w = 16, h = 24;
  const at::Tensor full_region =
      recon.slice(2, y0 * 8, (y0 + h) * 8).slice(3, x0 * 8, (x0 + w) * 8);
  start = std::chrono::steady_clock::now();
  const at::Tensor crop4 = ae->decode_crop(latent, x0, y0, w, h, 4);
  const double crop_s = seconds_since(start);
  REQUIRE(crop4.sizes() == at::IntArrayRef({1, 3, h * 8, w * 8}));
  const double psnr_m0 = psnr_db(ae->decode_crop(latent, x0, y0, w, h, 0), full_region);
  const double psnr_m2 = psnr_db(ae->decode_crop(latent, x0, y0, w, h, 2), full_region);
  const double psnr_m4 = psnr_db(crop4, full_region);
  const double psnr_m8 = psnr_db(ae->decode_crop(latent, x0, y0, w, h, 8), full_region);
  const double max_diff_m4 = (crop4 - full_region).abs().max().item<double>();
  WARN("decode_crop 16x24 latent box vs full decode: PSNR margin 0 = "
       << psnr_m0 << " dB, margin 2 = " << psnr_m2 << " dB, margin 4 = " << psnr_m4
       << " dB (max |diff| " << max_diff_m4 << "), margin 8 = " << psnr_m8 << " dB; crop decode "
       << crop_s << " s");
  CHECK(psnr_m4 >= 35.0);
  // The global-context GroupNorms run on the whole latent, so a margin covering the
  // upsampling stages' receptive field (~8 latent pixels) is exact up to float rounding.
  CHECK(psnr_m8 >= 80.0);
  CHECK(psnr_m4 > psnr_m0);
}

TEST_CASE("random autoencoder: shapes, save/load round trip, inferred config", "[autoencoder]") {
  TempDir dir;
  for (bool context : {true, false}) {
    const AutoencoderConfig config{4, 16, context};
    const Autoencoder ae = Autoencoder::random(config, 7);
    const std::string enc = dir.file("enc.safetensors");
    const std::string dec = dir.file("dec.safetensors");
    REQUIRE(ae.save(enc, dec).ok());

    auto loaded = Autoencoder::load(enc, dec);
    REQUIRE(loaded.ok());
    CHECK(loaded->config().latent_channels == 4);
    CHECK(loaded->config().width == 16);
    CHECK(loaded->config().context_blocks == context);

    // Keys are the original ones.
    auto file = infill::SafetensorsFile::open(enc);
    REQUIRE(file.ok());
    CHECK(file->find("1.conv.0.weight") != nullptr);
    CHECK(file->find("2.bias") == nullptr);  // stride-2 convs have no bias
    CHECK((file->find("13.pool.0.weight") != nullptr) == context);
    CHECK(file->find("14.weight")->dtype == infill::DType::kF16);

    const at::Tensor rgb = at::rand({2, 3, 32, 48}, at::TensorOptions().dtype(at::kFloat));
    const at::Tensor z = ae.encode(rgb);
    REQUIRE(z.sizes() == at::IntArrayRef({2, 4, 4, 6}));
    CHECK(z.is_contiguous());
    const at::Tensor out = ae.decode(z);
    REQUIRE(out.sizes() == at::IntArrayRef({2, 3, 32, 48}));
    CHECK(out.min().item<float>() >= 0.0f);
    CHECK(out.max().item<float>() <= 1.0f);
    // Weights were rounded to fp16 at creation, so the reloaded network is the same network.
    CHECK(at::equal(loaded->encode(rgb), z));
    CHECK(at::equal(loaded->decode(z), out));
    // Outputs are ordinary tensors: in-place updates outside InferenceMode are allowed.
    at::Tensor copy = ae.decode(z);
    copy.mul_(0.5);
    // Batch items are independent (GroupNorm normalizes per item).
    CHECK(at::allclose(ae.decode(z.slice(0, 1, 2)), out.slice(0, 1, 2), 1e-5, 1e-5));
  }
}

TEST_CASE("random autoencoder: decode_crop equals the full decode given enough margin",
          "[autoencoder]") {
  const Autoencoder ae = Autoencoder::random({4, 16, true}, 11);
  const at::Tensor z = at::randn({1, 4, 20, 24}) * 2;
  const at::Tensor full = ae.decode(z);
  const auto region = [&](int x0, int y0, int w, int h) {
    return full.slice(2, y0 * 8, (y0 + h) * 8).slice(3, x0 * 8, (x0 + w) * 8);
  };
  // After the latent-resolution trunk, the receptive field reaches 5 + 2.5 + 0.625 latent
  // pixels (10 convs at 2x, 10 at 4x, 5 at 8x), so a margin of 9 makes the crop exact up to
  // float rounding; without margin the zero padding shows.
  const at::Tensor exact = ae.decode_crop(z, 5, 6, 7, 5, 9);
  REQUIRE(exact.sizes() == at::IntArrayRef({1, 3, 40, 56}));
  CHECK((exact - region(5, 6, 7, 5)).abs().max().item<float>() <= 1e-4f);
  const at::Tensor none = ae.decode_crop(z, 5, 6, 7, 5, 0);
  CHECK((none - region(5, 6, 7, 5)).abs().max().item<float>() > 1e-3f);
  // Boxes at the latent border: the clamped context matches the full decode's own padding.
  CHECK((ae.decode_crop(z, 0, 0, 3, 4, 9) - region(0, 0, 3, 4)).abs().max().item<float>() <= 1e-4f);
  CHECK((ae.decode_crop(z, 18, 16, 6, 4, 9) - region(18, 16, 6, 4)).abs().max().item<float>() <=
        1e-4f);
  // The whole latent as the box is the full decode.
  CHECK((ae.decode_crop(z, 0, 0, 24, 20, 0) - full).abs().max().item<float>() <= 1e-5f);
  CHECK_THROWS(ae.decode_crop(z, 20, 0, 5, 4, 1));
  CHECK_THROWS(ae.encode(at::rand({1, 3, 30, 32})));
  CHECK_THROWS(ae.decode(at::rand({1, 3, 4, 4})));
}

TEST_CASE("Autoencoder::load rejects mismatched or foreign files", "[autoencoder]") {
  TempDir dir;
  const Autoencoder wide = Autoencoder::random({4, 16, true}, 1);
  const Autoencoder narrow = Autoencoder::random({4, 8, true}, 2);
  const Autoencoder plain = Autoencoder::random({4, 16, false}, 3);
  REQUIRE(wide.save(dir.file("we.st"), dir.file("wd.st")).ok());
  REQUIRE(narrow.save(dir.file("ne.st"), dir.file("nd.st")).ok());
  REQUIRE(plain.save(dir.file("pe.st"), dir.file("pd.st")).ok());

  auto missing = Autoencoder::load(dir.file("absent.st"), dir.file("wd.st"));
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().code() == infill::ErrorCode::kNotFound);

  auto mixed_width = Autoencoder::load(dir.file("we.st"), dir.file("nd.st"));
  REQUIRE_FALSE(mixed_width.ok());
  CHECK(mixed_width.status().code() == infill::ErrorCode::kInvalidArgument);
  CHECK_THAT(
      mixed_width.status().message(),
      Catch::Matchers::Contains("nd.st") && Catch::Matchers::Contains("expected [16, 4, 3, 3]"));

  auto mixed_context = Autoencoder::load(dir.file("we.st"), dir.file("pd.st"));
  REQUIRE_FALSE(mixed_context.ok());
  CHECK_THAT(mixed_context.status().message(), Catch::Matchers::Contains("context blocks"));

  auto swapped = Autoencoder::load(dir.file("wd.st"), dir.file("we.st"));
  REQUIRE_FALSE(swapped.ok());
  CHECK_THAT(swapped.status().message(), Catch::Matchers::Contains("not a TAESD encoder"));

  // An extra tensor means the file is not the layout we think it is.
  const std::string extra = dir.file("extra.st");
  {
    auto enc = infill::SafetensorsFile::open(dir.file("we.st"));
    REQUIRE(enc.ok());
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    for (const auto& info : enc->tensors()) {
      tensors.emplace_back(info.name, infill::load_float_tensor(*enc, info.name).value());
    }
    tensors.emplace_back("15.weight", at::zeros({1}));
    REQUIRE(infill::write_safetensors(extra, tensors).ok());
  }
  auto extra_status = Autoencoder::load(extra, dir.file("wd.st"));
  REQUIRE_FALSE(extra_status.ok());
  CHECK_THAT(extra_status.status().message(),
             Catch::Matchers::Contains("unexpected tensor '15.weight'"));
}
