// FLUX.2 edits through the session API a worker drives: prepare runs that record K/V, the two
// cache modes and the uncached baseline, guidance, the composite. Small random transformers
// with a patch codec of FLUX.2's latent shape (factor 16, 128 channels), and the upstream
// reduced reference weights (transformer + VAE) from ../shared where present.
#include "support/catch.h"
#include "support/outside_mask.h"
#include "support/random_image.h"
#include "support/shared_data.h"
#include "support/tiny_flux2.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "model/flux2_autoencoder.h"
#include "model/flux2_transformer.h"
#include "model/patch_pca_codec.h"
#include "model/safetensors.h"
#include "pipeline/flux2_edit_session.h"
#include "pipeline/flux2_prepare_run.h"
#include "pipeline/flux2_sequence.h"

using namespace infill;

namespace {

Flux2Config small_config(bool guidance_embed = false) { return test::tiny_flux2_config(32, guidance_embed); }

std::shared_ptr<const LatentCodec> patch_codec() { return test::flux2_patch_codec(); }

std::shared_ptr<const TemplateImage> make_flux2_template(const LatentCodec& codec, const PixelImage& image) {
  auto png = encode_png(image);
  REQUIRE(png.ok());
  auto tmpl = make_template(codec, codec.factor(), 0.0, 1.0, int64_t{1} << 24, *png, "template.png");
  REQUIRE(tmpl.ok());
  return *tmpl;
}

at::Tensor rect_mask(int width, int height, int x0, int y0, int w, int h) {
  at::Tensor m = at::zeros({height, width}, at::kFloat);
  m.narrow(0, y0, h).narrow(1, x0, w).fill_(1.0);
  return m;
}

std::shared_ptr<const ActivationEntry> prepare(const std::shared_ptr<const Flux2Transformer>& model,
                                               const std::shared_ptr<const TemplateImage>& tmpl, const at::Tensor& text,
                                               int steps, uint64_t template_seed) {
  auto run = Flux2PrepareRun::create(model, tmpl, text, steps, template_seed, 1.0);
  REQUIRE(run.ok());
  while (!(*run)->done()) (*run)->run_step();
  return (*run)->entry();
}

// Runs an edit to the end; `latent` receives the final latent (the pixels of a model with
// small random weights often clamp, so numerical comparisons read the latent).
Result<EditOutput> run_edit(const std::shared_ptr<const Flux2Transformer>& model, const std::shared_ptr<const LatentCodec>& codec,
                            const std::shared_ptr<const TemplateImage>& tmpl, const Flux2EditParams& params, Flux2Cache cache,
                            Flux2CacheMode* mode = nullptr, at::Tensor* latent = nullptr) {
  auto session = Flux2EditSession::create(model, codec, tmpl, params, std::move(cache));
  if (!session.ok()) return session.status();
  if (mode != nullptr) *mode = (*session)->mode();
  while (!(*session)->done()) {
    auto segments = (*session)->segments();
    const at::Tensor prediction = model->forward(segments);
    REQUIRE(prediction.size(0) == (*session)->prediction_rows());
    INFILL_RETURN_IF_ERROR((*session)->apply(prediction));
  }
  if (latent != nullptr) *latent = (*session)->predicted_latent();
  return (*session)->finish();
}

// Largest difference between two images' float samples.
double max_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

double max_pixel_diff(const PixelImage& a, const PixelImage& b) {
  return (to_rgb_tensor(a) - to_rgb_tensor(b)).abs().max().item<double>();
}


}  // namespace

TEST_CASE("FLUX.2 edit: a step whose inputs equal the prepare run's gives the uncached result in both cache modes",
          "[flux2-edit]") {
  c10::InferenceMode guard;
  const auto model = std::make_shared<const Flux2Transformer>(Flux2Transformer::random(small_config(), 3, at::kFloat));
  const auto codec = patch_codec();
  // Float pixels, so that no difference hides under 8-bit rounding.
  const PixelImage image = test::random_image(80, 48, 3, PixelFormat::kF32, 9, 0.0f, 1.0f);
  const auto tmpl = make_flux2_template(*codec, image);
  REQUIRE(tmpl->latent.sizes() == at::IntArrayRef({128, 3, 5}));
  // Large text rows, so that the text visibly steers a model with small random weights.
  const at::Tensor prompt = 30 * at::randn({6, 32}, at::make_generator<at::CPUGeneratorImpl>(1));
  const at::Tensor empty_prompt = 30 * at::randn({6, 32}, at::make_generator<at::CPUGeneratorImpl>(2));

  // One step, and the edit's noise is the template's: every input of the edit's only step
  // equals the prepare run's, so cached K/V (fp16) are the only difference from recomputing.
  Flux2EditParams params;
  params.mask = rect_mask(80, 48, 16, 16, 32, 16);
  params.steps = 1;
  params.seed = params.template_seed = 77;
  params.prompt = prompt;
  params.halo_tokens = 0;

  Flux2CacheMode mode{};
  at::Tensor uncached_latent, cached_latent;
  auto uncached = run_edit(model, codec, tmpl, params, {}, &mode, &uncached_latent);
  REQUIRE(uncached.ok());
  CHECK(mode == Flux2CacheMode::kOff);
  CHECK(uncached->cache_mode == "off");

  Flux2Cache prompt_keyed;
  prompt_keyed.prompt_keyed = prepare(model, tmpl, prompt, 1, 77);
  auto cached = run_edit(model, codec, tmpl, params, prompt_keyed, &mode, &cached_latent);
  REQUIRE(cached.ok());
  CHECK(mode == Flux2CacheMode::kPromptKeyed);
  CHECK(cached->cache_mode == "prompt_keyed");
  CHECK(cached->used_cache);
  CHECK(cached->masked_tokens == 2);  // 32x16 px at 16 px per token, no halo
  CHECK(cached->total_tokens == 15);
  // Only the fp16 rounding of the cached K/V separates them.
  const double scale = uncached_latent.abs().max().item<double>();
  const double cache_error = max_diff(cached_latent, uncached_latent);
  CHECK(cache_error <= 1e-3 * scale);
  CHECK(max_pixel_diff(cached->image, uncached->image) <= 1e-3);

  // Template-keyed: the entry was recorded under another (the empty) prompt; the edit's
  // text rows are computed afresh. With the edit's prompt equal to the entry's, exact again.
  Flux2Cache template_keyed;
  template_keyed.template_keyed = prepare(model, tmpl, empty_prompt, 1, 77);
  Flux2EditParams empty_params = params;
  empty_params.prompt = empty_prompt;
  at::Tensor empty_uncached_latent, empty_cached_latent, other_latent;
  auto empty_uncached = run_edit(model, codec, tmpl, empty_params, {}, nullptr, &empty_uncached_latent);
  auto empty_cached = run_edit(model, codec, tmpl, empty_params, template_keyed, &mode, &empty_cached_latent);
  REQUIRE((empty_uncached.ok() && empty_cached.ok()));
  CHECK(mode == Flux2CacheMode::kTemplateKeyed);
  CHECK(empty_cached->cache_mode == "template_keyed");
  CHECK(max_diff(empty_cached_latent, empty_uncached_latent) <= 1e-3 * scale);
  // Under another prompt the template-keyed edit reads the edit's text: its latent moves
  // towards the uncached edit under that prompt, away from the empty prompt's.
  auto other_prompt = run_edit(model, codec, tmpl, params, template_keyed, nullptr, &other_latent);
  REQUIRE(other_prompt.ok());
  CHECK(max_diff(other_latent, empty_cached_latent) > 10 * cache_error);
  CHECK(max_diff(other_latent, uncached_latent) < max_diff(other_latent, empty_cached_latent));

  // A prompt-keyed entry wins over a template-keyed one.
  Flux2Cache both{prompt_keyed.prompt_keyed, template_keyed.template_keyed, nullptr, nullptr, nullptr};
  REQUIRE(run_edit(model, codec, tmpl, params, both, &mode).ok());
  CHECK(mode == Flux2CacheMode::kPromptKeyed);
}

TEST_CASE("FLUX.2 edit: pixels outside the mask keep their bytes in every mode, and an empty mask returns the template",
          "[flux2-edit]") {
  c10::InferenceMode guard;
  const auto model = std::make_shared<const Flux2Transformer>(Flux2Transformer::random(small_config(), 4, at::kFloat));
  const auto codec = patch_codec();
  const PixelImage image = test::random_image(72, 40, 4, PixelFormat::kU16, 3);  // not a multiple of 16: padded
  const auto tmpl = make_flux2_template(*codec, image);
  const at::Tensor prompt = at::randn({5, 32}, at::make_generator<at::CPUGeneratorImpl>(7));
  Flux2EditParams params;
  params.mask = rect_mask(72, 40, 20, 8, 30, 20);
  params.steps = 3;
  params.seed = 5;
  params.template_seed = 6;
  params.prompt = prompt;
  Flux2Cache template_keyed;
  template_keyed.template_keyed = prepare(model, tmpl, prompt, 3, 6);
  Flux2Cache prompt_keyed;
  prompt_keyed.prompt_keyed = template_keyed.template_keyed;
  for (const Flux2Cache& cache : {Flux2Cache{}, template_keyed, prompt_keyed}) {
    auto out = run_edit(model, codec, tmpl, params, cache);
    REQUIRE(out.ok());
    CHECK(out->steps_run == 3);
    CHECK(out->image.format == PixelFormat::kU16);
    CHECK(test::outside_identical(out->image, image, params.mask));
    CHECK(max_pixel_diff(out->image, image) > 0.01);  // the masked region did change
  }
  params.mask = at::zeros({40, 72}, at::kFloat);
  auto untouched = run_edit(model, codec, tmpl, params, template_keyed);
  REQUIRE(untouched.ok());
  CHECK(untouched->steps_run == 0);
  CHECK((untouched->image.data == image.data));
}

TEST_CASE("FLUX.2 edit: a mask-conditioned model reads the mask cells of the edited tokens, the prepare run sees none",
          "[flux2-edit]") {
  c10::InferenceMode guard;
  Flux2Config cfg = small_config();
  cfg.mask_channels = 4;  // 2x2 cells of 8 px per 16-px token
  const auto model = std::make_shared<const Flux2Transformer>(Flux2Transformer::random(cfg, 6, at::kFloat));
  const auto codec = patch_codec();
  const PixelImage image = test::random_image(80, 48, 3, PixelFormat::kU8, 2);
  const auto tmpl = make_flux2_template(*codec, image);
  const at::Tensor prompt = at::randn({4, 32}, at::make_generator<at::CPUGeneratorImpl>(8));
  Flux2EditParams params;
  // Tokens (1, 1) and (1, 2) fully, and the top-right cell of token (0, 2) only.
  params.mask = rect_mask(80, 48, 16, 16, 32, 16) + rect_mask(80, 48, 40, 0, 8, 8);
  params.steps = 2;
  params.prompt = prompt;
  params.halo_tokens = 0;
  const int64_t n = 15;  // 5 x 3 tokens

  const at::Tensor cells = flux2_mask_rows(params.mask, 16, 2);
  REQUIRE(cells.sizes() == at::IntArrayRef({n, 4}));
  CHECK(at::equal(cells[2], at::tensor({0.0f, 1.0f, 0.0f, 0.0f})));
  CHECK(at::equal(cells[6], at::ones({4})));
  CHECK(cells.sum().item<double>() == 9.0);

  auto off = Flux2EditSession::create(model, codec, tmpl, params, {});
  REQUIRE(off.ok());
  const Flux2Segment full = (*off)->segments()[0];
  REQUIRE(full.img.sizes() == at::IntArrayRef({2 * n, 132}));
  CHECK(at::equal(full.img.narrow(0, 0, n).narrow(1, 128, 4), cells));
  CHECK(full.img.narrow(0, n, n).narrow(1, 128, 4).abs().sum().item<double>() == 0.0);  // reference tokens

  auto run = Flux2PrepareRun::create(model, tmpl, prompt, 2, params.template_seed, 1.0);
  REQUIRE(run.ok());
  (*run)->run_step();  // runs with zero cells everywhere (a wrong width would throw)
  Flux2Cache cache;
  cache.prompt_keyed = prepare(model, tmpl, prompt, 2, params.template_seed);
  auto cached = Flux2EditSession::create(model, codec, tmpl, params, cache);
  REQUIRE(cached.ok());
  const Flux2Segment masked = (*cached)->segments()[0];
  REQUIRE(masked.img.sizes() == at::IntArrayRef({3, 132}));  // tokens 2, 6, 7
  CHECK(at::equal(masked.img.narrow(1, 128, 4), cells.index_select(0, at::tensor({2, 6, 7}, at::kLong))));

  for (const Flux2Cache& c : {Flux2Cache{}, cache}) {
    auto out = run_edit(model, codec, tmpl, params, c);
    REQUIRE(out.ok());
    CHECK(test::outside_identical(out->image, image, params.mask));
  }
}

TEST_CASE("FLUX.2 edit: classifier-free guidance runs a cached null-prompt segment, guidance_embed models embed it",
          "[flux2-edit]") {
  c10::InferenceMode guard;
  const auto codec = patch_codec();
  const auto tmpl = make_flux2_template(*codec, test::random_image(64, 32, 3, PixelFormat::kU8, 4));
  const at::Tensor prompt = at::randn({4, 32}, at::make_generator<at::CPUGeneratorImpl>(3));
  const at::Tensor empty = at::zeros({4, 32});
  Flux2EditParams params;
  params.mask = rect_mask(64, 32, 0, 0, 32, 16);
  params.steps = 2;
  params.prompt = prompt;
  params.guidance = 4.0;

  const auto base = std::make_shared<const Flux2Transformer>(Flux2Transformer::random(small_config(), 8, at::kFloat));
  // Guidance on a base model needs the empty prompt's rows.
  auto refused = Flux2EditSession::create(base, codec, tmpl, params, {});
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(refused.status().to_string(), Catch::Contains("null_prompt"));
  params.null_prompt = empty;
  Flux2Cache cache;
  cache.template_keyed = prepare(base, tmpl, empty, 2, 0);
  auto session = Flux2EditSession::create(base, codec, tmpl, params, cache);
  REQUIRE(session.ok());
  CHECK((*session)->guided());
  auto segments = (*session)->segments();
  REQUIRE(segments.size() == 2);
  const int64_t masked = (*session)->tokens().count();
  CHECK(segments[0].txt.size(0) == 4);  // template-keyed: the edit's text computed
  CHECK(segments[0].img.size(0) == masked);
  CHECK(segments[1].txt.size(0) == 0);  // the null prompt is what the entry was keyed by
  CHECK(segments[1].img.size(0) == masked);
  CHECK((*session)->prediction_rows() == 2 * masked);
  // Guidance 4 against guidance 1 changes the result.
  auto guided = run_edit(base, codec, tmpl, params, cache);
  params.guidance = 1.0;
  auto plain = run_edit(base, codec, tmpl, params, cache);
  REQUIRE((guided.ok() && plain.ok()));
  CHECK(max_pixel_diff(guided->image, plain->image) > 0.0);

  // FLUX.2 [dev]-style models embed the guidance: one segment.
  const auto dev = std::make_shared<const Flux2Transformer>(Flux2Transformer::random(small_config(true), 8, at::kFloat));
  params.guidance = 4.0;
  auto dev_session = Flux2EditSession::create(dev, codec, tmpl, params, {});
  REQUIRE(dev_session.ok());
  CHECK_FALSE((*dev_session)->guided());
  CHECK((*dev_session)->segments().size() == 1);
  CHECK((*dev_session)->segments()[0].guidance == 4.0);
}

TEST_CASE("FLUX.2 edit: bad inputs are refused, naming what does not match", "[flux2-edit]") {
  c10::InferenceMode guard;
  const auto model = std::make_shared<const Flux2Transformer>(Flux2Transformer::random(small_config(), 3, at::kFloat));
  const auto codec = patch_codec();
  const auto tmpl = make_flux2_template(*codec, test::random_image(64, 32, 3, PixelFormat::kU8, 4));
  Flux2EditParams params;
  params.mask = rect_mask(64, 32, 0, 0, 16, 16);
  params.prompt = at::zeros({4, 32});
  const auto error_of = [&](const Flux2EditParams& p, Flux2Cache cache) {
    auto s = Flux2EditSession::create(model, codec, tmpl, p, std::move(cache));
    REQUIRE_FALSE(s.ok());
    return s.status().to_string();
  };
  Flux2EditParams wide = params;
  wide.prompt = at::zeros({4, 33});
  CHECK_THAT(error_of(wide, {}), Catch::Contains("prompt") && Catch::Contains("32"));
  Flux2EditParams small_mask = params;
  small_mask.mask = at::zeros({16, 16});
  CHECK_THAT(error_of(small_mask, {}), Catch::Contains("mask is 16x16"));
  Flux2EditParams weak = params;
  weak.strength = 0.0;
  CHECK_THAT(error_of(weak, {}), Catch::Contains("strength"));
  // An entry of another schedule (3 steps for a 4-step edit) is named.
  Flux2Cache cache;
  cache.prompt_keyed = prepare(model, tmpl, params.prompt, 3, 0);
  CHECK_THAT(error_of(params, cache), Catch::Contains("prompt-keyed cache entry (steps 3"));
  // Text rows of another length than the entry was recorded with.
  Flux2EditParams longer = params;
  longer.prompt = at::zeros({5, 32});
  longer.steps = 3;
  CHECK_THAT(error_of(longer, cache), Catch::Contains("tokens"));
}

TEST_CASE("FLUX.2 edit with the upstream reference weights (klein transformer, VAE)", "[flux2-edit][shared]") {
  const std::string dir = infill::test::shared_path("testdata/flux2");
  test::require_shared_or_skip({dir + "/flux2_dit_klein.safetensors", dir + "/flux2_ae.safetensors"});
  c10::InferenceMode guard;
  auto dit_file = SafetensorsFile::open(dir + "/flux2_dit_klein.safetensors");
  auto ae_file = SafetensorsFile::open(dir + "/flux2_ae.safetensors");
  REQUIRE((dit_file.ok() && ae_file.ok()));
  auto transformer = Flux2Transformer::load(*dit_file, "weights.");
  auto autoencoder = Flux2Autoencoder::load(*ae_file, "weights.");
  REQUIRE((transformer.ok() && autoencoder.ok()));
  const auto model = std::make_shared<const Flux2Transformer>(std::move(*transformer));
  const auto codec = std::make_shared<const Flux2Autoencoder>(std::move(*autoencoder));
  const PixelImage image = test::random_image(96, 64, 3, PixelFormat::kU8, 21);
  const auto tmpl = make_flux2_template(*codec, image);
  Flux2EditParams params;
  params.mask = rect_mask(96, 64, 32, 16, 40, 32);
  params.steps = 4;
  params.template_seed = 3;
  params.seed = 4;
  params.prompt = at::randn({5, model->config().context_dim}, at::make_generator<at::CPUGeneratorImpl>(9));
  Flux2Cache cache;
  cache.prompt_keyed = prepare(model, tmpl, params.prompt, 4, 3);
  auto cached = run_edit(model, codec, tmpl, params, cache);
  auto uncached = run_edit(model, codec, tmpl, params, {});
  REQUIRE((cached.ok() && uncached.ok()));
  CHECK(cached->cache_mode == "prompt_keyed");
  CHECK(test::outside_identical(cached->image, image, params.mask));
  CHECK(test::outside_identical(uncached->image, image, params.mask));
  // Cached and recomputed edits differ only by the cache's approximation (unmasked tokens'
  // K/V from the prepare run): close on this model, never identical to the template.
  CHECK(max_pixel_diff(cached->image, image) > 0.01);
  CHECK(max_pixel_diff(cached->image, uncached->image) < 0.25);
}

TEST_CASE("FLUX.2 edit: a prompt-keyed entry recorded from a stroke gives that stroke's uncached result, the template's "
          "trajectory does not",
          "[flux2-edit]") {
  c10::InferenceMode guard;
  const auto model = std::make_shared<const Flux2Transformer>(Flux2Transformer::random(small_config(), 5, at::kFloat));
  const auto codec = patch_codec();
  const auto tmpl = make_flux2_template(*codec, test::random_image(80, 48, 3, PixelFormat::kF32, 6, 0.0f, 1.0f));
  Flux2EditParams params;
  params.mask = rect_mask(80, 48, 16, 16, 32, 16);
  params.steps = 4;
  params.seed = 5;  // the masked region's noise differs from the template's
  params.template_seed = 77;
  params.prompt = 30 * at::randn({6, 32}, at::make_generator<at::CPUGeneratorImpl>(11));
  params.halo_tokens = 0;

  for (const double strength : {1.0, 0.5}) {
    INFO("strength " << strength);
    params.strength = strength;
    at::Tensor uncached, from_stroke, from_template;
    REQUIRE(run_edit(model, codec, tmpl, params, {}, nullptr, &uncached).ok());

    auto recording = Flux2PrepareRun::from_stroke(model, tmpl, Flux2Stroke{params, codec});
    REQUIRE(recording.ok());
    CHECK((*recording)->tokens() == 6 + 2 * 15);
    while (!(*recording)->done()) (*recording)->run_step();
    Flux2Cache stroke_entry;
    stroke_entry.prompt_keyed = (*recording)->entry();
    Flux2CacheMode mode{};
    auto out = run_edit(model, codec, tmpl, params, stroke_entry, &mode, &from_stroke);
    REQUIRE(out.ok());
    CHECK(mode == Flux2CacheMode::kPromptKeyed);

    Flux2Cache template_entry;
    template_entry.prompt_keyed = prepare(model, tmpl, params.prompt, 4, 77);
    REQUIRE(run_edit(model, codec, tmpl, params, template_entry, nullptr, &from_template).ok());

    // The stroke's entry holds the K/V the uncached edit computes: only fp16 rounding remains.
    const double scale = uncached.abs().max().item<double>();
    CHECK(max_diff(from_stroke, uncached) <= 1e-3 * scale);
    // Against the template's trajectory, at the stroke's first step: the first block's K/V
    // (computed before any attention) differ in the masked image rows only; in the last block
    // the text rows differ too, having attended to the stroke's content instead of the template.
    const ActivationEntry& a = *stroke_entry.prompt_keyed;
    const ActivationEntry& b = *template_entry.prompt_keyed;
    const int64_t hidden = a.layout().hidden;
    const int step = strength == 1.0 ? 0 : 2;
    const auto rows_equal = [&](int block, int64_t first, int64_t count) {
      return std::memcmp(a.k(step, block) + first * hidden, b.k(step, block) + first * hidden,
                         static_cast<size_t>(count * hidden) * sizeof(uint16_t)) == 0;
    };
    const int64_t masked_row = 6 + 1 * 5 + 1;  // image token (1, 1): the rectangle's first
    CHECK(rows_equal(0, 0, 6));                   // text
    CHECK(rows_equal(0, 6, 5));                   // the image row above the mask
    CHECK_FALSE(rows_equal(0, masked_row, 2));    // the stroke's two tokens
    CHECK(rows_equal(0, 6 + 15, 15));             // reference tokens
    CHECK_FALSE(rows_equal(a.layout().blocks - 1, 0, 6));
  }

  // Guided: the recording holds both halves (the null-prompt half after the prompted one), so
  // both halves of a later edit read the stroke's context and the cached edit equals the
  // uncached one as closely as unguided. The null half was recorded from the stroke too: it
  // differs from the template's trajectory under the empty prompt (the template-keyed entry)
  // in the stroke's tokens in the first block, and in the text rows in the last.
  params.guidance = 3.0;
  params.null_prompt = 30 * at::randn({6, 32}, at::make_generator<at::CPUGeneratorImpl>(12));
  const int depth = model->config().depth();
  for (const double strength : {1.0, 0.5}) {
    INFO("guided, strength " << strength);
    params.strength = strength;
    at::Tensor uncached, cached;
    REQUIRE(run_edit(model, codec, tmpl, params, {}, nullptr, &uncached).ok());
    auto guided = Flux2PrepareRun::from_stroke(model, tmpl, Flux2Stroke{params, codec});
    REQUIRE(guided.ok());
    CHECK((*guided)->tokens() == 2 * (6 + 2 * 15));
    CHECK((*guided)->attention_pairs() == 2.0 * (6 + 2 * 15) * (6 + 2 * 15));  // two sequences, not one of twice the length
    while (!(*guided)->done()) (*guided)->run_step();
    Flux2Cache cache;
    cache.prompt_keyed = (*guided)->entry();
    cache.template_keyed = prepare(model, tmpl, params.null_prompt, 4, 77);
    CHECK(cache.prompt_keyed->layout().blocks == flux2_prompt_keyed_blocks(model->config(), params.guidance));
    CHECK(cache.prompt_keyed->layout().blocks == 2 * depth);
    Flux2CacheMode mode{};
    REQUIRE(run_edit(model, codec, tmpl, params, cache, &mode, &cached).ok());
    CHECK(mode == Flux2CacheMode::kPromptKeyed);
    CHECK(max_diff(cached, uncached) <= 1e-3 * uncached.abs().max().item<double>());

    const ActivationEntry& a = *cache.prompt_keyed;
    const ActivationEntry& b = *cache.template_keyed;
    const int64_t hidden = a.layout().hidden;
    const int step = strength == 1.0 ? 0 : 2;
    const auto null_rows_equal = [&](int block, int64_t first, int64_t count) {
      return std::memcmp(a.k(step, depth + block) + first * hidden, b.k(step, block) + first * hidden,
                         static_cast<size_t>(count * hidden) * sizeof(uint16_t)) == 0;
    };
    const int64_t masked_row = 6 + 1 * 5 + 1;
    CHECK(null_rows_equal(0, 0, 6));
    CHECK_FALSE(null_rows_equal(0, masked_row, 2));
    CHECK(null_rows_equal(0, 6 + 15, 15));
    CHECK_FALSE(null_rows_equal(depth - 1, 0, 6));
  }

  // A stroke whose mask does not fit the template is refused, naming the mask.
  params.strength = 1.0;
  Flux2Stroke bad{params, codec};
  bad.params.mask = at::ones({10, 10});
  auto refused = Flux2PrepareRun::from_stroke(model, tmpl, bad);
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(refused.status().to_string(), Catch::Contains("mask"));
}
