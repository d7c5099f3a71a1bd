// The trainable DiT of infill-train and the engine's inference DiT are two implementations of
// the same network: weights exported by one must give the same prediction in the other.

#include "support/catch.h"

#include <torch/torch.h>

#include "model/dit.h"
#include "support/temp_dir.h"
#include "support/tiny_dit.h"
#include "tools/train/train_dit.h"

using namespace infill;

namespace {

DitConfig small_config() { return test::tiny_inpainting_dit(64, 3, 14); }

}  // namespace

TEST_CASE("weights exported from the training DiT reproduce its forward in the engine DiT", "[train][dit]") {
  torch::manual_seed(7);
  const DitConfig cfg = small_config();
  train::TrainDit trained(cfg);
  {
    // Non-zero everywhere (the DiT init zeroes adaLN and the final layer, which would hide
    // errors), then rounded to fp16 so the exported file holds exactly these weights.
    torch::NoGradGuard no_grad;
    for (auto& p : trained->parameters()) p.copy_((torch::randn_like(p) * 0.1).to(torch::kHalf).to(torch::kFloat));
  }
  test::TempDir dir("infill-train-dit");
  REQUIRE(train::export_dit(trained, dir.file("dit.safetensors")).ok());
  auto engine = Dit::load(cfg, dir.file("dit.safetensors"));
  REQUIRE(engine.ok());

  const int64_t h = 12, w = 16, p = cfg.patch_size, gh = h / p, gw = w / p, L = gh * gw;
  const torch::Tensor input = torch::randn({1, cfg.in_channels(), h, w});
  torch::Tensor prompt = torch::zeros({1, 14});
  prompt[0][3] = 1.0f;
  prompt[0][12] = 1.0f;
  const torch::Tensor prompted = torch::rand({1, L}) < 0.4;
  const double timestep = 637.5;
  torch::Tensor expected;
  {
    torch::NoGradGuard no_grad;
    expected = trained->forward(input, torch::full({1}, timestep), prompt, prompted);  // [1, C, h, w]
  }

  c10::InferenceMode guard;
  DitSegment seg;
  seg.tokens = engine->patchify(input[0]);
  seg.token_ids = at::arange(L, at::kLong);
  seg.grid_h = static_cast<int>(gh);
  seg.grid_w = static_cast<int>(gw);
  seg.cond = engine->conditioning(timestep, prompt[0]);
  seg.null_cond = engine->conditioning(timestep, at::Tensor());
  seg.prompted = prompted[0];
  seg.full_blocks = cfg.depth;
  DitSegment segs[] = {seg};
  const at::Tensor rows = engine->forward(segs);
  at::Tensor got = at::zeros({cfg.latent_channels, h, w});
  engine->unpatchify_into(got, rows, seg.token_ids);

  const double err = (got - expected[0]).abs().max().item<double>();
  INFO("max abs difference " << err << ", prediction scale " << expected.abs().max().item<double>());
  CHECK(err < 1e-4);
}

TEST_CASE("the training DiT starts as the DiT paper's adaLN-Zero network (zero prediction)", "[train][dit]") {
  torch::manual_seed(3);
  train::TrainDit model(small_config());
  torch::NoGradGuard no_grad;
  const torch::Tensor out = model->forward(torch::randn({2, 9, 8, 8}), torch::tensor({10.0, 900.0}),
                                           torch::zeros({2, 14}), torch::zeros({2, 16}, torch::kBool));
  CHECK(out.sizes() == torch::IntArrayRef({2, 4, 8, 8}));
  CHECK(out.abs().max().item<double>() == 0.0);
}
