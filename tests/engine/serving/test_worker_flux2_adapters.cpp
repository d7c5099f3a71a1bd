// LoRAs through the serving path: an edit's adapter set and strengths are part of the keys of
// the cache entries it reads and the prepare runs that make them, so an edit under one set never
// reads another set's entry (each case poisons the other set's entry and checks the result).
#include "support/catch.h"
#include "support/temp_dir.h"
#include "support/tiny_flux2.h"

#include <algorithm>
#include <future>
#include <limits>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/InferenceMode.h>

#include "model/lora_adapter.h"
#include "model/safetensors_torch.h"
#include "pipeline/flux2_edit_model.h"
#include "serving/serving_runtime.h"
#include "flux2_serving_fixture.h"
#include "serving_fixture.h"

using namespace infill;
using namespace infill::test;

namespace {

// A random LoRA of rank 4 on every linear layer of `config`, read back for it.
std::shared_ptr<const LoraAdapter> random_lora(const std::string& path, const Flux2Config& config, uint64_t seed) {
  write_random_lora(path, config, seed);
  auto lora = load_lora(path, config, "flux2-test");
  REQUIRE(lora.ok());
  return *lora;
}

// An entry of `layout` whose every K and V is the largest fp16 value: any edit that reads it
// comes out far from its own result.
std::shared_ptr<const ActivationEntry> poisoned(const ActivationLayout& layout) {
  auto entry = std::make_shared<ActivationEntry>(layout);
  std::fill(entry->data(), entry->data() + layout.total_elements(), uint16_t{0x7BFF});
  return entry;
}

// The edit through the pipeline's own pieces, on an entry its own prepare run makes now.
PixelImage alone(const Flux2Serving& f, const EditParams& p) {
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

}  // namespace

TEST_CASE("Worker FLUX.2 with LoRAs: an edit under one adapter set never reads another set's entry",
          "[flux2-serving][lora]") {
  Flux2Serving f;
  const Flux2Config& cfg = f.model->parts().transformer->config();
  const auto a = random_lora(f.dir.file("a.safetensors"), cfg, 1);
  const auto b = random_lora(f.dir.file("b.safetensors"), cfg, 2);
  auto rt = f.runtime();

  EditParams with_a = f.params("make the cup red", 7);
  with_a.adapters = {{a, 1.0}};
  const RequestResult first = submit(*rt, 1, f.tmpl, with_a).get();
  REQUIRE(first.state == RequestState::kDone);
  CHECK(first.output.cache_mode == "template_keyed");
  const ActivationKey key_a = f.model->cache_key(*f.tmpl, with_a);
  REQUIRE(f.store->contains(key_a));
  CHECK((first.output.image.data == alone(f, with_a).data));

  // A's entry is poisoned; edits under other sets (another adapter, another strength, two
  // stacked in either order, none) must come out as their own entries make them.
  auto entry_a = f.store->get(key_a);
  REQUIRE(entry_a.ok());
  REQUIRE(f.store->put(key_a, poisoned((*entry_a)->layout())).ok());
  std::vector<AdapterSet> others = {{{b, 1.0}}, {{a, 0.5}}, {{a, 1.0}, {b, -0.7}}, {{b, -0.7}, {a, 1.0}}, {}};
  uint64_t id = 2;
  std::vector<std::string> keys{key_a.canonical()};
  for (const AdapterSet& set : others) {
    EditParams p = f.params("make the cup red", 7);
    p.adapters = set;
    const ActivationKey key = f.model->cache_key(*f.tmpl, p);
    keys.push_back(key.canonical());
    const RequestResult r = submit(*rt, id++, f.tmpl, p).get();
    INFO("set " << adapter_set_key(set));
    REQUIRE(r.state == RequestState::kDone);
    CHECK(r.output.cache_mode == "template_keyed");
    CHECK(f.store->contains(key));
    CHECK((r.output.image.data == alone(f, p).data));
  }
  std::sort(keys.begin(), keys.end());
  CHECK(std::unique(keys.begin(), keys.end()) == keys.end());
  // The prompt-keyed key of the live cache mode carries the set too.
  EditParams pa = f.params("make the cup red", 7), pb = pa;
  pa.adapters = {{a, 1.0}};
  CHECK(f.model->prompt_cache_key(*f.tmpl, pa)->canonical() != f.model->prompt_cache_key(*f.tmpl, pb)->canonical());

  // The poison is real: the edit under A itself now reads it and comes out otherwise.
  const RequestResult poisoned_a = submit(*rt, id++, f.tmpl, with_a).get();
  REQUIRE(poisoned_a.state == RequestState::kDone);
  CHECK((poisoned_a.output.image.data != first.output.image.data));
}

TEST_CASE("Worker FLUX.2 with LoRAs: requests with different sets share packed steps and each equals its own run",
          "[flux2-serving][lora]") {
  Flux2Serving f;
  const Flux2Config& cfg = f.model->parts().transformer->config();
  const auto a = random_lora(f.dir.file("a.safetensors"), cfg, 3);
  const auto b = random_lora(f.dir.file("b.safetensors"), cfg, 4);
  // Every request steps only once all three are ready, so the three share each step.
  RuntimeOptions o;
  o.worker.may_step = step_when_ready(3);
  auto created = ServingRuntime::create(f.model, f.store, test::fixed_cost_model(), std::move(o));
  REQUIRE(created.ok());
  auto& rt = *created;
  std::vector<AdapterSet> sets = {{}, {{a, 0.8}}, {{a, -0.3}, {b, 1.2}}};
  std::vector<std::future<RequestResult>> futures;
  for (size_t i = 0; i < sets.size(); ++i) {
    EditParams p = f.params("a dark blue patch", 11 + i);
    p.adapters = sets[i];
    futures.push_back(submit(*rt, i + 1, f.tmpl, p));
  }
  std::vector<RequestResult> results;
  for (auto& fu : futures) results.push_back(fu.get());
  for (size_t i = 0; i < sets.size(); ++i) {
    INFO("set " << i << ": " << results[i].status.to_string());
    REQUIRE(results[i].state == RequestState::kDone);
    EditParams p = f.params("a dark blue patch", 11 + i);
    p.adapters = sets[i];
    // Packed with the others, float32 on the CPU: the same pixels up to GEMM blocking.
    const at::Tensor ours = to_rgb_tensor(results[i].output.image), own = to_rgb_tensor(alone(f, p));
    CHECK((ours - own).abs().max().item<double>() <= 2.0 / 255.0);
  }
  const auto workers = rt->worker_metrics();
  REQUIRE(workers.size() == 1);
  CHECK(workers[0].max_batch >= 3);
}
