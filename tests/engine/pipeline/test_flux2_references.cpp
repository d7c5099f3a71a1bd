// Reference images of FLUX.2 edits (pipeline/reference_image.h): their tokens follow the
// template's own reference tokens at t = 20, 30, ... (upstream's encode_image_refs gives the
// i-th reference t = 10 + 10 i; the template is this engine's first), their K/V are part of
// the cached context, and an edit with references equals its full recompute. Small random
// transformers with a patch codec of FLUX.2's latent shape (factor 16, 128 channels).
#include "support/catch.h"
#include "support/outside_mask.h"
#include "support/random_image.h"
#include "support/temp_dir.h"
#include "support/tiny_flux2.h"

#include <cmath>
#include <cstring>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/InferenceMode.h>

#include "model/flux2_transformer.h"
#include "pipeline/flux2_edit_session.h"
#include "pipeline/flux2_prepare_run.h"
#include "pipeline/flux2_sequence.h"
#include "pipeline/reference_image.h"

using namespace infill;

namespace {

std::shared_ptr<const TemplateImage> picture(const LatentCodec& codec, int width, int height, uint64_t seed) {
  auto t = template_from_pixels(codec, codec.factor(), 0.0, 1.0,
                                test::random_image(width, height, 3, PixelFormat::kF32, seed, 0.0f, 1.0f),
                                "picture-" + std::to_string(seed));
  REQUIRE(t.ok());
  return *t;
}

std::shared_ptr<const ActivationEntry> prepare(const std::shared_ptr<const Flux2Transformer>& model,
                                               const std::shared_ptr<const TemplateImage>& tmpl, const at::Tensor& text,
                                               std::vector<at::Tensor> references) {
  auto run = Flux2PrepareRun::create(model, tmpl, text, 1, 77, 1.0, at::Tensor(), {}, std::move(references));
  REQUIRE(run.ok());
  while (!(*run)->done()) (*run)->run_step();
  return (*run)->entry();
}

// The edit run to its end; `latent` gets its final latent (small random weights clamp pixels).
Result<EditOutput> run_edit(const std::shared_ptr<const Flux2Transformer>& model, const std::shared_ptr<const LatentCodec>& codec,
                            const std::shared_ptr<const TemplateImage>& tmpl, const Flux2EditParams& params, Flux2Cache cache,
                            at::Tensor* latent) {
  auto session = Flux2EditSession::create(model, codec, tmpl, params, std::move(cache));
  if (!session.ok()) return session.status();
  while (!(*session)->done()) {
    const at::Tensor prediction = model->forward((*session)->segments());
    INFILL_RETURN_IF_ERROR((*session)->apply(prediction));
  }
  *latent = (*session)->predicted_latent();
  return (*session)->finish();
}


}  // namespace

TEST_CASE("FLUX.2 reference rows: the template at t = 10, then each reference at t = 20, 30 on its own grid",
          "[flux2-edit][references]") {
  c10::InferenceMode guard;
  const at::Tensor tmpl = at::randn({8, 2, 3});
  const std::vector<at::Tensor> refs = {at::randn({8, 4, 1}), at::randn({8, 1, 2})};
  const Flux2ReferenceRows r = flux2_reference_rows(tmpl, refs, 4);
  REQUIRE(r.rows.sizes() == at::IntArrayRef({6 + 4 + 2, 12}));
  REQUIRE(r.ids.sizes() == at::IntArrayRef({12, 4}));
  // Upstream's prc_img: ids (t, h, w, 0) over the latent grid, row-major; t = 10 + 10 i.
  const int64_t sizes[3][2] = {{2, 3}, {4, 1}, {1, 2}};
  int64_t row = 0;
  for (int image = 0; image < 3; ++image) {
    const at::Tensor& latent = image == 0 ? tmpl : refs[image - 1];
    for (int64_t y = 0; y < sizes[image][0]; ++y)
      for (int64_t x = 0; x < sizes[image][1]; ++x, ++row) {
        INFO("image " << image << " row " << row);
        CHECK(r.ids[row][0].item<float>() == 10.0f * (image + 1));
        CHECK(r.ids[row][1].item<float>() == float(y));
        CHECK(r.ids[row][2].item<float>() == float(x));
        CHECK(r.ids[row][3].item<float>() == 0.0f);
        CHECK(at::equal(r.rows[row].narrow(0, 0, 8), latent.select(1, y).select(1, x)));
        CHECK(r.rows[row].narrow(0, 8, 4).abs().sum().item<float>() == 0.0f);  // no mask cells
      }
  }
}

TEST_CASE("FLUX.2 edit with reference images: equals its full recompute in both cache modes, and the references count",
          "[flux2-edit][references]") {
  c10::InferenceMode guard;
  test::TempDir dir("infill-flux2-references");
  // Weights at PyTorch's default scale: with Flux2Transformer::random's 0.02 attention moves the
  // output by less than the cache tolerance, and a dropped reference would go unnoticed.
  const auto model = std::make_shared<const Flux2Transformer>(
      test::attentive_flux2(test::tiny_flux2_config(32), 3, dir.file("transformer.safetensors")));
  const auto codec = test::flux2_patch_codec();
  const auto tmpl = picture(*codec, 80, 48, 9);
  // References of other sizes than the template's, as users bring them.
  const std::vector<at::Tensor> refs = {picture(*codec, 64, 64, 21)->latent, picture(*codec, 96, 32, 22)->latent};
  const at::Tensor prompt = 30 * at::randn({6, 32}, at::make_generator<at::CPUGeneratorImpl>(1));
  const at::Tensor empty_prompt = 30 * at::randn({6, 32}, at::make_generator<at::CPUGeneratorImpl>(2));

  // One step with the template's own noise: every input of the edit's step equals the prepare
  // run's, so the fp16 rounding of the cached K/V is all that separates cached and recomputed.
  Flux2EditParams params;
  params.mask = at::zeros({48, 80});
  params.mask.narrow(0, 16, 16).narrow(1, 16, 32).fill_(1.0);
  params.steps = 1;
  params.seed = params.template_seed = 77;
  params.prompt = prompt;
  params.halo_tokens = 0;
  params.references = refs;

  at::Tensor full_latent, cached_latent, plain_latent;
  auto full = run_edit(model, codec, tmpl, params, {}, &full_latent);
  REQUIRE(full.ok());
  CHECK(full->cache_mode == "off");
  const double scale = full_latent.abs().max().item<double>();

  Flux2Cache prompt_keyed;
  prompt_keyed.prompt_keyed = prepare(model, tmpl, prompt, refs);
  // The entry holds every token: text, image, the template's reference tokens and the references'.
  CHECK(prompt_keyed.prompt_keyed->layout().tokens == 6 + 2 * 15 + 16 + 12);
  auto cached = run_edit(model, codec, tmpl, params, prompt_keyed, &cached_latent);
  REQUIRE(cached.ok());
  CHECK(cached->cache_mode == "prompt_keyed");
  CHECK(cached->masked_tokens == 2);  // the references are never computed
  CHECK((cached_latent - full_latent).abs().max().item<double>() <= 1e-3 * scale);
  CHECK(test::outside_identical(cached->image, full->image, params.mask));
  CHECK(test::outside_identical(cached->image, tmpl->pixels, params.mask));

  // Template-keyed: text computed afresh against the references' cached K/V.
  Flux2Cache template_keyed;
  template_keyed.template_keyed = prepare(model, tmpl, empty_prompt, refs);
  at::Tensor template_latent;
  auto from_template = run_edit(model, codec, tmpl, params, template_keyed, &template_latent);
  REQUIRE(from_template.ok());
  CHECK(from_template->cache_mode == "template_keyed");
  CHECK(test::outside_identical(from_template->image, tmpl->pixels, params.mask));
  Flux2EditParams empty_params = params;
  empty_params.prompt = empty_prompt;
  at::Tensor full_empty, cached_empty;
  REQUIRE(run_edit(model, codec, tmpl, empty_params, {}, &full_empty).ok());
  REQUIRE(run_edit(model, codec, tmpl, empty_params, template_keyed, &cached_empty).ok());
  CHECK((cached_empty - full_empty).abs().max().item<double>() <= 1e-3 * full_empty.abs().max().item<double>());

  // The references count: without them (or with one only) the same edit comes out otherwise,
  // by five times the cache tolerance and more (measured: 2.0 % and 0.9 % of the scale).
  Flux2EditParams without = params;
  without.references.clear();
  REQUIRE(run_edit(model, codec, tmpl, without, {}, &plain_latent).ok());
  CHECK((plain_latent - full_latent).abs().max().item<double>() > 5e-3 * scale);
  Flux2EditParams one = params;
  one.references = {refs[0]};
  at::Tensor one_latent;
  REQUIRE(run_edit(model, codec, tmpl, one, {}, &one_latent).ok());
  CHECK((one_latent - full_latent).abs().max().item<double>() > 5e-3 * scale);

  // An entry recorded without the references is not this edit's: refused, naming the layout.
  Flux2Cache other;
  other.prompt_keyed = prepare(model, tmpl, prompt, {});
  auto refused = run_edit(model, codec, tmpl, params, other, &plain_latent);
  REQUIRE(!refused.ok());
  CHECK(refused.status().message().find("prompt-keyed") != std::string::npos);
  // A reference that is not a latent of the model is refused naming it.
  Flux2EditParams bad = params;
  bad.references = {refs[0], at::zeros({16, 2, 2})};
  auto bad_run = run_edit(model, codec, tmpl, bad, {}, &plain_latent);
  REQUIRE(!bad_run.ok());
  CHECK(bad_run.status().message().find("reference image 1") != std::string::npos);
}

TEST_CASE("Reference images: large ones are scaled to 1024x1024 pixels keeping their aspect, unusable ones are refused",
          "[flux2-edit][references]") {
  c10::InferenceMode guard;
  const auto codec = test::flux2_patch_codec();
  const auto small = picture(*codec, 96, 64, 3);
  auto kept = make_reference_image(*codec, codec->factor(), *small);
  REQUIRE(kept.ok());
  CHECK(kept->id == small->id);
  CHECK(at::equal(kept->latent, small->latent));  // within the cap: the template's own latent

  // 1600x1200 (1.92 Mpx): scaled by sqrt(1024^2 / (1600 * 1200)) to 1182x886, padded to 16.
  auto big_template = picture(*codec, 1600, 1200, 4);
  auto big = make_reference_image(*codec, codec->factor(), *big_template);
  REQUIRE(big.ok());
  const double s = std::sqrt(1024.0 * 1024.0 / (1600.0 * 1200.0));
  const int64_t w = static_cast<int64_t>(1600 * s), h = static_cast<int64_t>(1200 * s);
  CHECK(big->latent.size(0) == 128);
  CHECK(big->latent.size(2) == (w + 15) / 16);
  CHECK(big->latent.size(1) == (h + 15) / 16);
  CHECK(w * h <= kMaxReferencePixels);
  // The scaled image is the picture's: a uniform picture stays uniform at its colour (the
  // patch codec encodes a uniform patch to the same latent at any size).
  PixelImage grey = test::random_image(1500, 1000, 3, PixelFormat::kF32, 5, 0.4f, 0.4f);
  auto grey_template = template_from_pixels(*codec, codec->factor(), 0.0, 1.0, grey, "grey");
  auto grey_small = template_from_pixels(*codec, codec->factor(), 0.0, 1.0,
                                         test::random_image(64, 64, 3, PixelFormat::kF32, 5, 0.4f, 0.4f), "grey-small");
  REQUIRE(grey_template.ok());
  REQUIRE(grey_small.ok());
  auto grey_ref = make_reference_image(*codec, codec->factor(), **grey_template);
  REQUIRE(grey_ref.ok());
  const at::Tensor expected = (*grey_small)->latent.select(1, 0).select(1, 0);
  const at::Tensor every = grey_ref->latent.reshape({128, -1});
  CHECK((every - expected.unsqueeze(1)).abs().max().item<double>() <= 1e-4);

  auto tiny = make_reference_image(*codec, codec->factor(), *picture(*codec, 48, 64, 6));
  REQUIRE(!tiny.ok());
  CHECK(tiny.status().message().find("picture-6") != std::string::npos);
  CHECK(tiny.status().message().find("at least 64 pixels") != std::string::npos);
  auto thin = make_reference_image(*codec, codec->factor(), *picture(*codec, 1040, 64, 7));
  REQUIRE(!thin.ok());
  CHECK(thin.status().message().find("aspect ratio") != std::string::npos);
}
