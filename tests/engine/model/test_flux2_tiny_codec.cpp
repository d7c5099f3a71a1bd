#include "support/catch.h"
#include "support/shared_data.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include <ATen/ATen.h>

#include "model/autoencoder.h"
#include "model/flux2_autoencoder.h"
#include "model/flux2_tiny_codec.h"
#include "model/safetensors.h"
#include "model/safetensors_torch.h"

namespace fs = std::filesystem;

namespace {

const std::string kShared = infill::test::shared_dir();

double psnr_db(const at::Tensor& a, const at::Tensor& b) {
  const double mse = (a - b).pow(2).mean().item<double>();
  return 10.0 * std::log10(1.0 / std::max(mse, 1e-20));
}

}  // namespace

TEST_CASE("TAEF2 decodes FLUX.2's normalised latent: the VAE's patchify and statistics in between",
          "[flux2][taef2][shared]") {
  const std::string enc = kShared + "/models/taef2/taef2_encoder.safetensors";
  const std::string dec = kShared + "/models/taef2/taef2_decoder.safetensors";
  const std::string ref = kShared + "/testdata/astronaut_taef2_reference.safetensors";
  const std::string ae_path = kShared + "/testdata/flux2/flux2_ae.safetensors";
  infill::test::require_shared_or_skip({enc, dec, ref, ae_path});
  auto taef2 = infill::Autoencoder::load(enc, dec);
  REQUIRE(taef2.ok());
  auto ae_file = infill::SafetensorsFile::open(ae_path);
  REQUIRE(ae_file.ok());
  auto vae = infill::Flux2Autoencoder::load(*ae_file, "weights.");
  REQUIRE(vae.ok());
  const auto taef2_ptr = std::make_shared<const infill::Autoencoder>(std::move(*taef2));
  const infill::Flux2TinyCodec codec(taef2_ptr, std::make_shared<const infill::Flux2Autoencoder>(std::move(*vae)));
  CHECK(codec.factor() == 16);
  CHECK(codec.latent_channels() == 128);

  auto reference = infill::SafetensorsFile::open(ref);
  REQUIRE(reference.ok());
  const at::Tensor image = *infill::load_float_tensor(*reference, "image", {1, 3, 512, 512});
  const at::Tensor latent = codec.encode(image);
  REQUIRE(latent.sizes() == at::IntArrayRef({1, 128, 32, 32}));

  // The same normalised latent in plain ops, as upstream's encode states it: TAEF2's mean,
  // "c (i pi) (j pj) -> (c pi pj) i j", then (z - running_mean) / sqrt(running_var + 1e-4).
  const at::Tensor mean = taef2_ptr->encode(image);
  const at::Tensor patched = mean.reshape({1, 32, 32, 2, 32, 2}).permute({0, 1, 3, 5, 2, 4}).reshape({1, 128, 32, 32});
  const at::Tensor bn_mean = infill::load_float_tensor(*ae_file, "weights.bn.running_mean").value().reshape({1, 128, 1, 1});
  const at::Tensor bn_var = infill::load_float_tensor(*ae_file, "weights.bn.running_var").value().reshape({1, 128, 1, 1});
  const at::Tensor expected = (patched - bn_mean) / (bn_var + 1e-4).sqrt();
  const double latent_err = (latent - expected).abs().max().item<double>() / expected.abs().max().item<double>();
  INFO("normalised latent max rel err " << latent_err);
  CHECK(latent_err <= 1e-5);

  const at::Tensor decoded = codec.decode(latent);
  REQUIRE(decoded.sizes() == at::IntArrayRef({1, 3, 512, 512}));
  CHECK((decoded - taef2_ptr->decode(mean)).abs().max().item<double>() <= 1e-4);
  const double psnr = psnr_db(decoded, image);
  WARN("TAEF2 through the FLUX.2 latent: " << psnr << " dB on the astronaut (reference 31.19 dB for TAEF2 alone)");
  CHECK(psnr >= 30.0);

  // A cropped decode of the centre (latent box 12..20 of 32, margin 4) matches the full decode there.
  const at::Tensor crop = codec.decode_crop(latent, 12, 12, 8, 8, 4);
  REQUIRE(crop.sizes() == at::IntArrayRef({1, 3, 128, 128}));
  CHECK(psnr_db(crop, decoded.slice(2, 192, 320).slice(3, 192, 320)) >= 35.0);
}
