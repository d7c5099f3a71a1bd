// FLUX.2 through the shipped serving path: the worker's step loop drives a Flux2EditModel
// (small random transformer, a codec of FLUX.2's latent shape, Qwen3's real tokenizer with a
// small random Qwen3), free-text prompts encoded on the pool, the template-keyed prepare run
// sliced on the loop, and the results equal to the pipeline's own session on the same entry.
#include "support/catch.h"
#include "support/temp_dir.h"
#include "support/tiny_flux2.h"

#include <chrono>
#include <future>
#include <thread>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "pipeline/flux2_edit_model.h"
#include "pipeline/flux2_edit_session.h"
#include "pipeline/flux2_prepare_run.h"
#include "serving/serving_runtime.h"
#include "flux2_serving_fixture.h"
#include "serving_fixture.h"

using namespace infill;
using namespace infill::test;

TEST_CASE("Worker runs FLUX.2 edits from free-text prompts, template-keyed, equal to the pipeline's session",
          "[flux2-serving]") {
  Flux2Serving f;
  auto rt = f.runtime();
  auto a = submit(*rt, 1, f.tmpl, f.params("make the cup red", 7));
  auto b = submit(*rt, 2, f.tmpl, f.params("a dark blue patch", 8));
  const RequestResult ra = a.get(), rb = b.get();
  INFO(ra.status.to_string());
  REQUIRE(ra.state == RequestState::kDone);
  REQUIRE(rb.state == RequestState::kDone);
  CHECK(ra.output.cache_mode == "template_keyed");
  CHECK(ra.output.steps_run == 3);
  CHECK_FALSE(ra.output.prompt_truncated);
  // One prepare for both requests of the template (3 steps), sliced on the loop.
  const auto workers = rt->worker_metrics();
  REQUIRE(workers.size() == 1);
  CHECK(workers[0].prepare_steps == 3);
  CHECK((ra.output.image.data != rb.output.image.data));

  // The same edit through the pipeline's own pieces, on the entry the worker stored.
  const EditParams p = f.params("make the cup red", 7);
  auto entry = f.store->get(f.model->cache_key(*f.tmpl, p));
  REQUIRE(entry.ok());
  auto session = f.model->create_session(f.tmpl, p, *entry, nullptr);
  REQUIRE(session.ok());
  while (!(*session)->done()) {
    StepSession* one = session->get();
    const at::Tensor rows = f.model->forward(std::span<StepSession* const>(&one, 1));
    REQUIRE((*session)->apply(rows, (*session)->step() + 1).ok());
  }
  auto alone = (*session)->finish();
  REQUIRE(alone.ok());
  CHECK((alone->image.data == ra.output.image.data));
}

TEST_CASE("Worker FLUX.2: guidance on a base model, cache off, long prompts and vector prompts", "[flux2-serving]") {
  Flux2Serving f;
  auto rt = f.runtime();
  EditParams guided = f.params("make the cup red", 3);
  guided.guidance_scale = 4.0;
  EditParams uncached = f.params("make the cup red", 3);
  uncached.cache = CacheMode::kOff;
  std::string words;
  for (int i = 0; i < 40; ++i) words += "red ";
  EditParams long_prompt = f.params(words, 3);
  EditParams vector_prompt = f.params("", 3);
  vector_prompt.prompt = at::ones({4});
  auto rg = submit(*rt, 1, f.tmpl, guided);
  auto ru = submit(*rt, 2, f.tmpl, uncached);
  auto rl = submit(*rt, 3, f.tmpl, long_prompt);
  auto rv = submit(*rt, 4, f.tmpl, vector_prompt);
  const RequestResult g = rg.get(), u = ru.get(), l = rl.get(), v = rv.get();
  REQUIRE(g.state == RequestState::kDone);
  CHECK(g.output.cache_mode == "template_keyed");
  REQUIRE(u.state == RequestState::kDone);
  CHECK(u.output.cache_mode == "off");
  CHECK_FALSE(u.output.used_cache);
  REQUIRE(l.state == RequestState::kDone);
  CHECK(l.output.prompt_truncated);  // 40 words and the template's tokens do not fit in 32
  CHECK(v.state == RequestState::kFailed);
  CHECK_THAT(v.status.to_string(), Catch::Contains("prompt_text"));
}

TEST_CASE("Worker FLUX.2 live painting: the first stroke runs template-keyed while a prompt-keyed prepare runs behind it",
          "[flux2-serving]") {
  Flux2Serving f;
  auto rt = f.runtime();
  const RequestResult first = submit(*rt, 1, f.tmpl, f.params("make the cup red", 7), RequestClass::kLive).get();
  REQUIRE(first.state == RequestState::kDone);
  CHECK(first.output.cache_mode == "template_keyed");
  // The background prepare ends by storing the prompt-keyed entry: wait for that event.
  const ActivationKey key = *f.model->prompt_cache_key(*f.tmpl, f.params("make the cup red", 0));
  CHECK(key.conditioning.rfind("prompt-", 0) == 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(2);
  while (!f.store->contains(key) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  REQUIRE(f.store->contains(key));
  // A later stroke with the same prompt reads it; another prompt falls back to template-keyed.
  // The stroke compared pixel for pixel below gets a deadline a busy machine cannot miss: a
  // live edit late for its 800 ms may run fewer steps than the pipeline's session does.
  const RequestResult second =
      submit(*rt, 2, f.tmpl, f.params("make the cup red", 8), RequestClass::kLive, 60000.0).get();
  const RequestResult other = submit(*rt, 3, f.tmpl, f.params("a dark blue patch", 8), RequestClass::kLive).get();
  REQUIRE(second.state == RequestState::kDone);
  CHECK(second.output.cache_mode == "prompt_keyed");
  REQUIRE(other.state == RequestState::kDone);
  CHECK(other.output.cache_mode == "template_keyed");
  // The prompt-keyed stroke is the pipeline's own edit on that entry.
  const EditParams p = f.params("make the cup red", 8);
  auto session = f.model->create_session(f.tmpl, p, f.store->get(f.model->cache_key(*f.tmpl, p)).value(), f.store->get(key).value());
  REQUIRE(session.ok());
  while (!(*session)->done()) {
    StepSession* one = session->get();
    REQUIRE((*session)->apply(f.model->forward(std::span<StepSession* const>(&one, 1)), (*session)->step() + 1).ok());
  }
  CHECK(((*session)->finish().value().image.data == second.output.image.data));
}
