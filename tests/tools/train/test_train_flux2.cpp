// The trainable FLUX.2 transformer of infill-train and the engine's Flux2Transformer (checked
// against upstream's reference tensors in tests/engine/model) are two implementations of the
// same network: weights exported by one must give the same prediction in the other, mask
// channels and reference tokens included.

#include "support/catch.h"

#include <torch/torch.h>

#include "model/flux2_checkpoint.h"
#include "model/flux2_transformer.h"
#include "pipeline/flux2_sequence.h"
#include "support/temp_dir.h"
#include "tools/train/train_flux2.h"

using namespace infill;

namespace {

Flux2Config small_config() {
  Flux2Config c;
  c.in_channels = 8;
  c.mask_channels = 4;
  c.context_dim = 24;
  c.hidden_size = 64;
  c.num_heads = 2;
  c.double_blocks = 2;
  c.single_blocks = 2;
  c.mlp_hidden = 192;
  c.axes_dim = {8, 8, 8, 8};
  return c;
}

}  // namespace

TEST_CASE("weights exported from the training FLUX.2 transformer reproduce its forward in the engine", "[train][flux2]") {
  torch::manual_seed(11);
  const Flux2Config cfg = small_config();
  train::TrainFlux2 trained(cfg);
  {
    // Non-zero everywhere (the init zeroes the modulation and the final layer, which would
    // hide errors), rounded to fp16 so the exported file holds exactly these weights.
    torch::NoGradGuard no_grad;
    for (auto& p : trained->parameters()) {
      const bool scale = p.dim() == 1;
      p.copy_(((scale ? 1.0 : 0.0) + torch::randn_like(p) * 0.1).to(torch::kHalf).to(torch::kFloat));
    }
  }
  test::TempDir dir("infill-train-flux2");
  REQUIRE(train::export_flux2(trained, dir.file("transformer.safetensors")).ok());
  auto checkpoint = Flux2Checkpoint::open({dir.file("transformer.safetensors")});
  REQUIRE(checkpoint.ok());
  auto engine = Flux2Transformer::load(*checkpoint);
  REQUIRE(engine.ok());
  CHECK(engine->config().in_channels == cfg.in_channels);
  CHECK(engine->config().mask_channels == cfg.mask_channels);
  CHECK(engine->config().depth() == cfg.depth());

  const int64_t T = 5, gh = 3, gw = 4, N = gh * gw;
  const torch::Tensor txt = torch::randn({1, T, cfg.context_dim});
  const torch::Tensor latent = torch::randn({1, 2 * N, cfg.in_channels});
  torch::Tensor cells = torch::zeros({1, 2 * N, cfg.mask_channels});
  cells.narrow(1, 0, N).copy_(torch::rand({1, N, cfg.mask_channels}));  // reference rows keep zero cells
  const torch::Tensor img = torch::cat({latent, cells}, 2);
  const torch::Tensor txt_ids = flux2_text_ids(T);
  const torch::Tensor img_ids = torch::cat({flux2_grid_ids(gh, gw, 0), flux2_grid_ids(gh, gw, kFlux2ReferenceTime)});
  const double level = 0.62;
  torch::Tensor expected;
  {
    torch::NoGradGuard no_grad;
    expected = trained->forward(txt, txt_ids, img, img_ids, torch::full({1}, level), N)[0];  // [N, C]
  }

  Flux2Segment seg;
  seg.txt = txt[0];
  seg.txt_ids = txt_ids;
  seg.img = img[0];
  seg.img_ids = img_ids;
  seg.timestep = level;
  const at::Tensor rows = engine->forward(std::span<Flux2Segment>(&seg, 1));  // [2N, C]
  REQUIRE(rows.sizes() == at::IntArrayRef({2 * N, cfg.in_channels}));
  const double diff = (rows.narrow(0, 0, N) - expected).abs().max().item<double>();
  INFO("max abs difference " << diff << ", prediction scale " << expected.abs().max().item<double>());
  CHECK(diff < 1e-4);
  // The mask cells reach the prediction: the same rows with other cells predict differently.
  Flux2Segment other = seg;
  other.img = torch::cat({latent[0], torch::zeros({2 * N, cfg.mask_channels})}, 1);
  const at::Tensor unmasked = engine->forward(std::span<Flux2Segment>(&other, 1));
  CHECK((unmasked - rows).abs().max().item<double>() > 1e-3);
}

TEST_CASE("the training FLUX.2 transformer starts as the zero prediction and learns a batch", "[train][flux2]") {
  torch::manual_seed(3);
  const Flux2Config cfg = small_config();
  train::TrainFlux2 model(cfg);
  const int64_t T = 4, g = 2, N = g * g;
  const torch::Tensor txt = torch::randn({2, T, cfg.context_dim});
  const torch::Tensor img = torch::randn({2, 2 * N, cfg.input_channels()});
  const torch::Tensor txt_ids = flux2_text_ids(T);
  const torch::Tensor img_ids = torch::cat({flux2_grid_ids(g, g, 0), flux2_grid_ids(g, g, kFlux2ReferenceTime)});
  const torch::Tensor t = torch::tensor({0.3f, 0.8f});
  const torch::Tensor target = torch::randn({2, N, cfg.in_channels});
  CHECK(model->forward(txt, txt_ids, img, img_ids, t, N).abs().max().item<double>() == 0.0);
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(3e-3));
  double first = 0.0, last = 0.0;
  for (int i = 0; i < 60; ++i) {
    optimizer.zero_grad();
    torch::Tensor loss = (model->forward(txt, txt_ids, img, img_ids, t, N) - target).pow(2).mean();
    loss.backward();
    optimizer.step();
    if (i == 0) first = loss.item<double>();
    last = loss.item<double>();
  }
  INFO("loss " << first << " -> " << last);
  CHECK(last < 0.5 * first);
}
