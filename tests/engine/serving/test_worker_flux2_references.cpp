// Reference images through the serving path: an edit's references are part of the keys of the
// entries it reads and of the prepare runs that make them (each case poisons the entry of
// other references and checks the result), and edits with and without references share packed
// steps, each equal to its own run.
#include "support/catch.h"
#include "support/random_image.h"
#include "support/tiny_flux2.h"

#include <algorithm>
#include <future>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "pipeline/flux2_edit_model.h"
#include "serving/serving_runtime.h"
#include "flux2_serving_fixture.h"
#include "serving_fixture.h"

using namespace infill;
using namespace infill::test;

namespace {

ReferenceImage reference(const Flux2Serving& f, uint64_t seed, const std::string& id) {
  const auto& codec = *f.model->parts().codec;
  // References are at least 64 pixels a side.
  auto t = template_from_pixels(codec, codec.factor(), 0.0, 1.0, test::random_image(64, 80, 3, PixelFormat::kU8, seed), id);
  REQUIRE(t.ok());
  auto r = f.model->make_reference(**t);
  REQUIRE(r.ok());
  return *r;
}



}  // namespace

TEST_CASE("Worker FLUX.2 with reference images: an edit never reads the entry of other references",
          "[flux2-serving][references]") {
  Flux2Serving f;
  // Two references of the same size: their entries have the same layout, only the key differs.
  const ReferenceImage a = reference(f, 21, "ref-a"), b = reference(f, 22, "ref-b");
  REQUIRE(a.latent.sizes() == b.latent.sizes());
  auto rt = f.runtime();

  EditParams with_a = f.params("make the cup red", 7);
  with_a.references = {a};
  const RequestResult first = submit(*rt, 1, f.tmpl, with_a).get();
  REQUIRE(first.state == RequestState::kDone);
  CHECK(first.output.cache_mode == "template_keyed");
  const ActivationKey key_a = f.model->cache_key(*f.tmpl, with_a);
  CHECK(key_a.references == "ref-a");
  REQUIRE(f.store->contains(key_a));
  CHECK((first.output.image.data == run_alone(f, with_a).data));

  auto entry_a = f.store->get(key_a);
  REQUIRE(entry_a.ok());
  REQUIRE(f.store->put(key_a, poisoned_entry((*entry_a)->layout())).ok());
  const std::vector<std::vector<ReferenceImage>> others = {{b}, {a, b}, {b, a}, {}};
  std::vector<std::string> keys{key_a.canonical()};
  uint64_t id = 2;
  for (const auto& refs : others) {
    EditParams p = f.params("make the cup red", 7);
    p.references = refs;
    const ActivationKey key = f.model->cache_key(*f.tmpl, p);
    keys.push_back(key.canonical());
    const RequestResult r = submit(*rt, id++, f.tmpl, p).get();
    INFO("references: " << key.references);
    REQUIRE(r.state == RequestState::kDone);
    CHECK(f.store->contains(key));
    CHECK((r.output.image.data == run_alone(f, p).data));
  }
  std::sort(keys.begin(), keys.end());
  CHECK(std::unique(keys.begin(), keys.end()) == keys.end());
  EditParams pa = f.params("make the cup red", 7), pb = pa;
  pa.references = {a};
  CHECK(f.model->prompt_cache_key(*f.tmpl, pa)->canonical() != f.model->prompt_cache_key(*f.tmpl, pb)->canonical());
  // The poison is real: the edit with A reads it and comes out otherwise.
  const RequestResult poisoned_a = submit(*rt, id++, f.tmpl, with_a).get();
  REQUIRE(poisoned_a.state == RequestState::kDone);
  CHECK((poisoned_a.output.image.data != first.output.image.data));
}

TEST_CASE("Worker FLUX.2 with reference images: edits with and without references share packed steps",
          "[flux2-serving][references]") {
  Flux2Serving f;
  const ReferenceImage a = reference(f, 23, "ref-a"), b = reference(f, 24, "ref-b");
  RuntimeOptions o;
  o.worker.may_step = step_when_ready(3);
  auto created = ServingRuntime::create(f.model, f.store, test::fixed_cost_model(), std::move(o));
  REQUIRE(created.ok());
  auto& rt = *created;
  const std::vector<std::vector<ReferenceImage>> sets = {{}, {a}, {b, a}};
  std::vector<std::future<RequestResult>> futures;
  for (size_t i = 0; i < sets.size(); ++i) {
    EditParams p = f.params("a dark blue patch", 11 + i);
    p.references = sets[i];
    futures.push_back(submit(*rt, i + 1, f.tmpl, p));
  }
  for (size_t i = 0; i < sets.size(); ++i) {
    const RequestResult r = futures[i].get();
    INFO("edit " << i << ": " << r.status.to_string());
    REQUIRE(r.state == RequestState::kDone);
    EditParams p = f.params("a dark blue patch", 11 + i);
    p.references = sets[i];
    const at::Tensor ours = to_rgb_tensor(r.output.image), own = to_rgb_tensor(run_alone(f, p));
    CHECK((ours - own).abs().max().item<double>() <= 2.0 / 255.0);
  }
  const auto workers = rt->worker_metrics();
  REQUIRE(workers.size() == 1);
  CHECK(workers[0].max_batch >= 3);
}
