// The step cost a worker keeps per (model, device): refitted from its own timed steps,
// adopted only where it predicts them better than the model in use.
#include "support/catch.h"

#include <map>
#include <mutex>
#include <random>

#include <nlohmann/json.hpp>

#include "serving/live_cost_model.h"
#include "serving_fixture.h"

using namespace infill;
using infill::test::ServingFixture;

namespace {

std::shared_ptr<const StepCostModel> model_with(const std::array<double, 4>& c) {
  const nlohmann::json j = {{"format", "infill-step-cost"}, {"version", 1}, {"fingerprint", "test"}, {"coefficients", c}, {"train", 8}};
  auto m = StepCostModel::from_json(j.dump());
  REQUIRE(m.ok());
  return std::make_shared<const StepCostModel>(*m);
}

// Steps timed exactly as ms = 2 + 0.05 tokens + 1.5 batch + 1e-5 attention, over varied batches.
std::vector<StepSample> linear_steps(size_t n) {
  std::mt19937 rng(5);
  std::vector<StepSample> out;
  for (size_t i = 0; i < n; ++i) {
    const double tokens = 20 + double(rng() % 400), batch = 1 + double(rng() % 4), attention = tokens * 1024;
    out.push_back({tokens, batch, attention, 2 + 0.05 * tokens + 1.5 * batch + 1e-5 * attention});
  }
  return out;
}

}  // namespace

TEST_CASE("a live cost model refits on its steps and adopts only a better model", "[serving][cost]") {
  SECTION("a wrong start is replaced by what the steps say") {
    LiveCostModel live(model_with({0.001, 0.0, 0.0, 0.0}));
    for (const StepSample& s : linear_steps(2 * LiveCostModel::kRefitEvery)) live.add(s);
    const LiveCostModel::Report r = live.report();
    CHECK(r.samples == 2 * LiveCostModel::kRefitEvery);
    CHECK(r.refits_adopted >= 1);
    CHECK(r.mape < 1.0);
    const auto now = live.current();
    CHECK(now->predict_ms(100, 2, 100 * 1024) == Approx(2 + 5 + 3 + 1.024).epsilon(0.01));
    CHECK(now->fingerprint() == "test");
  }
  SECTION("a model that already predicts its steps is kept") {
    const auto exact = model_with({2, 0.05, 1.5, 1e-5});
    LiveCostModel live(exact);
    for (const StepSample& s : linear_steps(LiveCostModel::kRefitEvery)) live.add(s);
    CHECK(live.report().refits_adopted == 0);
    CHECK(live.current() == exact);
  }
  SECTION("steps that all look alike cannot be fitted: the model in use stays") {
    const auto start = model_with({1, 0.01, 0.05, 1e-4});
    LiveCostModel live(start);
    for (size_t i = 0; i < LiveCostModel::kRefitEvery; ++i) live.add({100, 1, 100 * 1024, 30});
    CHECK(live.current() == start);
    CHECK(live.report().samples == LiveCostModel::kRefitEvery);
  }
}

TEST_CASE("a worker refits its model's step cost from the steps it runs", "[serving][cost][runtime]") {
  ServingFixture f;
  RuntimeOptions o;
  // Far off: 1 microsecond a step, whatever it holds.
  auto rt = ServingRuntime::create(f.model, f.store, model_with({0.001, 0.0, 0.0, 0.0}), o);
  REQUIRE(rt.ok());
  std::mutex mu;
  std::map<uint64_t, RequestState> states;
  uint64_t id = 1;
  // Masks of several sizes, so the steps' token counts vary; 4 steps each.
  for (int round = 0; round < 5; ++round) {
    for (int size : {8, 16, 24, 32, 40}) {
      ServingRequest r;
      r.id = id++;
      r.client_id = 1;
      r.tmpl = f.templates[0];
      r.params = f.params(ServingFixture::rect_mask(0, 0, size, std::min(size, 48)), r.id);
      r.encode_result = false;
      r.on_complete = [&](const RequestResult& res) {
        std::lock_guard lock(mu);
        states[res.id] = res.state;
      };
      REQUIRE((*rt)->submit(std::move(r)).ok());
      REQUIRE((*rt)->drain(60000));  // one at a time: every step is a sample of one request
    }
  }
  for (const auto& [rid, state] : states) CHECK(state == RequestState::kDone);
  const WorkerMetrics m = (*rt)->worker_metrics().at(0);
  const WorkerMetrics::ModelCost& cost = m.cost_by_model.at(f.model->id);
  INFO("samples " << cost.samples << ", refits " << cost.refits_adopted << ", mape " << cost.mape);
  CHECK(cost.samples >= 2 * LiveCostModel::kRefitEvery);
  CHECK(cost.refits_adopted >= 1);
  // The refitted model predicts a real step, not a microsecond.
  CHECK(cost.coefficients != std::array<double, 4>{0.001, 0.0, 0.0, 0.0});
  CHECK(cost.mape < 99.0);
}
