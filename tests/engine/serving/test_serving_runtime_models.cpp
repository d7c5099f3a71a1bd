// One runtime, one worker, two models: a round packs each model's requests into that model's
// own forward, every edit gets what its model gives it alone, a failed forward of one model
// fails only its requests, and supersede and the model checks work across models.
#include "support/catch.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <set>

#include "pipeline/dit_edit_model.h"
#include "request_collector.h"
#include "serving_fixture.h"
#include "support/step_gate.h"

using namespace infill;
using infill::test::ServingFixture;
using infill::test::StepGate;
using Collector = infill::test::RequestCollector;

namespace {


// A second random model of the fixture's architecture, other weights, its own template.
struct SecondModel {
  std::shared_ptr<const Model> model;
  std::shared_ptr<const TemplateImage> tmpl;
  SecondModel(const ServingFixture& f, uint64_t seed) {
    const std::string dir = f.dir.file("model-" + std::to_string(seed));
    REQUIRE(write_random_model(dir, infill::test::tiny_serving_dit(), 16, seed).ok());
    auto loaded = load_model(dir);
    REQUIRE(loaded.ok());
    model = *loaded;
    auto png = encode_png(infill::test::serving_picture(0));
    auto t = make_template(*model, *png, "picture-b.png");
    REQUIRE(t.ok());
    tmpl = *t;
  }
};

// The fixture's model (a) and a second one (b) of the same architecture, as served models.
struct TwoModels {
  ServingFixture f;
  SecondModel b{f, 7};
  std::shared_ptr<const EditModel> model_a = std::make_shared<const DitEditModel>(f.model);
  std::shared_ptr<const EditModel> model_b = std::make_shared<const DitEditModel>(b.model);
};

ServingRequest request(uint64_t id, std::shared_ptr<const EditModel> model, std::shared_ptr<const TemplateImage> tmpl,
                       const at::Tensor& mask, uint64_t seed, Collector& c) {
  ServingRequest r;
  r.id = id;
  r.client_id = 1;
  r.model = std::move(model);
  r.tmpl = std::move(tmpl);
  r.params.mask = mask;
  r.params.seed = seed;
  r.params.schedule.steps = 4;
  r.on_complete = c.callback();
  return r;
}

double max_abs_diff(const PixelImage& a, const PixelImage& b) {
  return (to_rgb_tensor(a) - to_rgb_tensor(b)).abs().max().item<double>();
}

}  // namespace

TEST_CASE("one worker serves two models: each round runs one forward per model, each edit as its model alone",
          "[serving][runtime][models]") {
  TwoModels two;
  ServingFixture& f = two.f;
  const SecondModel& b = two.b;
  const auto& model_a = two.model_a;
  const auto& model_b = two.model_b;
  REQUIRE(model_a->info().id != model_b->info().id);
  Collector c;
  RuntimeOptions o;
  o.worker.policy = BatchingPolicy::kContinuous;
  o.worker.token_budget = 4096;
  // No step until all four sessions are ready: the first round holds both models.
  o.worker.may_step = infill::test::step_when_ready(4);
  // Which ids each forward got: one call per model present in a round.
  std::mutex calls_mu;
  std::vector<std::vector<uint64_t>> forwards;
  o.worker.before_step = [&](std::span<const uint64_t> ids) {
    std::lock_guard lock(calls_mu);
    forwards.emplace_back(ids.begin(), ids.end());
  };
  auto rt = ServingRuntime::create({{model_a, f.cost}, {model_b, f.cost}}, f.store, o);
  REQUIRE(rt.ok());
  std::vector<ServingRequest> reqs;
  reqs.push_back(request(1, model_a, f.templates[0], ServingFixture::rect_mask(0, 0, 20, 16), 11, c));
  reqs.push_back(request(2, model_b, b.tmpl, ServingFixture::rect_mask(30, 10, 24, 30), 12, c));
  reqs.push_back(request(3, nullptr, f.templates[0], ServingFixture::rect_mask(8, 24, 40, 20), 13, c));  // the first model
  reqs.push_back(request(4, model_b, b.tmpl, ServingFixture::rect_mask(16, 8, 16, 16), 14, c));
  std::vector<EditParams> params;
  for (auto& r : reqs) params.push_back(r.params);
  for (auto& r : reqs) REQUIRE((*rt)->submit(std::move(r)).ok());
  REQUIRE((*rt)->drain(60000));

  REQUIRE((*rt)->worker_metrics().size() == 1);
  const WorkerMetrics m = (*rt)->worker_metrics().at(0);
  CHECK(m.device == "cpu");
  CHECK(m.max_batch == 4);
  CHECK(m.steps_by_model.at(model_a->info().id) == 4);
  CHECK(m.steps_by_model.at(model_b->info().id) == 4);
  {
    std::lock_guard lock(calls_mu);
    REQUIRE(forwards.size() >= 2);
    // The first round: model a's two requests in one forward, model b's in another.
    std::set<std::set<uint64_t>> first_round;
    for (size_t i = 0; i < 2; ++i) first_round.insert(std::set<uint64_t>(forwards[i].begin(), forwards[i].end()));
    CHECK(first_round == std::set<std::set<uint64_t>>{{1, 3}, {2, 4}});
  }
  EditPipeline alone_a(f.model, ServingFixture::new_store());
  EditPipeline alone_b(b.model, ServingFixture::new_store());
  for (uint64_t id = 1; id <= 4; ++id) {
    const RequestResult& r = c.only(id);
    INFO("request " << id << ": " << r.status.to_string());
    REQUIRE(r.state == RequestState::kDone);
    const bool on_b = id % 2 == 0;
    auto ref = on_b ? alone_b.edit(b.tmpl, params[id - 1]) : alone_a.edit(f.templates[0], params[id - 1]);
    REQUIRE(ref.ok());
    // Same rows through the same kernels; packing may only change float rounding.
    CHECK(max_abs_diff(r.output.image, ref->image) <= 1.0 / 255 + 1e-6);
    // And the other model gives something else: the request really ran on its own.
    auto other = on_b ? alone_a.edit(f.templates[0], params[id - 1]) : alone_b.edit(b.tmpl, params[id - 1]);
    REQUIRE(other.ok());
    CHECK(max_abs_diff(r.output.image, other->image) > 0.05);
  }
}

TEST_CASE("two models on one worker: a failed forward of one fails only its requests, and supersede crosses models",
          "[serving][runtime][models]") {
  TwoModels two;
  ServingFixture& f = two.f;
  const SecondModel& b = two.b;
  const auto& model_a = two.model_a;
  const auto& model_b = two.model_b;
  Collector c;
  RuntimeOptions o;
  o.worker.policy = BatchingPolicy::kContinuous;
  o.worker.may_step = infill::test::step_when_ready(2);
  // Model a's forward fails once (request 1's); model b's in the same round goes on.
  std::atomic<bool> armed{true};
  // Request 3's steps wait here until the edit that supersedes it is submitted: it is still
  // live then, however the test thread and the worker share a busy machine.
  StepGate hold_3(0);
  o.worker.before_step = [&, hold = hold_3.hook()](std::span<const uint64_t> ids) {
    for (uint64_t id : ids)
      if (id == 1 && armed.exchange(false)) throw std::runtime_error("injected step fault");
    if (std::find(ids.begin(), ids.end(), uint64_t{3}) != ids.end()) hold(ids);
  };
  auto rt = ServingRuntime::create({{model_a, f.cost}, {model_b, f.cost}}, f.store, o);
  REQUIRE(rt.ok());
  const auto opener = hold_3.open_on_exit();
  REQUIRE((*rt)->submit(request(1, model_a, f.templates[0], ServingFixture::rect_mask(0, 0, 16, 16), 1, c)).ok());
  REQUIRE((*rt)->submit(request(2, model_b, b.tmpl, ServingFixture::rect_mask(0, 0, 16, 16), 2, c)).ok());
  REQUIRE((*rt)->drain(60000));
  const RequestResult& failed = c.only(1);
  CHECK(failed.state == RequestState::kFailed);
  CHECK(failed.status.message().find("step of request 1 failed on cpu: injected step fault") != std::string::npos);
  CHECK(c.only(2).state == RequestState::kDone);
  CHECK((*rt)->worker_metrics().at(0).failed_steps == 1);

  // An edit of model b supersedes the same client's running edit of model a.
  ServingRequest long_a = request(3, model_a, f.templates[0], ServingFixture::rect_mask(0, 0, 32, 32), 3, c);
  long_a.params.schedule.steps = 40;
  REQUIRE((*rt)->submit(std::move(long_a)).ok());
  ServingRequest newer = request(4, model_b, b.tmpl, ServingFixture::rect_mask(0, 0, 32, 32), 4, c);
  newer.supersedes = 3;
  REQUIRE((*rt)->submit(std::move(newer)).ok());
  hold_3.open();
  REQUIRE((*rt)->drain(60000));
  CHECK(c.only(3).state == RequestState::kCancelled);
  CHECK(c.only(3).status.message().find("superseded by request 4") != std::string::npos);
  CHECK(c.only(4).state == RequestState::kDone);

  // A model the runtime does not serve: refused at submit, naming it and the served ones.
  SecondModel other(f, 9);
  auto model_c = std::make_shared<const DitEditModel>(other.model);
  const Status refused = (*rt)->submit(request(5, model_c, other.tmpl, ServingFixture::rect_mask(0, 0, 8, 8), 5, c));
  CHECK_FALSE(refused.ok());
  CHECK(refused.message().find("names model " + model_c->info().id) != std::string::npos);
  CHECK(refused.message().find(model_a->info().id) != std::string::npos);
  CHECK(c.results.count(5) == 0);
}

TEST_CASE("a runtime refuses a model given twice and no model", "[serving][runtime][models]") {
  ServingFixture f;
  auto model_a = std::make_shared<const DitEditModel>(f.model);
  auto twice = ServingRuntime::create({{model_a, f.cost}, {model_a, f.cost}}, f.store, RuntimeOptions{});
  REQUIRE_FALSE(twice.ok());
  CHECK(twice.status().message().find("is given twice") != std::string::npos);
  auto none = ServingRuntime::create(std::vector<ServedModel>{}, f.store, RuntimeOptions{});
  CHECK_FALSE(none.ok());
  auto no_cost = ServingRuntime::create({{model_a, nullptr}}, f.store, RuntimeOptions{});
  REQUIRE_FALSE(no_cost.ok());
  CHECK(no_cost.status().message().find("no cost model") != std::string::npos);
}
