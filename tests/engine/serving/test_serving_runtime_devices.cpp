// The serving runtime over two CPU devices (one worker each, one shared copy of the model):
// edits of a template go to the worker holding its entry, a live client's edits stay on one
// worker, a device taken out of service (the step fault seam throwing a sticky CUDA error)
// hands what it held to the other, which serves on, and no edit is lost. Also: devices must
// serve the same models, and a request routed to another instance of its model is re-bound.
#include "support/catch.h"

#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <span>
#include <stdexcept>

#include "pipeline/dit_edit_model.h"
#include "serving_fixture.h"

using namespace infill;
using infill::test::ServingFixture;

namespace {

const char* const kIllegalAccess = "CUDA error: an illegal memory access was encountered";

// Results by id, waited for one at a time.
struct Results {
  std::mutex mu;
  std::condition_variable cv;
  std::map<uint64_t, std::vector<RequestResult>> by_id;

  std::function<void(const RequestResult&)> callback() {
    return [this](const RequestResult& r) {
      std::lock_guard lock(mu);
      by_id[r.id].push_back(r);
      cv.notify_all();
    };
  }
  RequestResult wait(uint64_t id) {
    std::unique_lock lock(mu);
    const bool got =
        cv.wait_for(lock, std::chrono::seconds(120), [&] { return by_id.count(id) > 0; });
    REQUIRE(got);
    REQUIRE(by_id[id].size() == 1);
    return by_id[id].front();
  }
};

// The workers' before_step seam: holds a step that runs a held id until released, then throws
// the sticky CUDA error for a poisoned id.
struct StepSeam {
  std::mutex mu;
  std::condition_variable cv;
  std::set<uint64_t> hold, held, poison;

  std::function<void(std::span<const uint64_t>)> hook() {
    return [this](std::span<const uint64_t> ids) {
      std::unique_lock lock(mu);
      for (uint64_t id : ids) {
        if (!hold.count(id)) continue;
        held.insert(id);
        cv.notify_all();
        cv.wait(lock, [&] { return !hold.count(id); });
      }
      for (uint64_t id : ids)
        if (poison.count(id)) throw std::runtime_error(kIllegalAccess);
    };
  }
  void wait_held(uint64_t id) {
    std::unique_lock lock(mu);
    REQUIRE(cv.wait_for(lock, std::chrono::seconds(120), [&] { return held.count(id) > 0; }));
  }
  void release(uint64_t id) {
    std::lock_guard lock(mu);
    hold.erase(id);
    cv.notify_all();
  }
  void release_all() {
    std::lock_guard lock(mu);
    hold.clear();
    cv.notify_all();
  }
};

ServingRequest edit(const ServingFixture& f, uint64_t id, int tmpl, uint64_t client,
                    Results& results, RequestClass cls = RequestClass::kInteractive) {
  ServingRequest r;
  r.id = id;
  r.client_id = client;
  r.cls = cls;
  r.tmpl = f.templates[static_cast<size_t>(tmpl)];
  r.params = f.params(ServingFixture::rect_mask(8, 8, 16, 16), id);
  r.encode_result = false;
  r.on_complete = results.callback();
  return r;
}

std::vector<RuntimeDevice> two_cpu_devices(const ServingFixture& f) {
  auto model = std::make_shared<const DitEditModel>(f.model);
  return {{{{model, f.cost}}, "cpu:0"}, {{{model, f.cost}}, "cpu:1"}};
}

}  // namespace

TEST_CASE(
    "two CPU devices: template locality, a live client on one device, a device out of service, no "
    "edit lost",
    "[serving][runtime][devices]") {
  ServingFixture f;
  Results results;
  StepSeam seam;
  RuntimeOptions o;
  o.worker.before_step = seam.hook();
  auto made = ServingRuntime::create(two_cpu_devices(f), f.store, o);
  REQUIRE(made.ok());
  ServingRuntime& rt = **made;
  struct Release {
    StepSeam& seam;
    ~Release() { seam.release_all(); }
  } release_on_exit{seam};
  REQUIRE(rt.device_labels() == std::vector<std::string>{"cpu:0", "cpu:1"});
  REQUIRE(rt.worker_metrics().at(1).device == "cpu:1");
  std::set<uint64_t> submitted;
  auto submit = [&](ServingRequest r) {
    submitted.insert(r.id);
    REQUIRE(rt.submit(std::move(r)).ok());
  };

  // Edit 1 (template 0) on the idle engine: worker 0, which prepares template 0; held there.
  seam.hold = {1};
  submit(edit(f, 1, 0, 1, results));
  seam.wait_held(1);
  // Meanwhile template 1's first edit goes to the idle worker 1, which prepares its entry.
  submit(edit(f, 2, 1, 1, results));
  CHECK(results.wait(2).metrics.worker == 1);
  seam.release(1);
  CHECK(results.wait(1).metrics.worker == 0);
  REQUIRE(rt.drain(120000));
  const uint64_t prepares0 = rt.worker_metrics().at(0).prepare_steps,
                 prepares1 = rt.worker_metrics().at(1).prepare_steps;
  CHECK(prepares0 > 0);
  CHECK(prepares1 > 0);

  // Idle again, ties everywhere: each template's edits go to the worker holding its entry
  // (worker 1 for template 1, although a tie alone would pick worker 0), none prepares again.
  for (uint64_t id = 3; id <= 8; ++id) {
    const int tmpl = id % 2 == 1 ? 1 : 0;
    submit(edit(f, id, tmpl, 1, results));
    const RequestResult r = results.wait(id);
    INFO("edit " << id << " of template " << tmpl << ": " << r.status.to_string());
    CHECK(r.state == RequestState::kDone);
    CHECK(r.metrics.worker == tmpl);
    REQUIRE(rt.drain(120000));
  }
  {
    const std::vector<WorkerMetrics> w = rt.worker_metrics();
    CHECK(w[0].routed.at("template_locality") == 3);
    CHECK(w[1].routed.at("template_locality") == 3);
    CHECK(w[0].prepare_steps == prepares0);
    CHECK(w[1].prepare_steps == prepares1);
  }

  // A live client (9): its first edit (template 1) on worker 1 by locality, its next ones
  // there too, also for template 0, whose entry worker 0 holds.
  submit(edit(f, 10, 1, 9, results, RequestClass::kLive));
  CHECK(results.wait(10).metrics.worker == 1);
  for (uint64_t id = 11; id <= 12; ++id) {
    submit(edit(f, id, 0, 9, results, RequestClass::kLive));
    CHECK(results.wait(id).metrics.worker == 1);
  }
  REQUIRE(rt.drain(120000));
  CHECK(rt.worker_metrics().at(1).routed.at("live_client") == 2);
  // Template 0's entry was worker 0's until edit 11 took it to worker 1 (its holder since).
  CHECK(rt.worker_metrics().at(0).locality_missed == 1);

  // Worker 1's device fails for good on the live client's edit 20 while it holds two more of
  // them (21, 22: the client stays on its device). Edit 20 fails naming the fault; 21 and 22
  // are handed to worker 0 and done there.
  seam.hold = {20};
  seam.poison = {20};
  submit(edit(f, 20, 1, 9, results, RequestClass::kLive));
  seam.wait_held(20);
  submit(edit(f, 21, 1, 9, results, RequestClass::kLive));
  submit(edit(f, 22, 0, 9, results, RequestClass::kLive));
  CHECK(rt.worker_metrics().at(1).routed.at("live_client") == 5);
  seam.release(20);
  const RequestResult lost = results.wait(20);
  INFO(lost.status.to_string());
  CHECK(lost.state == RequestState::kFailed);
  CHECK(lost.status.message().find("failed on cpu:1: CUDA error: an illegal memory access") !=
        std::string::npos);
  CHECK(lost.status.message().find("worker 1 is out of service") != std::string::npos);
  for (uint64_t id : {21, 22}) {
    const RequestResult r = results.wait(id);
    INFO("edit " << id << ": " << r.status.to_string());
    CHECK(r.state == RequestState::kDone);
    CHECK(r.metrics.worker == 0);
  }
  CHECK_FALSE(rt.loads().at(1).in_service);
  CHECK(rt.loads().at(0).in_service);
  CHECK(rt.worker_metrics().at(1).rerouted == 2);
  CHECK(rt.worker_metrics().at(1).fault.find("cpu:1 failed: CUDA error") != std::string::npos);

  // Worker 0 serves on: template 1's edits (held by the lost worker) and the live client's.
  for (uint64_t id = 23; id <= 26; ++id) {
    submit(edit(f, id, 1, id % 2 == 0 ? 9 : 1, results,
                id % 2 == 0 ? RequestClass::kLive : RequestClass::kInteractive));
    const RequestResult r = results.wait(id);
    CHECK(r.state == RequestState::kDone);
    CHECK(r.metrics.worker == 0);
  }
  REQUIRE(rt.drain(120000));

  // No edit lost: every one has exactly one result, all done but the one whose step failed.
  std::lock_guard lock(results.mu);
  CHECK(results.by_id.size() == submitted.size());
  for (uint64_t id : submitted) {
    INFO("edit " << id);
    REQUIRE(results.by_id[id].size() == 1);
    CHECK(results.by_id[id].front().state ==
          (id == 20 ? RequestState::kFailed : RequestState::kDone));
  }
}

TEST_CASE("runtime devices must serve the same models, and another instance of a model is re-bound",
          "[serving][runtime][devices]") {
  ServingFixture f;
  {
    std::vector<RuntimeDevice> devices = two_cpu_devices(f);
    devices[1].models.clear();
    auto refused = ServingRuntime::create(devices, f.store, RuntimeOptions{});
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.status().message().find("device 1") != std::string::npos);
  }
  // Two instances of one model (as on two GPUs): a request naming device 0's runs on device
  // 1's when routed there, and its rebind is told so.
  auto a = std::make_shared<const DitEditModel>(f.model),
       b = std::make_shared<const DitEditModel>(f.model);
  StepSeam seam;
  RuntimeOptions o;
  o.worker.before_step = seam.hook();
  auto made =
      ServingRuntime::create({{{{a, f.cost}}, "cpu:0"}, {{{b, f.cost}}, "cpu:1"}}, f.store, o);
  REQUIRE(made.ok());
  ServingRuntime& rt = **made;
  struct Release {
    StepSeam& seam;
    ~Release() { seam.release_all(); }
  } release_on_exit{seam};
  Results results;
  seam.hold = {1};
  ServingRequest first = edit(f, 1, 0, 1, results);
  first.model = a;
  REQUIRE(rt.submit(std::move(first)).ok());
  seam.wait_held(1);  // worker 0 busy: the next edit goes to worker 1
  const EditModel* rebound_to = nullptr;
  ServingRequest second = edit(f, 2, 1, 1, results);
  second.model = a;
  second.rebind = [&](EditParams&, const std::shared_ptr<const EditModel>& model) {
    rebound_to = model.get();
    return Status();
  };
  REQUIRE(rt.submit(std::move(second)).ok());
  CHECK(rebound_to == b.get());
  const RequestResult done = results.wait(2);
  CHECK(done.state == RequestState::kDone);
  CHECK(done.metrics.worker == 1);
  // A rebind that fails refuses the submit, naming the device.
  ServingRequest third = edit(f, 3, 1, 1, results);
  third.model = a;
  third.rebind = [](EditParams&, const std::shared_ptr<const EditModel>&) {
    return invalid_argument("adapter x: no room");
  };
  const Status refused = rt.submit(std::move(third));
  CHECK_FALSE(refused.ok());
  CHECK(refused.message().find("request 3 on cpu:1: adapter x: no room") != std::string::npos);
  seam.release(1);
  CHECK(results.wait(1).state == RequestState::kDone);
  REQUIRE(rt.drain(120000));
}
