#pragma once
// FLUX.2 through the worker: a small random transformer (on the CPU or a CUDA device), a codec
// of FLUX.2's latent shape, Qwen3's real tokenizer with a small random Qwen3, one template.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "pipeline/flux2_edit_model.h"
#include "pipeline/template_image.h"
#include "serving/serving_runtime.h"
#include "serving_fixture.h"
#include "support/catch.h"
#include "support/temp_dir.h"
#include "support/tiny_flux2.h"

namespace infill::test {

struct Flux2Serving {
  c10::InferenceMode guard;
  test::TempDir dir{"infill-flux2-serving"};
  std::shared_ptr<const Flux2EditModel> model;
  std::shared_ptr<const TemplateImage> tmpl;
  std::shared_ptr<ActivationStore> store = test::ServingFixture::new_store();

  /// `device`: where the transformer computes (its weights move there in `dtype`); `adjust`
  /// may change the parts before the model is made (a device tier's budget, a bus speed).
  explicit Flux2Serving(const ComputeDevice& device = {}, at::ScalarType dtype = at::kBFloat16,
                        const std::function<void(Flux2EditModelParts&)>& adjust = {}) {
    test::export_qwen3_tokenizer_or_skip(dir.file("tokenizer"));
    REQUIRE(Qwen3Encoder::random(test::tiny_qwen3_config(), 3, at::kBFloat16)->save(dir.file("text_encoder")).ok());
    Qwen3PromptEncoder::Options text_options;
    text_options.max_length = 32;
    text_options.layers = {1, 2, 3};
    auto text = Qwen3PromptEncoder::load(dir.file("tokenizer"), dir.file("text_encoder"),
                                         std::make_shared<PromptEmbeddingCache>(int64_t{16} << 20), text_options);
    REQUIRE(text.ok());
    Flux2EditModelParts parts;
    parts.name = "flux2-test";
    Flux2Transformer transformer = Flux2Transformer::random(test::tiny_flux2_config(96), 5, at::kBFloat16);
    if (device.cuda) REQUIRE(transformer.to_device(device, dtype).ok());
    parts.transformer = std::make_shared<const Flux2Transformer>(std::move(transformer));
    parts.codec = test::flux2_patch_codec();
    parts.text = std::shared_ptr<Qwen3PromptEncoder>(std::move(*text));
    parts.default_steps = 3;
    if (adjust) adjust(parts);
    auto created = Flux2EditModel::create(std::move(parts));
    REQUIRE(created.ok());
    model = *created;
    // From pixels: builds without OpenImageIO (scripts/gpu_check.sh) run this fixture too.
    const auto& codec = *model->parts().codec;
    auto t = template_from_pixels(codec, codec.factor(), 0.0, 1.0, test::serving_picture(11), "picture");
    REQUIRE(t.ok());
    tmpl = *t;
  }

  EditParams params(const std::string& prompt, uint64_t seed) const {
    EditParams p;
    p.mask = test::ServingFixture::rect_mask(16, 16, 32, 16);
    p.prompt_text = prompt;
    p.seed = seed;
    return p;
  }

  std::unique_ptr<ServingRuntime> runtime() const {
    RuntimeOptions o;
    auto rt = ServingRuntime::create(model, store, test::fixed_cost_model(), std::move(o));
    REQUIRE(rt.ok());
    return std::move(*rt);
  }

  /// The edit on the RAM-resident template-keyed `entry` with its first `recompute_blocks`
  /// blocks recomputed (a fixed load plan), run on the calling thread (no worker).
  Result<EditOutput> edit_forced(const EditParams& params, std::shared_ptr<const ActivationEntry> entry,
                                 int recompute_blocks) const {
    auto session = model->create_session_recomputing(tmpl, params, std::move(entry), recompute_blocks);
    if (!session.ok()) return session.status();
    StepSession* s = session->get();
    while (!s->done()) {
      const at::Tensor prediction = model->forward(std::span<StepSession* const>(&s, 1));
      INFILL_RETURN_IF_ERROR(s->apply(prediction, s->step() + 1));
    }
    return s->finish();
  }
};

/// An entry of `layout` whose every K and V is the largest fp16 value: any edit that reads it
/// comes out far from its own result (the poison of the cache-key tests).
inline std::shared_ptr<const ActivationEntry> poisoned_entry(const ActivationLayout& layout) {
  auto entry = std::make_shared<ActivationEntry>(layout);
  std::fill(entry->data(), entry->data() + layout.total_elements(), uint16_t{0x7BFF});
  return entry;
}

/// The edit through the pipeline's own pieces, on an entry its own prepare run makes now: what
/// a served edit of `p` must equal whatever else shared its steps.
inline PixelImage run_alone(const Flux2Serving& f, const EditParams& p) {
  auto prepare = f.model->create_prepare(f.tmpl, p);
  REQUIRE(prepare.ok());
  while (!(*prepare)->done()) (*prepare)->run_step();
  auto session = f.model->create_session(f.tmpl, p, (*prepare)->entry(), nullptr);
  REQUIRE(session.ok());
  while (!(*session)->done()) {
    StepSession* one = session->get();
    const at::Tensor rows = f.model->forward(std::span<StepSession* const>(&one, 1));
    REQUIRE((*session)->apply(rows, (*session)->step() + 1).ok());
  }
  auto out = (*session)->finish();
  REQUIRE(out.ok());
  return out->image;
}

/// `deadline_ms`: relative to the submission; the class's default when absent.
inline std::future<RequestResult> submit(ServingRuntime& rt, uint64_t id, std::shared_ptr<const TemplateImage> tmpl, EditParams params,
                                  RequestClass cls = RequestClass::kInteractive,
                                  std::optional<double> deadline_ms = std::nullopt) {
  auto done = std::make_shared<std::promise<RequestResult>>();
  ServingRequest r;
  r.id = id;
  r.cls = cls;
  r.deadline_ms = deadline_ms;
  r.tmpl = std::move(tmpl);
  r.params = std::move(params);
  r.on_complete = [done](const RequestResult& result) { done->set_value(result); };
  r.encode_result = false;  // the tests compare pixels; builds without OpenImageIO encode none
  REQUIRE(rt.submit(std::move(r)).ok());
  return done->get_future();
}


}  // namespace infill::test
