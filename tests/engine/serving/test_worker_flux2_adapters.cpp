// LoRAs through the serving path: an edit's adapter set and strengths are part of the keys of
// the cache entries it reads and the prepare runs that make them, so an edit under one set never
// reads another set's entry (each case poisons the other set's entry and checks the result).
#include "support/catch.h"
#include "support/temp_dir.h"
#include "support/tiny_flux2.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <limits>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/InferenceMode.h>

#include "model/lora_adapter.h"
#include "model/safetensors_torch.h"
#include "pipeline/adapter_load.h"
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
  CHECK((first.output.image.data == run_alone(f, with_a).data));

  // A's entry is poisoned; edits under other sets (another adapter, another strength, two
  // stacked in either order, none) must come out as their own entries make them.
  auto entry_a = f.store->get(key_a);
  REQUIRE(entry_a.ok());
  REQUIRE(f.store->put(key_a, poisoned_entry((*entry_a)->layout())).ok());
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
    CHECK((r.output.image.data == run_alone(f, p).data));
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
    const at::Tensor ours = to_rgb_tensor(results[i].output.image), own = to_rgb_tensor(run_alone(f, p));
    CHECK((ours - own).abs().max().item<double>() <= 2.0 / 255.0);
  }
  const auto workers = rt->worker_metrics();
  REQUIRE(workers.size() == 1);
  CHECK(workers[0].max_batch >= 3);
}

namespace {

std::vector<std::pair<std::string, double>> uses_of(const AdapterSet& set) {
  std::vector<std::pair<std::string, double>> uses;
  for (const AdapterUse& u : set) uses.emplace_back(u.adapter->id, u.strength);
  return uses;
}

}  // namespace

TEST_CASE("Worker FLUX.2 with LoRAs: adapters from step K leave the first K steps without them, keyed by K",
          "[flux2-serving][lora]") {
  Flux2Serving f;  // 3 steps
  const Flux2Config& cfg = f.model->parts().transformer->config();
  const auto a = random_lora(f.dir.file("a.safetensors"), cfg, 5);
  auto rt = f.runtime();
  const auto edit = [&](int from_step, bool adapters) {
    EditParams p = f.params("make the cup red", 9);
    if (adapters) p.adapters = {{a, 3.0}};
    p.adapters_from_step = from_step;
    return p;
  };
  uint64_t id = 1;
  const auto run = [&](const EditParams& p) {
    const RequestResult r = submit(*rt, id++, f.tmpl, p).get();
    INFO(r.status.to_string());
    REQUIRE(r.state == RequestState::kDone);
    return r;
  };
  const RequestResult k0 = run(edit(0, true)), k1 = run(edit(1, true)), k3 = run(edit(3, true)), plain = run(edit(0, false));
  // K = the whole schedule is the edit without adapters, computed on an entry of its own.
  CHECK((k3.output.image.data == plain.output.image.data));
  CHECK((k0.output.image.data != plain.output.image.data));
  CHECK((k1.output.image.data != k0.output.image.data));
  // Each equals its own run, and says its K.
  CHECK((k1.output.image.data == run_alone(f, edit(1, true)).data));
  CHECK(k1.output.adapters_from_step == 1);
  CHECK(k0.output.adapters_from_step == 0);
  CHECK(plain.output.adapters_from_step == 0);
  const std::string key0 = f.model->cache_key(*f.tmpl, edit(0, true)).canonical();
  const std::string key1 = f.model->cache_key(*f.tmpl, edit(1, true)).canonical();
  CHECK(key0 != key1);
  CHECK(f.model->cache_key(*f.tmpl, edit(1, false)).canonical() == f.model->cache_key(*f.tmpl, edit(0, false)).canonical());
  // A K beyond the schedule is refused before the edit is admitted.
  CHECK(!f.model->check_schedule(edit(4, true)).ok());
}

TEST_CASE("Worker FLUX.2 with LoRAs: an edit whose adapters are still being read runs its first K steps and holds up no other",
          "[flux2-serving][lora]") {
  Flux2Serving f;  // 3 steps
  const Flux2Config& cfg = f.model->parts().transformer->config();
  const AdapterSet set = {{random_lora(f.dir.file("a.safetensors"), cfg, 6), 3.0}};
  auto rt = f.runtime();

  // Without a cache entry (cache off), so that the edit's own steps are what waits.
  EditParams loading = f.params("make the cup red", 9);
  loading.cache = CacheMode::kOff;
  loading.adapters_from_step = 2;
  loading.adapter_load = std::make_shared<AdapterLoad>(uses_of(set));
  std::promise<void> reached_k;
  std::atomic<bool> finished_load{false}, stepped_past_k{false};
  auto done = std::make_shared<std::promise<RequestResult>>();
  auto result = done->get_future();
  ServingRequest r;
  r.id = 1;
  r.tmpl = f.tmpl;
  r.params = loading;
  r.encode_result = false;
  r.on_progress = [&, reported = std::make_shared<bool>(false)](const RequestProgress& p) {
    if (p.steps_done > 2 && !finished_load) stepped_past_k = true;
    if (p.steps_done >= 2 && !*reported) {
      *reported = true;
      reached_k.set_value();
    }
  };
  r.on_complete = [done](const RequestResult& res) { done->set_value(res); };
  REQUIRE(rt->submit(std::move(r)).ok());

  // Another edit, submitted after it, runs to its end while the adapters are not read.
  const RequestResult other = submit(*rt, 2, f.tmpl, f.params("a dark blue patch", 4)).get();
  REQUIRE(other.state == RequestState::kDone);
  REQUIRE(reached_k.get_future().wait_for(std::chrono::seconds(300)) == std::future_status::ready);
  CHECK(result.wait_for(std::chrono::seconds(0)) != std::future_status::ready);

  finished_load = true;
  loading.adapter_load->finish(set);
  const RequestResult ended = result.get();
  INFO(ended.status.to_string());
  REQUIRE(ended.state == RequestState::kDone);
  CHECK(!stepped_past_k);
  CHECK(ended.output.adapters_from_step == 2);
  // The same as the edit with its adapters in hand from the start.
  EditParams in_hand = loading;
  in_hand.adapter_load.reset();
  in_hand.adapters = set;
  const RequestResult sync = submit(*rt, 3, f.tmpl, in_hand).get();
  REQUIRE(sync.state == RequestState::kDone);
  CHECK((ended.output.image.data == sync.output.image.data));

  // With the cache: the prepare run under the set waits at step K too, and the edit comes out
  // as with the adapters in hand.
  EditParams cached = f.params("make the cup red", 10);
  cached.adapters_from_step = 1;
  cached.adapter_load = std::make_shared<AdapterLoad>(uses_of(set));
  auto pending = submit(*rt, 4, f.tmpl, cached);
  CHECK(submit(*rt, 5, f.tmpl, f.params("a dark blue patch", 5)).get().state == RequestState::kDone);
  CHECK(pending.wait_for(std::chrono::seconds(0)) != std::future_status::ready);
  cached.adapter_load->finish(set);
  const RequestResult cached_done = pending.get();
  REQUIRE(cached_done.state == RequestState::kDone);
  CHECK(cached_done.output.cache_mode == "template_keyed");
  EditParams cached_in_hand = cached;
  cached_in_hand.adapter_load.reset();
  cached_in_hand.adapters = set;
  CHECK((cached_done.output.image.data == run_alone(f, cached_in_hand).data));

  // A read that fails fails its edit with the reader's error, and nothing else.
  EditParams failing = f.params("make the cup red", 11);
  failing.adapter_load = std::make_shared<AdapterLoad>(uses_of(set));
  auto failed = submit(*rt, 6, f.tmpl, failing);
  failing.adapter_load->finish(Status(ErrorCode::kCorruptData, "adapter x.safetensors is truncated"));
  const RequestResult failed_result = failed.get();
  CHECK(failed_result.state == RequestState::kFailed);
  CHECK(failed_result.status.message() == "adapter x.safetensors is truncated");
  CHECK(submit(*rt, 7, f.tmpl, f.params("a dark blue patch", 6)).get().state == RequestState::kDone);
}
