// Edits through the worker with the step graphs on (model/flux2_graph_cache.h). On a GPU they
// replay CUDA graphs; here the CPU re-runs their pieces (Flux2EditModelParts::
// step_graphs_on_cpu), which checks the worker's path through them: packed rounds of
// several edits and modes, LoRAs, the graph per round shape, the counters, results equal to
// the eager engine's.
#include "support/catch.h"
#include "support/tiny_flux2.h"

#include <future>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "model/lora_adapter.h"
#include "pipeline/flux2_edit_model.h"
#include "serving/serving_runtime.h"
#include "flux2_serving_fixture.h"
#include "serving_fixture.h"

using namespace infill;
using namespace infill::test;

namespace {

// The fixture's model with its step graphs on (re-run pieces on the CPU).
void graphs_on(Flux2EditModelParts& parts) {
  parts.step_graphs_on_cpu = true;
  parts.step_graph_bytes = int64_t{2} << 30;
}

// Runs `edits` on `graphs` as one round (its worker steps only once all are ready) and checks
// each result against the same edit alone on `eager`, the same weights without graphs: the
// same pixels up to GEMM blocking (float32 on the CPU, the graph's rows padded to their
// buckets). Returns the worker's metrics.
WorkerMetrics run_one_round(const Flux2Serving& graphs, const Flux2Serving& eager, const std::vector<EditParams>& edits) {
  RuntimeOptions o;
  o.worker.may_step = step_when_ready(static_cast<int>(edits.size()));
  auto created = ServingRuntime::create(graphs.model, graphs.store, test::fixed_cost_model(), std::move(o));
  REQUIRE(created.ok());
  auto& rt = *created;
  std::vector<std::future<RequestResult>> futures;
  for (size_t i = 0; i < edits.size(); ++i) futures.push_back(submit(*rt, i + 1, graphs.tmpl, edits[i]));
  for (size_t i = 0; i < edits.size(); ++i) {
    const RequestResult r = futures[i].get();
    INFO("edit " << i << ": " << r.status.to_string());
    REQUIRE(r.state == RequestState::kDone);
    const at::Tensor ours = to_rgb_tensor(r.output.image), own = to_rgb_tensor(run_alone(eager, edits[i]));
    CHECK((ours - own).abs().max().item<double>() <= 2.0 / 255.0);
  }
  const auto workers = rt->worker_metrics();
  REQUIRE(workers.size() == 1);
  return workers[0];
}

}  // namespace

TEST_CASE("Worker FLUX.2 edits through the step graphs equal the eager engine's, packed, and the graphs are counted",
          "[flux2-serving][step-graph]") {
  Flux2Serving graphs({}, at::kBFloat16, graphs_on);
  Flux2Serving eager;
  std::vector<EditParams> edits = {graphs.params("a dark blue patch", 11), graphs.params("make the cup red", 12),
                                   graphs.params("a dark blue patch", 13)};
  edits[1].mask = ServingFixture::rect_mask(0, 16, 48, 32);  // more rows than the others
  const WorkerMetrics worker = run_one_round(graphs, eager, edits);
  CHECK(worker.max_batch >= 3);
  const auto it = worker.step_graphs_by_model.find(graphs.model->info().id);
  REQUIRE(it != worker.step_graphs_by_model.end());
  const StepGraphStats& stats = it->second;
  INFO("recorded " << stats.recorded << ", replayed " << stats.replayed << ", eager " << stats.eager_rounds);
  CHECK(stats.recorded >= 1);
  CHECK(stats.replayed >= 1);  // the later steps of a round shape replay its graph
  CHECK(stats.graphs >= 1);
  CHECK(stats.failed_recordings == 0);
  CHECK(stats.bytes <= stats.budget_bytes);
  // The engine without graphs reports none.
  auto plain = eager.runtime();
  CHECK(plain->worker_metrics()[0].step_graphs_by_model.empty());
}

TEST_CASE("Worker FLUX.2 edits with LoRAs replay through the step graphs and equal the eager engine's",
          "[flux2-serving][step-graph][lora]") {
  Flux2Serving graphs({}, at::kBFloat16, graphs_on);
  Flux2Serving eager;
  const Flux2Config& cfg = graphs.model->parts().transformer->config();
  auto lora = [&](const char* name, uint64_t seed) {
    write_random_lora(graphs.dir.file(name), cfg, seed);
    auto read = load_lora(graphs.dir.file(name), cfg, "flux2-test");
    REQUIRE(read.ok());
    return *read;
  };
  const auto a = lora("a.safetensors", 1), b = lora("b.safetensors", 2);
  // Three edits of one round: none, A, and A + B at other strengths.
  std::vector<EditParams> edits = {graphs.params("a dark blue patch", 21), graphs.params("make the cup red", 22),
                                   graphs.params("a dark blue patch", 23)};
  edits[1].adapters = {{a, 1.0}};
  edits[2].adapters = {{a, 0.5}, {b, -0.7}};
  const WorkerMetrics worker = run_one_round(graphs, eager, edits);
  const auto it = worker.step_graphs_by_model.find(graphs.model->info().id);
  REQUIRE(it != worker.step_graphs_by_model.end());
  INFO("recorded " << it->second.recorded << ", replayed " << it->second.replayed << ", eager " << it->second.eager_rounds);
  // The rounds with adapters went through graphs too: none ran eagerly.
  CHECK(it->second.recorded >= 1);
  CHECK(it->second.replayed >= 1);
  CHECK(it->second.eager_rounds == 0);
}

TEST_CASE("Worker FLUX.2: the step graphs of a LoRA let it go once nothing else holds it and edits go on through graphs",
          "[flux2-serving][step-graph][lora]") {
  Flux2Serving graphs({}, at::kBFloat16, graphs_on);
  const Flux2Config& cfg = graphs.model->parts().transformer->config();
  write_random_lora(graphs.dir.file("a.safetensors"), cfg, 3);
  std::shared_ptr<const LoraAdapter> a;
  {
    auto read = load_lora(graphs.dir.file("a.safetensors"), cfg, "flux2-test");
    REQUIRE(read.ok());
    a = *read;
  }
  const std::weak_ptr<const LoraAdapter> weak_a = a;
  {
    // The runtime ends with the edit: its request records (which hold the adapter until the
    // last callback has run, a moment after the result is out) are gone, as they are in an
    // engine a moment later; the model and its graphs stay.
    auto rt = graphs.runtime();
    EditParams edit = graphs.params("a dark blue patch", 31);
    edit.adapters = {{a, 1.0}};
    const RequestResult r = submit(*rt, 1, graphs.tmpl, std::move(edit)).get();
    REQUIRE(r.state == RequestState::kDone);
  }
  const StepGraphStats with_lora = graphs.model->step_graph_stats();
  REQUIRE(with_lora.graphs >= 1);
  // The adapter is still held here (as the adapter store holds it until a delete): nothing goes.
  graphs.model->release_unused();
  CHECK(graphs.model->step_graph_stats().graphs == with_lora.graphs);
  a.reset();  // deleted: only the graphs hold it now
  REQUIRE_FALSE(weak_a.expired());
  graphs.model->release_unused();
  const StepGraphStats released = graphs.model->step_graph_stats();
  CHECK(released.graphs == 0);
  CHECK(released.bytes == 0);
  CHECK(released.evicted == with_lora.evicted + with_lora.graphs);
  CHECK(weak_a.expired());  // its tensors are freed
  // Edits without it record and replay graphs as before.
  auto rt = graphs.runtime();
  const RequestResult plain = submit(*rt, 2, graphs.tmpl, graphs.params("a dark blue patch", 32)).get();
  REQUIRE(plain.state == RequestState::kDone);
  const StepGraphStats after = graphs.model->step_graph_stats();
  CHECK(after.recorded > released.recorded);
  CHECK(after.replayed > released.replayed);
  CHECK(after.graphs >= 1);
}
