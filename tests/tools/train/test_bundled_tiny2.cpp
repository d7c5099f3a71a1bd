// The bundled infill-tiny 2 (resources/models/infill-tiny-2), the folder infill-train made:
// the engine's default model; it loads through the one loader as the FLUX.2 family, takes
// phrasings it was never trained on, repaints the sample template's masked region in the asked
// colour and keeps every pixel outside the mask, in full recompute and from the cache.
#include "support/catch.h"
#include "support/edit_model_runs.h"
#include "support/file_bytes.h"

#include <filesystem>
#include <string>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "pipeline/bundled_models.h"
#include "pipeline/edit_model.h"
#include "pipeline/flux2_edit_model.h"
#include "pipeline/image_io.h"
#include "pipeline/load_edit_model.h"
#include "pipeline/mask.h"
#include "tools/train/colour_words.h"
#include "tools/train/image_metrics.h"
#include "tools/train/trainer.h"

using namespace infill;
namespace fs = std::filesystem;

namespace {

const fs::path kModel = fs::path(INFILL_SOURCE_DIR) / "resources/models/infill-tiny-2";
const std::string kTemplate = INFILL_SOURCE_DIR "/resources/templates/sample.png";
const std::string kMask = INFILL_SOURCE_DIR "/resources/templates/sample_mask.png";

}  // namespace

TEST_CASE("infill-tiny 2 is the default bundled model: a FLUX.2 folder with a model card", "[train][bundled][tiny2]") {
  const std::vector<std::string> bundled = bundled_model_dirs(INFILL_SOURCE_DIR);
  REQUIRE(bundled.size() == 2);
  CHECK(fs::equivalent(bundled.front(), kModel));
  CHECK(fs::exists(kModel / "MODEL_CARD.md"));
  auto loaded = load_edit_model(kModel.string());
  REQUIRE(loaded.ok());
  const EditModel& model = *loaded->model;
  CHECK(model.info().family == "flux2");
  CHECK(model.info().free_text);
  CHECK(model.info().id.rfind("infill-tiny-2-", 0) == 0);
  const auto& flux2 = static_cast<const Flux2EditModel&>(model);
  const auto& cfg = flux2.parts().transformer->config();
  CHECK(cfg.double_blocks > 0);
  CHECK(cfg.single_blocks > 0);
  // The bundled model's text stays short (the bound: 64 rows).
  auto rows = flux2.parts().text->encode("could you make it dark blue?");
  REQUIRE(rows.ok());
  CHECK((*rows)->rows.size(0) <= 64);
}

TEST_CASE("infill-tiny 2 repaints the sample's mask in the asked colour from held-out phrasings", "[train][bundled][tiny2]") {
  auto loaded = load_edit_model(kModel.string());
  REQUIRE(loaded.ok());
  const EditModel& model = *loaded->model;
  const std::vector<std::byte> bytes = test::file_bytes(kTemplate);
  REQUIRE_FALSE(bytes.empty());
  auto tmpl = model.make_template(bytes, kTemplate);
  REQUIRE(tmpl.ok());
  auto mask = load_mask(kMask, (*tmpl)->width, (*tmpl)->height);
  REQUIRE(mask.ok());
  const at::Tensor before = to_rgb_tensor((*tmpl)->pixels);
  const at::Tensor outside = (*mask == 0).unsqueeze(0).expand_as(before);

  c10::InferenceMode guard;
  // Phrasings of the held-out frames (tools/train/captions.cpp): never seen in training.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"could you make it red?", "red"}, {"the hole should be blue", "blue"}, {"just yellow!", "yellow"}};
  for (const auto& [prompt, colour] : cases) {
    INFO(prompt);
    EditParams params;
    params.mask = *mask;
    REQUIRE(model.set_prompt(params, prompt).ok());
    params.guidance_scale = model.info().default_guidance;
    params.seed = 1;
    auto prepare = model.create_prepare(*tmpl, params);
    REQUIRE(prepare.ok());
    const auto entry = test::prepare_to_end(std::move(*prepare));
    at::Tensor full;
    for (const bool cached : {false, true}) {
      INFO((cached ? "template-keyed cache" : "full recompute"));
      EditParams p = params;
      p.cache = cached ? CacheMode::kUse : CacheMode::kOff;
      auto out = test::edit_to_end(model, *tmpl, p, cached ? entry : nullptr, nullptr);
      REQUIRE(out.ok());
      const at::Tensor after = to_rgb_tensor(out->image);
      CHECK(at::equal(before.masked_select(outside), after.masked_select(outside)));
      const auto mean = train::masked_mean_colour(after, *mask);
      INFO("mean colour " << mean[0] << " " << mean[1] << " " << mean[2]);
      CHECK(train::vocabulary()[train::nearest_colour_word({mean[0], mean[1], mean[2]})] == colour);
      if (!cached) full = after;
      else CHECK(train::ssim(after, full) >= 0.97);
    }
  }
}
