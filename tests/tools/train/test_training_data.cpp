// Training data pieces: colour naming, random masks, source grouping, the patch PCA fit.

#include "support/catch.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "support/temp_dir.h"
#include "tools/train/colour_words.h"
#include "tools/train/image_metrics.h"
#include "tools/train/patch_pca_fit.h"
#include "tools/train/random_masks.h"
#include "tools/train/recolour.h"
#include "tools/train/trainer.h"
#include "tools/train/wallpaper_dataset.h"

using namespace infill;
using namespace infill::train;

TEST_CASE("every reference colour is named by its own word, tones by lightness", "[train][colour]") {
  for (int i = 0; i < kColourWords; ++i) {
    INFO(vocabulary()[i]);
    CHECK(nearest_colour_word(reference_colour(i)) == i);
    CHECK(describe_colour(reference_colour(i)) == std::vector<int>{i});
  }
  CHECK(describe_colour({0.55, 0.02, 0.02}) == std::vector<int>{0, kDarkWord});   // dark red
  CHECK(describe_colour({0.05, 0.3, 0.05}) == std::vector<int>{3, kDarkWord});    // dark green
  CHECK(describe_colour({0.55, 0.65, 1.0}) == std::vector<int>{5, kBrightWord});  // light blue
  CHECK(vocabulary().size() == 14);
}

TEST_CASE("random masks: ratio within bounds and deterministic for a seed", "[train][masks]") {
  c10::InferenceMode guard;
  MaskOptions options;
  options.size = 128;
  for (uint64_t seed = 0; seed < 40; ++seed) {
    at::Generator a = at::make_generator<at::CPUGeneratorImpl>(seed), b = at::make_generator<at::CPUGeneratorImpl>(seed);
    const at::Tensor m = random_mask(options, a);
    CHECK(at::equal(m, random_mask(options, b)));
    const double ratio = m.mean().item<double>();
    CHECK(ratio >= options.min_ratio);
    CHECK(ratio <= options.max_ratio);
    CHECK(at::equal(m, m.round()));  // binary
  }
}

TEST_CASE("sources are grouped so that variants of one picture share a split", "[train][data]") {
  CHECK(source_group("/usr/share/wallpapers/Altai/contents/images/5120x2880.png") == "plasma/Altai");
  CHECK(source_group("/usr/share/wallpapers/Kay/contents/images_dark/1080x1920.png") == "plasma/Kay");
  CHECK(source_group("/usr/share/backgrounds/gnome/wood-d.webp") == "gnome/wood");
  CHECK(source_group("/usr/share/backgrounds/gnome/wood-l.webp") == "gnome/wood");
  CHECK(source_group("/usr/share/backgrounds/mate/abstract/Elephants_3840x2160.jpg") == "mate/Elephants");
  CHECK(source_group("/usr/share/backgrounds/mate/abstract/Elephants.jpg") == "mate/Elephants");
  int held = 0;
  for (int i = 0; i < 1000; ++i) held += is_held_out("group" + std::to_string(i), 0.15);
  CHECK(held > 100);
  CHECK(held < 200);
}

TEST_CASE("patch PCA fit: orthonormal basis, exact on its span, round trip through a file", "[train][codec]") {
  c10::InferenceMode guard;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(11);
  // Smooth images: low-resolution noise upsampled, so a few components explain them.
  const at::Tensor crops = at::upsample_bilinear2d(at::rand({64, 3, 8, 8}, gen), {64, 64}, false);
  auto codec = fit_patch_pca(crops, 8, 12);
  REQUIRE(codec.ok());
  const at::Tensor gram = at::mm(codec->basis(), codec->basis().t());
  CHECK((gram - at::eye(12)).abs().max().item<double>() < 1e-4);
  // 12 of 192 components keep most of these smooth images.
  const at::Tensor z = codec->encode(crops.narrow(0, 0, 2));
  CHECK(round_trip_psnr(*codec, crops) > 25.0);
  // Cropped decoding is the crop of the full decode.
  const at::Tensor full = codec->decode(z);
  const at::Tensor crop = codec->decode_crop(z, 2, 1, 3, 4, 0);
  CHECK(at::allclose(crop, full.narrow(2, 8, 32).narrow(3, 16, 24)));

  test::TempDir dir("infill-pca");
  REQUIRE(codec->save(dir.file("codec.safetensors")).ok());
  auto loaded = PatchPcaCodec::load(dir.file("codec.safetensors"));
  REQUIRE(loaded.ok());
  CHECK(at::equal(loaded->basis(), codec->basis()));
  CHECK(loaded->factor() == 8);

  auto bad = PatchPcaCodec::from_tensors(8, codec->mean(), codec->basis() * 2.0);
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("orthonormal"));
  CHECK_FALSE(PatchPcaCodec::from_tensors(5, codec->mean(), codec->basis()).ok());
}

TEST_CASE("SSIM and PSNR: identical images score 1 and 100 dB, noise lowers both", "[train][metrics]") {
  c10::InferenceMode guard;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const at::Tensor a = at::rand({3, 40, 30}, gen);
  CHECK(ssim(a, a) == Approx(1.0).margin(1e-6));
  CHECK(psnr(a, a) == 100.0);
  const at::Tensor noise = at::randn({3, 40, 30}, gen);
  const at::Tensor b = (a + noise * 0.1).clamp(0, 1), c = (a + noise * 0.3).clamp(0, 1);
  CHECK(ssim(a, b) < 0.99);
  CHECK(ssim(a, c) < ssim(a, b));
  CHECK(psnr(a, b) == Approx(20.0).margin(1.5));
  CHECK(psnr(a, c) < psnr(a, b));
}

TEST_CASE("recolouring moves the masked region to the word's colour and leaves the rest bit-exact", "[train][colour]") {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const at::Tensor crop = at::rand({3, 32, 32}, gen) * 0.3 + 0.2;  // a dull, textured picture
  at::Tensor mask = at::zeros({32, 32});
  mask.narrow(0, 8, 12).narrow(1, 4, 20).fill_(1.0);
  for (int word = 0; word < kColourWords; ++word) {
    INFO("word " << vocabulary()[word]);
    const at::Tensor out = recolour_masked_region(crop, mask, word);
    CHECK(at::equal(out * (1 - mask), crop * (1 - mask)));  // outside: untouched
    CHECK(nearest_colour_word(masked_mean_colour(out, mask)) == word);
    // The texture survives, scaled: the region is not a flat fill.
    const at::Tensor inside = out.masked_select(mask.unsqueeze(0).expand({3, 32, 32}) > 0);
    CHECK(inside.std().item<double>() > 0.02);
  }
  CHECK(at::equal(recolour_masked_region(crop, at::zeros({32, 32}), 0), crop));  // empty mask: unchanged
}
