// infill-tiny 2's codec: the patch PCA encoder with a learned conv decoder, in FLUX.2's
// 2x2-patchified latent layout.

#include "support/catch.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "model/learned_decoder_codec.h"
#include "model/safetensors.h"
#include "model/safetensors_torch.h"
#include "support/temp_dir.h"

using namespace infill;

namespace {

// Small widths keep the tests fast; the structure is that of the default.
LearnedDecoderConfig small_config() {
  LearnedDecoderConfig c;
  c.widths = {16, 8, 8, 4};
  c.blocks = {2, 1, 0, 1};
  return c;
}

// The codec's file with one tensor replaced (or added, or removed when `t` is undefined).
void rewrite(const std::string& from, const std::string& to, const std::string& name,
             const at::Tensor& t, std::map<std::string, std::string> metadata = {{"scale", "1"}}) {
  auto file = SafetensorsFile::open(from);
  REQUIRE(file.ok());
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  bool replaced = false;
  for (const TensorInfo& info : file->tensors()) {
    if (info.name == name) {
      replaced = true;
      if (t.defined()) tensors.emplace_back(name, t);
      continue;
    }
    auto v = load_float_tensor(*file, info.name);
    REQUIRE(v.ok());
    tensors.emplace_back(info.name, *v);
  }
  if (!replaced) tensors.emplace_back(name, t);
  REQUIRE(write_safetensors(to, tensors, metadata).ok());
}

}  // namespace

TEST_CASE("patchify_2x2 puts pixel (2y + dy, 2x + dx) of channel c at channel c*4 + dy*2 + dx",
          "[codec]") {
  c10::InferenceMode guard;
  const at::Tensor x = at::arange(2 * 3 * 4 * 6, at::kFloat).reshape({2, 3, 4, 6});
  const at::Tensor p = patchify_2x2(x);
  REQUIRE(p.sizes() == at::IntArrayRef({2, 12, 2, 3}));
  for (int64_t c = 0; c < 3; ++c)
    for (int64_t dy = 0; dy < 2; ++dy)
      for (int64_t dx = 0; dx < 2; ++dx)
        for (int64_t y = 0; y < 2; ++y)
          for (int64_t i = 0; i < 3; ++i)
            CHECK(p[1][c * 4 + dy * 2 + dx][y][i].item<float>() ==
                  x[1][c][2 * y + dy][2 * i + dx].item<float>());
  CHECK(at::equal(p, at::pixel_unshuffle(x, 2)));
  CHECK(at::equal(unpatchify_2x2(p), x));
}

TEST_CASE("learned decoder codec: sizes, encode through the PCA, decode in [0, 1]", "[codec]") {
  const LearnedDecoderCodec codec = LearnedDecoderCodec::random(small_config(), 3);
  CHECK(codec.factor() == 16);
  CHECK(codec.latent_channels() == 32);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const at::Tensor rgb = at::rand({2, 3, 64, 96}, gen);
  const at::Tensor z = codec.encode(rgb);
  REQUIRE(z.sizes() == at::IntArrayRef({2, 32, 4, 6}));
  CHECK(at::allclose(z, patchify_2x2((codec.pca().encode(rgb) - codec.shift()) * codec.scale())));
  // decode_pca is the PCA's own round trip.
  CHECK(at::allclose(codec.decode_pca(z), codec.pca().decode(codec.pca().encode(rgb)), 1e-5, 1e-5));
  const at::Tensor out = codec.decode(z);
  REQUIRE(out.sizes() == rgb.sizes());
  CHECK(out.min().item<float>() >= 0.0f);
  CHECK(out.max().item<float>() <= 1.0f);
  CHECK_THROWS(codec.decode(at::zeros({1, 31, 4, 4})));
  CHECK_THROWS(codec.encode(at::zeros({1, 3, 40, 48})));
}

TEST_CASE("learned decoder codec: receptive field margins", "[codec]") {
  LearnedDecoderConfig c;
  CHECK(c.validate().ok());
  CHECK(c.context_margin() == 3);  // the default {1, 1, 1, 0}
  c.blocks = {2, 1, 1, 1};
  CHECK(c.context_margin() == 4);
  c.blocks = {1, 0, 0, 0};
  CHECK(c.context_margin() == 2);
  c.widths = {64, 32, 16};
  CHECK_FALSE(c.validate().ok());
}

TEST_CASE("learned decoder codec: decode_crop with the context margin equals the full decode",
          "[codec]") {
  const LearnedDecoderCodec codec = LearnedDecoderCodec::random(small_config(), 4);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(6);
  // Latents of a real image, so that the decode is not clamped flat.
  const at::Tensor rgb = at::upsample_bilinear2d(at::rand({1, 3, 12, 14}, gen), {192, 224}, false);
  const at::Tensor z = codec.encode(rgb) + 0.3 * at::randn({1, 32, 12, 14}, gen);
  const at::Tensor full = codec.decode(z);
  REQUIRE(full.std().item<double>() > 0.01);  // not clamped flat
  const int m = codec.context_margin();
  // Inside (context on every side), at a corner (clamped context) and the whole latent.
  for (auto [x0, y0, w, h] : {std::array{5, 4, 3, 2}, std::array{0, 0, 4, 3},
                              std::array{9, 8, 5, 4}, std::array{0, 0, 14, 12}}) {
    const at::Tensor crop = codec.decode_crop(z, x0, y0, w, h, m);
    const at::Tensor expected = full.narrow(2, y0 * 16, h * 16).narrow(3, x0 * 16, w * 16);
    REQUIRE(crop.sizes() == expected.sizes());
    CHECK((crop - expected).abs().max().item<double>() < 1e-5);
  }
  // Without context the box's inner edges change: the margin matters.
  const at::Tensor no_context = codec.decode_crop(z, 5, 4, 3, 2, 0);
  CHECK((no_context - full.narrow(2, 64, 32).narrow(3, 80, 48)).abs().max().item<double>() > 1e-3);
  CHECK_THROWS(codec.decode_crop(z, 12, 0, 3, 2, m));
}

TEST_CASE("learned decoder codec: save and load round trip", "[codec]") {
  const LearnedDecoderCodec random = LearnedDecoderCodec::random(small_config(), 7);
  auto codec = LearnedDecoderCodec::from_parts(random.pca(), 0.37, 0.015, random.decoder_weights());
  REQUIRE(codec.ok());
  test::TempDir dir("infill-ldc");
  REQUIRE(codec->save(dir.file("codec.safetensors")).ok());
  auto loaded = LearnedDecoderCodec::load(dir.file("codec.safetensors"));
  REQUIRE(loaded.ok());
  CHECK(loaded->config().widths == small_config().widths);
  CHECK(loaded->config().blocks == small_config().blocks);
  CHECK(loaded->scale() == 0.37);
  CHECK(loaded->shift() == 0.015);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(8);
  const at::Tensor rgb = at::rand({1, 3, 48, 32}, gen);
  const at::Tensor z = codec->encode(rgb);
  CHECK(at::equal(loaded->encode(rgb), z));
  CHECK(at::equal(loaded->decode(z), codec->decode(z)));
}

TEST_CASE("learned decoder codec: load errors name the file and the tensor", "[codec]") {
  const LearnedDecoderCodec codec = LearnedDecoderCodec::random(small_config(), 9);
  test::TempDir dir("infill-ldc-errors");
  const std::string good = dir.file("good.safetensors"), bad = dir.file("bad.safetensors");
  REQUIRE(codec.save(good).ok());

  CHECK(LearnedDecoderCodec::load(dir.file("missing.safetensors")).status().code() ==
        ErrorCode::kNotFound);

  rewrite(good, bad, "decoder.levels.2.up.weight", at::zeros({8, 7, 3, 3}));
  auto r = LearnedDecoderCodec::load(bad);
  CHECK(r.status().code() == ErrorCode::kInvalidArgument);
  CHECK_THAT(r.status().message(),
             Catch::Contains(bad) &&
                 Catch::Contains("decoder.levels.2.up.weight is [8, 7, 3, 3]") &&
                 Catch::Contains("expected [8, 8, 3, 3]"));

  rewrite(good, bad, "decoder.levels.0.blocks.1.conv1.bias", at::Tensor());
  r = LearnedDecoderCodec::load(bad);
  CHECK(r.status().code() == ErrorCode::kNotFound);
  CHECK_THAT(r.status().message(), Catch::Contains("decoder.levels.0.blocks.1.conv1.bias"));

  rewrite(good, bad, "decoder.extra.weight", at::zeros({2}));
  r = LearnedDecoderCodec::load(bad);
  CHECK(r.status().code() == ErrorCode::kInvalidArgument);
  CHECK_THAT(r.status().message(), Catch::Contains("decoder.extra.weight"));

  rewrite(good, bad, "decoder.conv_in.weight", at::zeros({16, 9, 3, 3}));
  r = LearnedDecoderCodec::load(bad);
  CHECK(r.status().code() == ErrorCode::kInvalidArgument);
  CHECK_THAT(r.status().message(), Catch::Contains("decoder.conv_in.weight is [16, 9, 3, 3]"));

  rewrite(good, bad, "pca.mean", at::zeros({100}));
  r = LearnedDecoderCodec::load(bad);
  CHECK(r.status().code() == ErrorCode::kInvalidArgument);
  CHECK_THAT(r.status().message(), Catch::Contains("pca.mean is [100]"));

  at::Tensor nan_bias = at::zeros({3});
  nan_bias[1] = std::nanf("");
  rewrite(good, bad, "decoder.conv_out.bias", nan_bias);
  r = LearnedDecoderCodec::load(bad);
  CHECK(r.status().code() == ErrorCode::kCorruptData);
  CHECK_THAT(r.status().message(), Catch::Contains("decoder.conv_out.bias"));

  rewrite(good, bad, "decoder.conv_out.bias", at::zeros({3}), {});
  r = LearnedDecoderCodec::load(bad);
  CHECK(r.status().code() == ErrorCode::kInvalidArgument);
  CHECK_THAT(r.status().message(), Catch::Contains("\"scale\""));

  rewrite(good, bad, "decoder.conv_out.bias", at::zeros({3}), {{"scale", "-2"}});
  r = LearnedDecoderCodec::load(bad);
  CHECK(r.status().code() == ErrorCode::kInvalidArgument);
  CHECK_THAT(r.status().message(), Catch::Contains("scale"));
}
