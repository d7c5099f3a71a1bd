#pragma once
// A small random-weight model, a template and a store for the serving runtime tests.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <atomic>
#include <functional>
#include <memory>

#include "model/model.h"
#include "pipeline/edit_pipeline.h"
#include "pipeline/image_io.h"
#include "serving/cost_model.h"
#include "serving/serving_runtime.h"
#include "support/temp_dir.h"
#include "support/tiny_dit.h"

namespace infill::test {

inline DitConfig tiny_serving_dit() { return tiny_inpainting_dit(); }

inline PixelImage serving_picture(int shift) {
  PixelImage img = PixelImage::allocate(64, 48, 3, PixelFormat::kU8);
  auto* p = reinterpret_cast<uint8_t*>(img.data.data());
  for (int y = 0; y < img.height; ++y)
    for (int x = 0; x < img.width; ++x)
      for (int c = 0; c < 3; ++c) p[(y * img.width + x) * 3 + c] = static_cast<uint8_t>((x * 3 + y * 5 + c * 70 + shift) % 256);
  return img;
}

// A cost model with made-up but plausible coefficients: tests never depend on timing.
inline std::shared_ptr<const StepCostModel> fixed_cost_model() {
  return std::make_shared<const StepCostModel>(StepCostModel::plausible());
}

/// A WorkerOptions::may_step gate: no batched step until `n` requests are ready, then open for
/// good, so that the first step packs them all whatever order they arrive in.
inline std::function<bool(size_t)> step_when_ready(size_t n) {
  auto opened = std::make_shared<std::atomic<bool>>(false);
  return [opened, n](size_t ready) {
    if (ready == n) *opened = true;
    return opened->load();
  };
}

struct ServingFixture {
  c10::InferenceMode guard;
  TempDir dir{"infill-serving"};
  std::shared_ptr<const Model> model;
  std::vector<std::shared_ptr<const TemplateImage>> templates;
  std::shared_ptr<ActivationStore> store;
  std::shared_ptr<const StepCostModel> cost = fixed_cost_model();

  explicit ServingFixture(int n_templates = 2) {
    if (!write_random_model(dir.file("model"), tiny_serving_dit(), 16, 42).ok()) throw std::runtime_error("model");
    auto loaded = load_model(dir.file("model"));
    if (!loaded.ok()) throw std::runtime_error(loaded.status().to_string());
    model = *loaded;
    for (int i = 0; i < n_templates; ++i) {
      auto png = encode_png(serving_picture(i * 37));
      auto t = make_template(*model, *png, "picture" + std::to_string(i) + ".png");
      if (!t.ok()) throw std::runtime_error(t.status().to_string());
      templates.push_back(*t);
    }
    store = new_store();
  }

  static std::shared_ptr<ActivationStore> new_store() {
    ActivationStoreOptions options;
    options.ram_budget_bytes = 64 << 20;
    auto s = ActivationStore::open(options);
    if (!s.ok()) throw std::runtime_error(s.status().to_string());
    return std::shared_ptr<ActivationStore>(std::move(*s));
  }

  /// A store with a disk tier in `disk_dir` and `ram_bytes` of RAM (1: every entry goes
  /// straight to disk; opened again on the folder, it finds them there, as after a restart).
  static std::shared_ptr<ActivationStore> open_disk_store(const std::string& disk_dir, size_t ram_bytes) {
    ActivationStoreOptions options;
    options.ram_budget_bytes = ram_bytes;
    options.disk_dir = disk_dir;
    auto s = ActivationStore::open(options);
    if (!s.ok()) throw std::runtime_error(s.status().to_string());
    return std::shared_ptr<ActivationStore>(std::move(*s));
  }

  // A rectangle mask of the 64x48 template.
  static at::Tensor rect_mask(int x, int y, int w, int h) {
    at::Tensor m = at::zeros({48, 64});
    m.narrow(0, y, h).narrow(1, x, w).fill_(1.0);
    return m;
  }

  EditParams params(const at::Tensor& mask, uint64_t seed) const {
    EditParams p;
    p.mask = mask;
    p.seed = seed;
    p.schedule.steps = 4;
    return p;
  }
};

}  // namespace infill::test
