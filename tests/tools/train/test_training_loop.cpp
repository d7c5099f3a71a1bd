// The shared training loop: a later stage starts from the earlier stage's checkpoint
// (LoopOptions::init_from) and resumes from its own; a missing earlier stage is named.

#include "support/catch.h"

#include <filesystem>

#include <torch/torch.h>

#include "support/temp_dir.h"
#include "tools/train/training_loop.h"

using namespace infill;
using namespace infill::train;

namespace {

StepLoss squares_loss() {
  return [](torch::nn::Module& m, int, at::Generator& gen) {
    auto& linear = dynamic_cast<torch::nn::LinearImpl&>(m);
    const torch::Tensor x = at::randn({8, 4}, gen);
    return linear.forward(x).pow(2).mean();
  };
}

HeldOutLoss no_held_out() {
  return [](torch::nn::Module&, int) { return 0.0; };
}

LoopOptions loop_in(const std::string& dir, int steps, double lr) {
  LoopOptions o;
  o.steps = steps;
  o.lr = lr;
  o.warmup_steps = 1;
  o.checkpoint_every = steps;
  o.work_dir = dir;
  o.name = "test";
  return o;
}

}  // namespace

TEST_CASE("a second stage starts from the first stage's weights, then resumes from its own checkpoint", "[train][loop]") {
  test::TempDir dir("infill-train-loop");
  auto silent = [](const std::string&) {};
  torch::manual_seed(1);
  auto first = std::make_shared<torch::nn::LinearImpl>(4, 4);
  auto first_ema = std::make_shared<torch::nn::LinearImpl>(4, 4);
  REQUIRE(run_training(first, first_ema, loop_in(dir.file("first"), 20, 1e-2), squares_loss(), no_held_out(), silent).ok());

  // A fresh module of the same shape differs from the trained one ...
  torch::manual_seed(2);
  auto second = std::make_shared<torch::nn::LinearImpl>(4, 4);
  auto second_ema = std::make_shared<torch::nn::LinearImpl>(4, 4);
  CHECK_FALSE(torch::allclose(second->weight, first->weight));
  // ... until it starts from the first stage (a step at a negligible rate keeps the weights).
  LoopOptions stage = loop_in(dir.file("second"), 1, 1e-12);
  stage.init_from = dir.file("first") + "/checkpoint";
  std::vector<std::string> lines;
  REQUIRE(run_training(second, second_ema, stage, squares_loss(), no_held_out(),
                       [&](const std::string& l) { lines.push_back(l); })
              .ok());
  CHECK(torch::allclose(second->weight, first->weight, 0, 1e-6));
  CHECK_THAT(lines.front(), Catch::Contains("starting from the weights in " + stage.init_from));
  // Its own checkpoint wins over init_from once it exists.
  stage.steps = 2;
  lines.clear();
  REQUIRE(run_training(second, second_ema, stage, squares_loss(), no_held_out(),
                       [&](const std::string& l) { lines.push_back(l); })
              .ok());
  CHECK_THAT(lines.front(), Catch::Contains("resuming from step 1"));
}

TEST_CASE("a stage whose earlier stage has not run says which folder is missing", "[train][loop]") {
  test::TempDir dir("infill-train-loop");
  auto m = std::make_shared<torch::nn::LinearImpl>(4, 4);
  auto e = std::make_shared<torch::nn::LinearImpl>(4, 4);
  LoopOptions stage = loop_in(dir.file("second"), 1, 1e-3);
  stage.init_from = dir.file("first") + "/checkpoint";
  auto r = run_training(m, e, stage, squares_loss(), no_held_out(), [](const std::string&) {});
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.status().message(), Catch::Contains(stage.init_from));
  CHECK_THAT(r.status().message(), Catch::Contains("run that stage first"));
}
