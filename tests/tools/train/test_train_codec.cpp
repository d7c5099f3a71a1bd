// The trainable decoder of infill-tiny 2's codec, its training and the blockiness metric.

#include "support/catch.h"

#include <filesystem>
#include <fstream>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <torch/torch.h>

#include "model/learned_decoder_codec.h"
#include "model/safetensors.h"
#include "model/safetensors_torch.h"
#include "support/temp_dir.h"
#include "tools/train/image_metrics.h"
#include "tools/train/patch_pca_fit.h"
#include "tools/train/train_codec.h"

using namespace infill;
using namespace infill::train;
namespace fs = std::filesystem;

namespace {

LearnedDecoderConfig small_config() {
  LearnedDecoderConfig c;
  c.widths = {16, 8, 8, 4};
  c.blocks = {2, 1, 0, 1};
  return c;
}

// Smooth synthetic pictures (low-resolution noise upsampled): three to train on, one held out.
Dataset synthetic_dataset() {
  c10::InferenceMode guard;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(21);
  Dataset data;
  for (int i = 0; i < 4; ++i) {
    SourceImage image;
    image.group = "synthetic/" + std::to_string(i);
    image.path = image.group + ".png";
    image.rgb =
        at::upsample_bilinear2d(at::rand({1, 3, 6, 6}, gen), {96, 96}, false)[0].contiguous();
    (i < 3 ? data.train : data.held_out).push_back(image);
  }
  return data;
}

PatchPcaCodec fitted_pca(const Dataset& data) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(22);
  CropOptions crops;
  crops.size = 64;
  auto pca = fit_patch_pca(random_crops(data.train, 64, crops, gen), 8, 8);
  REQUIRE(pca.ok());
  return *pca;
}

CodecTrainOptions quick_options(const std::string& work_dir) {
  CodecTrainOptions o;
  o.decoder = small_config();
  o.steps = 30;
  o.batch = 4;
  o.crop = 32;
  o.lr = 3e-3;
  o.warmup_steps = 5;
  o.checkpoint_every = 30;
  o.eval_crops = 4;
  o.eval_crop = 64;
  o.work_dir = work_dir;
  return o;
}

std::map<std::string, at::Tensor> file_tensors(const std::string& path) {
  auto file = SafetensorsFile::open(path);
  REQUIRE(file.ok());
  std::map<std::string, at::Tensor> out;
  for (const TensorInfo& info : file->tensors()) {
    auto t = load_float_tensor(*file, info.name);
    REQUIRE(t.ok());
    out[info.name] = *t;
  }
  return out;
}

}  // namespace

TEST_CASE(
    "the training decoder and the engine decoder compute the same image from the same weights",
    "[train][codec]") {
  torch::manual_seed(3);
  const LearnedDecoderCodec random = LearnedDecoderCodec::random(small_config(), 3);
  TrainDecoder model(small_config());
  {
    // Rounded to fp16 so that the exported file holds exactly these weights; a grey output
    // bias so that the image is not clamped flat.
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters())
      p.copy_((torch::randn_like(p) * 0.1).to(torch::kHalf).to(torch::kFloat));
    model->conv_out->bias.fill_(0.5);
  }
  const torch::Tensor latent = torch::randn({2, 32, 3, 5});
  torch::Tensor expected;
  {
    torch::NoGradGuard no_grad;
    expected = model->forward(latent).clamp(0, 1);
  }
  REQUIRE(expected.std().item<double>() > 0.01);
  auto codec = to_engine_codec(model, random.pca(), 1.0, 0.0);
  REQUIRE(codec.ok());
  CHECK((codec->decode(latent) - expected).abs().max().item<double>() < 1e-4);

  test::TempDir dir("infill-train-codec");
  REQUIRE(export_codec(model, random.pca(), 0.5, 0.0, dir.file("codec.safetensors")).ok());
  auto loaded = LearnedDecoderCodec::load(dir.file("codec.safetensors"));
  REQUIRE(loaded.ok());
  CHECK(loaded->scale() == 0.5);
  CHECK((loaded->decode(latent) - expected).abs().max().item<double>() < 1e-4);
}

TEST_CASE("30 steps of decoder training lower the loss and report held-out numbers",
          "[train][codec]") {
  const Dataset data = synthetic_dataset();
  const PatchPcaCodec pca = fitted_pca(data);
  test::TempDir dir("infill-train-codec");
  auto result = train_codec(pca, data, quick_options(dir.path()), dir.file("codec.safetensors"),
                            [](const std::string&) {});
  REQUIRE(result.ok());
  REQUIRE(result->run.curve.size() == 3);
  CHECK(result->run.curve.back().loss < 0.8 * result->run.curve.front().loss);
  CHECK(result->run.held_out_curve.size() == 1);
  CHECK(result->latent_scale > 0);
  CHECK(result->held_out_psnr > 5.0);       // 30 steps only: far from the PCA yet
  CHECK(result->held_out_pca_psnr > 20.0);  // smooth images: 8 components keep them
  CHECK(std::isfinite(result->blockiness8));
  CHECK(result->pca_blockiness8 > 1.0);  // noisy latents through the patch decode show blocks
  auto codec = LearnedDecoderCodec::load(dir.file("codec.safetensors"));
  REQUIRE(codec.ok());
  CHECK(codec->scale() == result->latent_scale);

  CodecTrainOptions bad = quick_options(dir.path());
  bad.crop = 40;
  auto refused =
      train_codec(pca, data, bad, dir.file("other.safetensors"), [](const std::string&) {});
  CHECK(refused.status().code() == ErrorCode::kInvalidArgument);
  CHECK_THAT(refused.status().message(), Catch::Contains("crop 40"));
}

TEST_CASE("a decoder training resumed from a checkpoint ends with the uninterrupted run's weights",
          "[train][codec]") {
  const Dataset data = synthetic_dataset();
  const PatchPcaCodec pca = fitted_pca(data);
  test::TempDir whole("infill-train-codec"), resumed("infill-train-codec");
  CodecTrainOptions options = quick_options(whole.path());
  options.steps = 6;
  options.checkpoint_every = 2;
  // The uninterrupted run; its first checkpoint is copied away as an interrupted run's would be.
  bool copied = false;
  auto snapshot = [&](const std::string&) {
    const fs::path ckpt = fs::path(whole.path()) / "checkpoint";
    if (!copied && fs::exists(ckpt / "state.json")) {
      fs::copy(ckpt, fs::path(resumed.path()) / "checkpoint", fs::copy_options::recursive);
      copied = true;
    }
  };
  REQUIRE(train_codec(pca, data, options, whole.file("codec.safetensors"), snapshot).ok());
  REQUIRE(copied);

  options.work_dir = resumed.path();
  std::vector<std::string> lines;
  auto result = train_codec(pca, data, options, resumed.file("codec.safetensors"),
                            [&](const std::string& line) { lines.push_back(line); });
  REQUIRE(result.ok());
  REQUIRE_FALSE(lines.empty());
  CHECK_THAT(lines.front(), Catch::Contains("resuming from step"));
  CHECK_THAT(lines.front(), !Catch::Contains("step 6"));
  const auto a = file_tensors(whole.file("codec.safetensors"));
  const auto b = file_tensors(resumed.file("codec.safetensors"));
  REQUIRE(a.size() == b.size());
  for (const auto& [name, t] : a) {
    INFO(name);
    CHECK(at::equal(t, b.at(name)));
  }
}

TEST_CASE("blockiness: about 1 for smooth images, above 1 when 8x8 blocks show",
          "[train][metrics]") {
  c10::InferenceMode guard;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(31);
  // Waves whose periods are not multiples of the grid.
  const at::Tensor ramp = at::arange(128, at::kFloat).view({1, 1, 128});
  const at::Tensor phase = at::rand({3, 1, 1}, gen) * 6.28;
  const at::Tensor smooth = 0.5 + 0.2 * at::sin(ramp * (6.28 / 37) + phase) +
                            0.2 * at::cos(ramp.view({1, 128, 1}) * (6.28 / 53) + phase);
  CHECK(blockiness(smooth, 8) == Approx(1.0).margin(0.1));
  CHECK(blockiness(smooth, 16) == Approx(1.0).margin(0.1));
  // Each 8x8 block shifted by its own constant: edges only on the 8-pixel grid.
  const at::Tensor offsets =
      at::upsample_nearest2d((at::rand({1, 3, 16, 16}, gen) - 0.5).mul(0.2), {128, 128})[0];
  const at::Tensor blocky = smooth + offsets;
  CHECK(blockiness(blocky, 8) > 3.0);
  // On the 16 grid half of the 8-grid edges count as inside, but the 16-edges still stand out.
  CHECK(blockiness(blocky, 16) > 1.5);
  CHECK(blockiness(at::full({3, 32, 32}, 0.5), 8) == Approx(1.0));
  // Noise has no grid.
  CHECK(blockiness(at::rand({3, 128, 128}, gen), 8) == Approx(1.0).margin(0.05));
}
