// A FLUX.2 prepare run in sequence parallel (Flux2PrepareRun::step_segments / step_done with
// model/flux2_sequence_parallel.h over a real Gloo group) records the entry the run on one
// device records: every step's and block's K/V, both halves of a guided prompt-keyed entry.
// The entry is fp16: tolerance max |diff| / max |reference| <= 1e-3 per block (an fp16 ulp is
// 2^-11 of a value's scale; the float32 forwards agree to 1e-5).
#include "support/catch.h"
#include "support/device_groups.h"
#include "support/random_image.h"
#include "support/temp_dir.h"
#include "support/tiny_flux2.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "model/flux2_sequence_parallel.h"
#include "pipeline/cached_kv.h"
#include "pipeline/flux2_prepare_run.h"
#include "pipeline/template_image.h"

using namespace infill;

namespace {

at::Tensor slab(const ActivationEntry& e, int step, int block, bool keys) {
  const ActivationLayout& l = e.layout();
  at::Tensor out = at::empty({l.tokens, l.hidden}, at::kFloat);
  fp16_slab_to_float(keys ? e.k(step, block) : e.v(step, block), out);
  return out;
}

}  // namespace

TEST_CASE("A prepare run in sequence parallel over 2 and 3 Gloo ranks records the entry of the run on one device", "[pipeline][parallel]") {
  c10::InferenceMode guard;
  test::TempDir dir;
  Flux2Config cfg = test::tiny_flux2_config(32, /*guidance_embed=*/true);
  cfg.hidden_size = 96;
  cfg.num_heads = 12;
  cfg.mlp_hidden = 192;
  cfg.axes_dim = {2, 2, 2, 2};
  auto model = std::make_shared<const Flux2Transformer>(test::attentive_flux2(cfg, 4, dir.file("t.safetensors")));
  const auto codec = test::flux2_patch_codec();
  auto tmpl = template_from_pixels(*codec, codec->factor(), 0.0, 1.0,
                                   test::random_image(96, 64, 3, PixelFormat::kF32, 9, 0.0f, 1.0f), "picture");
  REQUIRE(tmpl.ok());
  const at::Tensor text = at::randn({5, cfg.context_dim});
  const at::Tensor null_text = at::zeros({5, cfg.context_dim});
  const int steps = 2;
  // A guided prompt-keyed entry: every step has the prompted and the null-prompt half.
  auto make_run = [&] {
    auto run = Flux2PrepareRun::create(model, *tmpl, text, steps, 77, 3.0, null_text);
    REQUIRE(run.ok());
    return std::move(*run);
  };
  auto alone = make_run();
  while (!alone->done()) alone->run_step();

  for (int ranks : {2, 3}) {
    DYNAMIC_SECTION(ranks << " ranks") {
      auto group = test::cpu_group_or_skip(ranks);
      auto run = make_run();
      REQUIRE(run->splits_over_devices());
      while (!run->done()) {
        std::vector<Flux2Segment> segments = run->step_segments();
        REQUIRE(segments.size() == 2);
        const auto errors = test::on_every_rank(ranks, [&](int r) {
          for (const Flux2Segment& s : segments) (void)flux2_forward_sequence_parallel(*model, s, *group[r]);
        });
        for (const std::string& e : errors) REQUIRE(e.empty());
        run->step_done();
      }
      const ActivationEntry& got = *run->entry();
      const ActivationEntry& expected = *alone->entry();
      REQUIRE(got.layout().blocks == 2 * cfg.depth());
      for (int step = 0; step < steps; ++step) {
        for (int block = 0; block < got.layout().blocks; ++block) {
          INFO("step " << step << ", block " << block);
          for (bool keys : {true, false}) {
            const at::Tensor a = slab(got, step, block, keys), b = slab(expected, step, block, keys);
            CHECK((a - b).abs().max().item<double>() <= 1e-3 * b.abs().max().item<double>());
          }
        }
      }
    }
  }
}
