// The serving runtime with real threads and real forwards of a small random-weight model.
#include "support/catch.h"

#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>

#include "request_collector.h"
#include "serving_fixture.h"
#include "support/step_gate.h"

using namespace infill;
using infill::test::ServingFixture;
using infill::test::StepGate;
using Collector = infill::test::RequestCollector;

namespace {

std::unique_ptr<ServingRuntime> start(const ServingFixture& f, RuntimeOptions o) {
  auto rt = ServingRuntime::create(f.model, f.store, f.cost, std::move(o));
  REQUIRE(rt.ok());
  return std::move(*rt);
}

ServingRequest request(const ServingFixture& f, uint64_t id, const at::Tensor& mask, uint64_t seed, Collector& c,
                       int tmpl = 0) {
  ServingRequest r;
  r.id = id;
  r.client_id = 1;
  r.tmpl = f.templates[static_cast<size_t>(tmpl)];
  r.params = f.params(mask, seed);
  r.on_complete = c.callback();
  return r;
}

double max_abs_diff(const PixelImage& a, const PixelImage& b) {
  return (to_rgb_tensor(a) - to_rgb_tensor(b)).abs().max().item<double>();
}

int64_t rss_bytes() {
  std::ifstream in("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  in >> pages >> resident;
  return resident * 4096;
}

}  // namespace

TEST_CASE("batched steps give each request the output it gets alone", "[serving][runtime]") {
  ServingFixture f;
  Collector c;
  RuntimeOptions o;
  o.worker.policy = BatchingPolicy::kContinuous;
  o.worker.token_budget = 4096;
  // No step until all four sessions are ready, so the first step packs them all: this test
  // is about packing, not about when requests arrive.
  o.worker.may_step = infill::test::step_when_ready(4);
  auto rt = start(f, o);
  std::vector<ServingRequest> reqs;
  reqs.push_back(request(f, 1, ServingFixture::rect_mask(0, 0, 20, 16), 11, c));
  reqs.push_back(request(f, 2, ServingFixture::rect_mask(30, 10, 24, 30), 12, c));
  reqs.push_back(request(f, 3, ServingFixture::rect_mask(8, 24, 40, 20), 13, c));
  // Classifier-free guidance: two segments of this request in the same packed forward.
  reqs.push_back(request(f, 4, ServingFixture::rect_mask(16, 8, 16, 16), 14, c));
  reqs[3].params.prompt = at::randn({8}, at::make_generator<at::CPUGeneratorImpl>(5));
  reqs[3].params.guidance_scale = 3.0;
  std::vector<EditParams> params;
  for (auto& r : reqs) params.push_back(r.params);
  for (auto& r : reqs) REQUIRE(rt->submit(std::move(r)).ok());
  REQUIRE(rt->drain(60000));

  const WorkerMetrics m = rt->worker_metrics().at(0);
  CHECK(m.max_batch == 4);
  CHECK(m.prepare_steps == 4);  // one prepare job of 4 steps served all four requests
  // The live cost samples: every batched step, each with the batch's packed tokens (the
  // guided request twice) and attention work, as the cost model is fitted on.
  REQUIRE(m.recent_steps.size() == m.steps);
  CHECK(m.recent_steps.front().batch_size == 4);
  double tokens = 0, attention = 0;
  for (uint64_t id = 1; id <= 4; ++id) {
    const RequestMetrics& rm = c.only(id).metrics;
    const double t = double(rm.masked_tokens) * (id == 4 ? 2 : 1);
    tokens += t;
    attention += t * double(rm.total_tokens);
  }
  const auto full = std::find_if(m.recent_steps.begin(), m.recent_steps.end(),
                                 [](const StepSample& s) { return s.batch_size == 4; });
  REQUIRE(full != m.recent_steps.end());
  CHECK(full->tokens == tokens);
  CHECK(full->attention_work == attention);
  CHECK(full->ms > 0);
  EditPipeline alone(f.model, ServingFixture::new_store());
  for (uint64_t id = 1; id <= 4; ++id) {
    const RequestResult& r = c.only(id);
    INFO("request " << id << ": " << r.status.to_string());
    REQUIRE(r.state == RequestState::kDone);
    CHECK(r.metrics.steps_run == 4);
    CHECK(r.metrics.steps_dropped == 0);
    CHECK_FALSE(r.result_file.empty());
    // The pool thread's share of the post-processing time: positive, within the whole.
    CHECK(r.metrics.post_work_ms > 0);
    CHECK(r.metrics.post_work_ms <= r.metrics.post_ms);
    auto ref = alone.edit(f.templates[0], params[id - 1]);
    REQUIRE(ref.ok());
    // Same rows through the same kernels; packing may only change float rounding.
    CHECK(max_abs_diff(r.output.image, ref->image) <= 1.0 / 255 + 1e-6);
  }
}

TEST_CASE("every transition is timestamped, progress and previews arrive", "[serving][runtime]") {
  ServingFixture f;
  Collector c;
  auto rt = start(f, RuntimeOptions{});
  ServingRequest r = request(f, 9, ServingFixture::rect_mask(10, 10, 20, 20), 1, c);
  r.preview_every_steps = 2;
  r.on_progress = [&](const RequestProgress& p) {
    CHECK(p.id == 9);
    CHECK(p.steps_total == 4);
    c.progress_calls++;
  };
  r.on_preview = [&](uint64_t id, int, const at::Tensor& rgb) {
    CHECK(id == 9);
    CHECK(rgb.dim() == 3);
    c.preview_calls++;
  };
  REQUIRE(rt->submit(std::move(r)).ok());
  REQUIRE(rt->drain(60000));
  const RequestResult& res = c.only(9);
  REQUIRE(res.state == RequestState::kDone);
  std::vector<RequestState> states;
  double last = -1;
  for (const auto& e : res.history) {
    states.push_back(e.state);
    CHECK(e.time_ms >= last);
    last = e.time_ms;
  }
  const std::vector<RequestState> expected = {RequestState::kQueued, RequestState::kPreparing, RequestState::kRunning,
                                              RequestState::kDone};
  CHECK((states == expected));
  CHECK(c.progress_calls == 4);
  CHECK(c.preview_calls == 1);  // after step 2; step 4 is the final result
  CHECK(res.metrics.total_ms >= res.metrics.prepare_ms);
  CHECK(res.metrics.deadline_met);
}

TEST_CASE("a request's callbacks arrive in order and none after its completion", "[serving][runtime]") {
  ServingFixture f;
  Collector c;
  RuntimeOptions o;
  o.pool_threads = 3;  // callbacks of one request could otherwise overtake each other
  auto rt = start(f, o);
  // Per request, in arrival order: steps_done for a progress call, kPreview, kDone.
  constexpr int kPreview = -1, kDone = -2;
  std::mutex log_mu;
  std::map<uint64_t, std::vector<int>> log;
  auto note = [&](uint64_t id, int what) {
    std::lock_guard lock(log_mu);
    log[id].push_back(what);
  };
  constexpr int kRequests = 6;
  for (uint64_t id = 1; id <= kRequests; ++id) {
    ServingRequest r = request(f, id, ServingFixture::rect_mask(4 * int(id), 8, 16, 16), id, c);
    r.preview_every_steps = 1;
    // A slow first progress callback: a later callback run on another pool thread would finish first.
    r.on_progress = [&, id](const RequestProgress& p) {
      if (p.steps_done == 1) std::this_thread::sleep_for(std::chrono::milliseconds(80));
      note(id, p.steps_done);
    };
    r.on_preview = [&](uint64_t rid, int, const at::Tensor&) { note(rid, kPreview); };
    auto done = r.on_complete;
    r.on_complete = [&, done](const RequestResult& res) {
      note(res.id, kDone);
      done(res);
    };
    REQUIRE(rt->submit(std::move(r)).ok());
  }
  REQUIRE(rt->drain(60000));
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (;;) {
    {
      std::lock_guard lock(c.mu);
      if (c.results.size() == kRequests || std::chrono::steady_clock::now() > until) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::lock_guard lock(log_mu);
  REQUIRE(log.size() == size_t(kRequests));
  for (const auto& [id, events] : log) {
    INFO("request " << id);
    REQUIRE_FALSE(events.empty());
    CHECK(events.back() == kDone);
    CHECK(std::count(events.begin(), events.end(), kDone) == 1);
    int last_step = 0;
    for (int e : events) {
      if (e <= 0) continue;
      CHECK(e == last_step + 1);
      last_step = e;
    }
    CHECK(last_step == 4);
  }
}

TEST_CASE("a failure in pre- or post-processing or in a step fails only its requests", "[serving][runtime]") {
  ServingFixture f;
  Collector c;
  RuntimeOptions o;
  o.worker.policy = BatchingPolicy::kContinuous;
  std::atomic<bool> step_fault_armed{true};
  o.worker.before_finish = [](uint64_t id) {
    return id == 3 ? Status(ErrorCode::kInternal, "injected post-processing fault for request 3") : Status();
  };
  o.worker.before_step = [&](std::span<const uint64_t> ids) {
    for (uint64_t id : ids) {
      if (id == 4 && step_fault_armed.exchange(false)) throw std::runtime_error("injected step fault");
    }
  };
  auto rt = start(f, o);
  // Warm the template so request 4 runs alone once it is submitted.
  REQUIRE(rt->submit(request(f, 1, ServingFixture::rect_mask(0, 0, 16, 16), 1, c)).ok());
  REQUIRE(rt->drain(60000));
  REQUIRE(rt->submit(request(f, 2, at::ones({47, 64}), 2, c)).ok());  // wrong mask size
  REQUIRE(rt->submit(request(f, 3, ServingFixture::rect_mask(0, 0, 16, 16), 3, c)).ok());
  REQUIRE(rt->drain(60000));
  REQUIRE(rt->submit(request(f, 4, ServingFixture::rect_mask(20, 20, 16, 16), 4, c)).ok());
  REQUIRE(rt->drain(60000));
  REQUIRE(rt->submit(request(f, 5, ServingFixture::rect_mask(20, 20, 16, 16), 5, c)).ok());
  REQUIRE(rt->drain(60000));

  CHECK(c.only(1).state == RequestState::kDone);
  const RequestResult& pre = c.only(2);
  CHECK(pre.state == RequestState::kFailed);
  CHECK(pre.status.message().find("mask is 64x47") != std::string::npos);
  const RequestResult& post = c.only(3);
  CHECK(post.state == RequestState::kFailed);
  CHECK(post.status.message().find("request 3") != std::string::npos);
  const RequestResult& step = c.only(4);
  CHECK(step.state == RequestState::kFailed);
  // The error names the device the step ran on (a CUDA error or out of memory would read
  // "failed on cuda:0: ...").
  CHECK(step.status.message().find("step of request 4 failed on cpu: injected step fault") != std::string::npos);
  CHECK(c.only(5).state == RequestState::kDone);  // the worker went on
  CHECK(rt->worker_metrics().at(0).failed_steps == 1);
}

TEST_CASE("cancel, supersede and expiry each end a request once", "[serving][runtime]") {
  ServingFixture f;
  Collector c;
  // No step runs until every submit and cancel below is made: the requests they name are all
  // still live then, however the test thread and the worker share a busy machine.
  StepGate gate(0);
  RuntimeOptions o;
  o.worker.before_step = gate.hook();
  auto rt = start(f, o);
  const auto opener = gate.open_on_exit();
  ServingRequest a = request(f, 1, ServingFixture::rect_mask(0, 0, 32, 32), 1, c);
  a.params.schedule.steps = 40;
  REQUIRE(rt->submit(std::move(a)).ok());
  ServingRequest b = request(f, 2, ServingFixture::rect_mask(0, 0, 32, 32), 2, c);
  b.supersedes = 1;
  REQUIRE(rt->submit(std::move(b)).ok());
  // Another client may not supersede.
  ServingRequest x = request(f, 3, ServingFixture::rect_mask(0, 0, 8, 8), 3, c);
  x.client_id = 2;
  x.supersedes = 2;
  const Status rejected = rt->submit(std::move(x));
  CHECK_FALSE(rejected.ok());
  CHECK(rejected.message().find("client") != std::string::npos);
  // A duplicate live id is rejected.
  CHECK_FALSE(rt->submit(request(f, 2, ServingFixture::rect_mask(0, 0, 8, 8), 3, c)).ok());
  ServingRequest d = request(f, 4, ServingFixture::rect_mask(0, 0, 8, 8), 4, c);
  d.params.schedule.steps = 40;
  REQUIRE(rt->submit(std::move(d)).ok());
  CHECK(rt->cancel(4));
  ServingRequest e = request(f, 5, ServingFixture::rect_mask(0, 0, 8, 8), 5, c);
  e.deadline_ms = 0.001;
  e.expire_at_deadline = true;
  REQUIRE(rt->submit(std::move(e)).ok());
  gate.open();
  REQUIRE(rt->drain(60000));

  const RequestResult& old = c.only(1);
  CHECK(old.state == RequestState::kCancelled);
  CHECK(old.status.message().find("superseded by request 2") != std::string::npos);
  CHECK(c.only(2).state == RequestState::kDone);
  CHECK(c.results.count(3) == 0);  // rejected: never queued, no callback
  CHECK(c.only(4).state == RequestState::kCancelled);
  CHECK(c.only(5).state == RequestState::kExpired);
  CHECK_FALSE(rt->cancel(4));  // finished ids are not live
}

TEST_CASE("under overload the deadline policy cuts steps within the class bound and says so",
          "[serving][runtime][reduction]") {
  ServingFixture f;
  // A cost model that predicts 100 ms a step whatever the batch: 40 steps are 4 s, far past a
  // 3 s deadline, while 20-29 steps fit (unless pre-processing took over 1 s). The scheduler
  // compares these predictions with the real clock, so the scale leaves a busy machine's
  // pre-processing and steps (a few ms each when idle) far inside it; the edit itself still
  // runs at the machine's speed.
  auto slow = StepCostModel::from_json(
      R"({"format":"infill-step-cost","version":1,"fingerprint":"test","coefficients":[100,0,0,0],"train":4})");
  REQUIRE(slow.ok());
  f.cost = std::make_shared<const StepCostModel>(*slow);
  for (RequestClass cls : {RequestClass::kLive, RequestClass::kInteractive, RequestClass::kBatch}) {
    Collector c;
    RuntimeOptions o;
    o.worker.policy = BatchingPolicy::kDeadline;
    auto rt = start(f, o);
    ServingRequest r = request(f, 1, ServingFixture::rect_mask(8, 8, 24, 16), 1, c);
    r.params.schedule.steps = 40;
    r.cls = cls;
    r.deadline_ms = 3000.0;
    REQUIRE(rt->submit(std::move(r)).ok());
    REQUIRE(rt->drain(60000));
    const RequestResult& res = c.only(1);
    INFO("class " << request_class_name(cls));
    REQUIRE(res.state == RequestState::kDone);
    const RequestMetrics& m = res.metrics;
    CHECK(m.steps_requested == 40);
    CHECK(m.steps_run + m.steps_dropped == 40);
    CHECK(m.steps_run >= min_steps_allowed(cls, 40));
    if (cls == RequestClass::kBatch) {
      CHECK(m.steps_dropped == 0);  // the batch class keeps every step
    } else {
      CHECK(m.steps_dropped > 0);
      CHECK(m.steps_run <= 30);
    }
    // Whatever the step count, the pixels outside the mask are the template's.
    const at::Tensor out = to_rgb_tensor(res.output.image), in = to_rgb_tensor(f.templates[0]->pixels);
    at::Tensor outside = ServingFixture::rect_mask(8, 8, 24, 16).eq(0).unsqueeze(0).expand_as(out);
    CHECK((out - in).abs().masked_select(outside).max().item<double>() == 0.0);
  }
}

TEST_CASE("stress: 1000 requests with random cancels and supersedes", "[serving][runtime][stress]") {
  ServingFixture f(3);
  RuntimeOptions o;
  o.workers = 2;
  o.routing = RoutingPolicy::kMaskAware;
  o.worker.policy = BatchingPolicy::kDeadline;
  o.worker.token_budget = 64;
  auto rt = start(f, o);
  std::mt19937_64 rng(2024);
  auto random_mask = [&]() {
    const int w = 4 + static_cast<int>(rng() % 40), h = 4 + static_cast<int>(rng() % 30);
    return ServingFixture::rect_mask(static_cast<int>(rng() % (64 - w + 1)), static_cast<int>(rng() % (48 - h + 1)), w, h);
  };
  auto run = [&](uint64_t first_id, int count, Collector& c) {
    std::vector<uint64_t> submitted;
    for (int i = 0; i < count; ++i) {
      const uint64_t id = first_id + static_cast<uint64_t>(i);
      ServingRequest r = request(f, id, random_mask(), id, c, static_cast<int>(rng() % 3));
      r.client_id = rng() % 8;
      r.params.schedule.steps = 2 + static_cast<int>(rng() % 3);
      r.cls = static_cast<RequestClass>(1 + rng() % 3);
      r.encode_result = rng() % 4 == 0;
      if (!submitted.empty() && rng() % 6 == 0) r.supersedes = submitted[rng() % submitted.size()];
      const Status s = rt->submit(std::move(r));
      if (s.ok()) submitted.push_back(id);
      if (!submitted.empty() && rng() % 5 == 0) rt->cancel(submitted[rng() % submitted.size()]);
    }
    REQUIRE(rt->drain(170000));
    return submitted;
  };
  Collector warm;
  (void)run(1'000'000, 60, warm);  // allocator pools, prepared templates
  malloc_trim(0);
  const int64_t baseline = rss_bytes();

  Collector c;
  const std::vector<uint64_t> submitted = run(1, 1000, c);
  std::map<RequestState, int> by_state;
  {
    std::lock_guard lock(c.mu);
    CHECK(c.results.size() == submitted.size());
    for (uint64_t id : submitted) {
      auto it = c.results.find(id);
      REQUIRE(it != c.results.end());
      CHECK(it->second.size() == 1);  // exactly one terminal result
      CHECK(is_terminal(it->second.front().state));
      by_state[it->second.front().state]++;
    }
  }
  WARN("done " << by_state[RequestState::kDone] << ", cancelled " << by_state[RequestState::kCancelled]
               << ", failed " << by_state[RequestState::kFailed]);
  CHECK(by_state[RequestState::kDone] > 0);
  CHECK(by_state[RequestState::kCancelled] > 0);
  CHECK(by_state[RequestState::kFailed] == 0);
  CHECK(rt->live_requests() == 0);
  CHECK(Worker::live_records() == 0);  // every request record freed
  {
    std::lock_guard lock(c.mu);
    c.results.clear();
  }
  malloc_trim(0);
  const int64_t after = rss_bytes();
  INFO("rss baseline " << baseline / 1024 << " KiB, after " << after / 1024 << " KiB");
  // Allocator slack, not growth per request: 1000 leaked results would be far more.
  CHECK(after - baseline < (32 << 20));
}
