// The bundled infill-tiny model (resources/models/infill-tiny) through the engine: it loads,
// keeps unmasked pixels, follows a colour prompt with guidance, and rejects unknown words.

#include "support/catch.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "model/model.h"
#include "model/prompt_encoder.h"
#include "pipeline/edit_pipeline.h"
#include "pipeline/image_io.h"
#include "pipeline/mask.h"

using namespace infill;

namespace {

const std::string kModel = INFILL_SOURCE_DIR "/resources/models/infill-tiny";
const std::string kTemplate = INFILL_SOURCE_DIR "/resources/templates/sample.png";
const std::string kMask = INFILL_SOURCE_DIR "/resources/templates/sample_mask.png";

}  // namespace

TEST_CASE("infill-tiny loads with its patch PCA codec and prompt vocabulary", "[pipeline][bundled]") {
  auto model = load_model(kModel);
  REQUIRE(model.ok());
  const ModelManifest& m = (*model)->manifest;
  CHECK(m.autoencoder.type == "patch_pca");
  CHECK(m.dit.prompt_scope == PromptScope::kMaskedTokens);
  CHECK(m.prompt.vocabulary.size() == 14);
  auto bad = encode_prompt(m, "teal");
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("red, orange, yellow"));
}

TEST_CASE("infill-tiny edits the sample template only inside the mask", "[pipeline][bundled]") {
  c10::InferenceMode guard;
  auto model = load_model(kModel);
  REQUIRE(model.ok());
  auto tmpl = load_template(**model, kTemplate);
  REQUIRE(tmpl.ok());
  auto mask = load_mask(kMask, (*tmpl)->width, (*tmpl)->height);
  REQUIRE(mask.ok());
  EditPipeline pipeline(*model, nullptr);
  EditParams params;
  params.mask = *mask;
  params.seed = 3;
  params.schedule.steps = 8;
  auto prompt = encode_prompt((*model)->manifest, "red");
  REQUIRE(prompt.ok());
  params.prompt = *prompt;
  params.guidance_scale = (*model)->manifest.default_guidance;
  auto out = pipeline.edit(*tmpl, params);
  REQUIRE(out.ok());
  const at::Tensor before = to_rgb_tensor((*tmpl)->pixels), after = to_rgb_tensor(out->image);
  const at::Tensor keep = (*mask == 0).unsqueeze(0).expand_as(before);
  CHECK(at::equal(before.masked_select(keep), after.masked_select(keep)));
  const at::Tensor inside = (*mask > 0.99).unsqueeze(0).expand_as(before);
  CHECK((before.masked_select(inside) - after.masked_select(inside)).abs().mean().item<double>() > 0.02);
}
