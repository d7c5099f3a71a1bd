// A FLUX.2 edit session keeps its step state on the transformer's device (issue 39): the
// tables it makes once (RoPE of the rows computed, the timestep embedding of every level, the
// positions on the device) must equal what the forward makes itself from the ids and the
// timestep, in every cache mode and at every step; on a GPU every input of a step is on the
// device and the prediction is applied there.
#include "support/catch.h"
#include "support/cuda_device.h"
#include "support/random_image.h"
#include "support/tiny_flux2.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "model/flux2_transformer.h"
#include "pipeline/flux2_edit_session.h"
#include "pipeline/flux2_prepare_run.h"

using namespace infill;

namespace {

struct Setup {
  std::shared_ptr<const Flux2Transformer> model;
  std::shared_ptr<const LatentCodec> codec = test::flux2_patch_codec();
  std::shared_ptr<const TemplateImage> tmpl;
  at::Tensor prompt, null_prompt;
  Flux2EditParams params;

  explicit Setup(const Flux2Config& cfg) {
    model = std::make_shared<const Flux2Transformer>(Flux2Transformer::random(cfg, 11, at::kFloat));
    auto png = encode_png(test::random_image(64, 48, 3, PixelFormat::kF32, 5, 0.0f, 1.0f));
    REQUIRE(png.ok());
    auto made = make_template(*codec, codec->factor(), 0.0, 1.0, int64_t{1} << 24, *png, "template.png");
    REQUIRE(made.ok());
    tmpl = *made;
    prompt = at::randn({5, cfg.context_dim}, at::TensorOptions().dtype(at::kFloat));
    null_prompt = at::randn({5, cfg.context_dim}, at::TensorOptions().dtype(at::kFloat));
    params.mask = at::zeros({48, 64}, at::kFloat);
    params.mask.narrow(0, 8, 24).narrow(1, 16, 24).fill_(1.0);
    params.prompt = prompt;
    params.steps = 3;
    params.seed = 3;
  }

  std::shared_ptr<const ActivationEntry> entry(const at::Tensor& text) const {
    auto run = Flux2PrepareRun::create(model, tmpl, text, params.steps, params.template_seed, 1.0);
    REQUIRE(run.ok());
    while (!(*run)->done()) (*run)->run_step();
    return (*run)->entry();
  }
};

// The same segments without anything the session made for the forward: it makes its own.
std::vector<Flux2Segment> without_tables(std::span<const Flux2Segment> given) {
  std::vector<Flux2Segment> plain(given.begin(), given.end());
  for (Flux2Segment& s : plain) {
    s.rope_cos = s.rope_sin = s.time_embedding = s.guidance_embedding = s.positions_on_device = at::Tensor();
  }
  return plain;
}

// Runs the session to its end; at every step the forward with the session's tables must give
// the same rows as without them, and the tables must be there.
void check_every_step(Flux2EditSession& session, const Flux2Transformer& model) {
  int steps = 0;
  while (!session.done()) {
    std::span<Flux2Segment> segments = session.segments();
    for (const Flux2Segment& s : segments) {
      REQUIRE(s.rope_cos.defined());
      REQUIRE(s.rope_sin.defined());
      REQUIRE(s.time_embedding.defined());
      CHECK(at::equal(s.time_embedding, flux2_timestep_embedding(s.timestep, model.config().time_embed_dim)));
      if (s.positions.defined()) CHECK(at::equal(s.positions_on_device, s.positions));
    }
    std::vector<Flux2Segment> plain = without_tables(segments);
    const at::Tensor own = model.forward(plain);
    const at::Tensor with_tables = model.forward(segments);
    REQUIRE(with_tables.sizes() == own.sizes());
    CHECK(at::equal(with_tables, own));
    REQUIRE(session.apply(with_tables).ok());
    ++steps;
  }
  CHECK(steps == session.steps() - session.first_step());
}

}  // namespace

TEST_CASE("A FLUX.2 session's tables on its device equal what the forward makes itself, in every cache mode",
          "[flux2-edit][step-state]") {
  c10::InferenceMode guard;
  Setup setup(test::tiny_flux2_config(32));
  const auto template_keyed = setup.entry(at::zeros({5, setup.model->config().context_dim}, at::kFloat));
  const auto prompt_keyed = setup.entry(setup.prompt);

  SECTION("no cache: every row") {
    auto session = Flux2EditSession::create(setup.model, setup.codec, setup.tmpl, setup.params, {});
    REQUIRE(session.ok());
    REQUIRE((*session)->mode() == Flux2CacheMode::kOff);
    check_every_step(**session, *setup.model);
  }
  SECTION("template-keyed: text and masked rows") {
    Flux2Cache cache;
    cache.template_keyed = template_keyed;
    auto session = Flux2EditSession::create(setup.model, setup.codec, setup.tmpl, setup.params, cache);
    REQUIRE(session.ok());
    REQUIRE((*session)->mode() == Flux2CacheMode::kTemplateKeyed);
    check_every_step(**session, *setup.model);
  }
  SECTION("template-keyed with a recomputed prefix: every row, then the masked ones") {
    Flux2Cache cache;
    cache.template_keyed = template_keyed;
    cache.recompute_blocks = 2;
    auto session = Flux2EditSession::create(setup.model, setup.codec, setup.tmpl, setup.params, cache);
    REQUIRE(session.ok());
    check_every_step(**session, *setup.model);
  }
  SECTION("prompt-keyed: masked rows only") {
    Flux2Cache cache;
    cache.prompt_keyed = prompt_keyed;
    auto session = Flux2EditSession::create(setup.model, setup.codec, setup.tmpl, setup.params, cache);
    REQUIRE(session.ok());
    REQUIRE((*session)->mode() == Flux2CacheMode::kPromptKeyed);
    check_every_step(**session, *setup.model);
  }
  SECTION("guided, prompt-keyed with the template-keyed entry as the null half's") {
    Flux2Cache cache;
    cache.prompt_keyed = prompt_keyed;
    cache.template_keyed = template_keyed;
    Flux2EditParams params = setup.params;
    params.guidance = 3.0;
    params.null_prompt = setup.null_prompt;
    auto session = Flux2EditSession::create(setup.model, setup.codec, setup.tmpl, params, cache);
    REQUIRE(session.ok());
    REQUIRE((*session)->guided());
    check_every_step(**session, *setup.model);
  }
}

TEST_CASE("A FLUX.2 guidance_embed session gives the forward the embedded guidance it would make itself",
          "[flux2-edit][step-state]") {
  c10::InferenceMode guard;
  Setup setup(test::tiny_flux2_config(32, true));
  setup.params.guidance = 4.0;
  auto session = Flux2EditSession::create(setup.model, setup.codec, setup.tmpl, setup.params, {});
  REQUIRE(session.ok());
  std::span<Flux2Segment> segments = (*session)->segments();
  REQUIRE(segments[0].guidance_embedding.defined());
  CHECK(at::equal(segments[0].guidance_embedding,
                  flux2_timestep_embedding(4.0, setup.model->config().time_embed_dim)));
  check_every_step(**session, *setup.model);
}

TEST_CASE("A FLUX.2 session on a GPU keeps every input of a step on the device and applies the prediction there",
          "[flux2-edit][step-state][cuda]") {
  const ComputeDevice cuda = test::require_cuda_or_skip();
  c10::InferenceMode guard;
  Setup setup(test::tiny_flux2_config(32));
  auto on_gpu = std::make_shared<Flux2Transformer>(Flux2Transformer::random(setup.model->config(), 11, at::kFloat));
  REQUIRE(on_gpu->to_device(cuda, at::kFloat).ok());
  Setup gpu = setup;
  gpu.model = on_gpu;
  Flux2Cache cache;
  cache.prompt_keyed = gpu.entry(gpu.prompt);
  auto session = Flux2EditSession::create(gpu.model, gpu.codec, gpu.tmpl, gpu.params, cache);
  REQUIRE(session.ok());
  Flux2Cache cpu_cache;
  cpu_cache.prompt_keyed = setup.entry(setup.prompt);
  auto on_cpu = Flux2EditSession::create(setup.model, setup.codec, setup.tmpl, setup.params, cpu_cache);
  REQUIRE(on_cpu.ok());
  while (!(*session)->done()) {
    std::span<Flux2Segment> segments = (*session)->segments();
    for (const Flux2Segment& s : segments) {
      for (const at::Tensor* t : {&s.txt, &s.img, &s.rope_cos, &s.rope_sin, &s.time_embedding, &s.positions_on_device}) {
        REQUIRE(t->defined());
        CHECK(t->device().is_cuda());
      }
    }
    const at::Tensor rows = gpu.model->forward_on_device(segments);
    CHECK(rows.device().is_cuda());
    REQUIRE((*session)->apply(rows).ok());
    REQUIRE((*on_cpu)->apply(setup.model->forward((*on_cpu)->segments())).ok());
  }
  // float32 on both: the GPU's GEMMs sum in another order (TF32 is off in libtorch by default).
  const at::Tensor gpu_latent = (*session)->predicted_latent(), cpu_latent = (*on_cpu)->predicted_latent();
  CHECK(gpu_latent.device().is_cpu());
  CHECK((gpu_latent - cpu_latent).abs().max().item<double>() <= 1e-3 * (1.0 + cpu_latent.abs().max().item<double>()));
}
