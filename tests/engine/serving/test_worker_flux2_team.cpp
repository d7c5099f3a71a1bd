// A FLUX.2 prepare run through the serving runtime over two CPU devices (one worker each, a
// Gloo device team, serving/device_team.h): the worker that got the edit leads every prepare
// step in sequence parallel with the idle device, whose loop runs its share, and every masked
// step of a large mask likewise; the edit then equals the same edit on one device (pixels
// outside the mask byte for byte, inside within the fp16 rounding of the entry: a few 8-bit
// levels at most), and a busy device is not taken.
#include "support/catch.h"

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <span>
#include <thread>
#include <atomic>

#include <ATen/ATen.h>

#include "flux2_serving_fixture.h"
#include "serving/serving_runtime.h"
#include "serving_fixture.h"
#include "support/outside_mask.h"

using namespace infill;
using namespace infill::test;

namespace {

std::unique_ptr<ServingRuntime> two_cpu_devices(const Flux2Serving& f, bool sequence_parallel = true) {
  std::vector<RuntimeDevice> devices(2);
  for (RuntimeDevice& d : devices) d.models = {ServedModel{f.model, fixed_cost_model()}};
  devices[0].label = "cpu:0";
  devices[1].label = "cpu:1";
  RuntimeOptions o;
  o.sequence_parallel = sequence_parallel;
  // These tests check what sharing a step computes: the planner is told sharing is free and
  // learns nothing from the measured steps (two "devices" on this machine's cores), so it
  // shares every step an idle device can take.
  o.team_link = TeamLink{0.0, 1e12, 2};
  o.team_planning.learn = false;
  auto rt = ServingRuntime::create(std::move(devices), f.store, std::move(o));
  REQUIRE(rt.ok());
  const Status team = (*rt)->team_status();
  if (sequence_parallel && !team.ok() && team.message().find("no Gloo") != std::string::npos) {
    WARN("SKIPPED: " + team.message());
    std::fprintf(stderr, "SKIPPED: %s\n", team.message().c_str());
    std::exit(4);
  }
  return std::move(*rt);
}

uint64_t total(const std::vector<WorkerMetrics>& workers, uint64_t WorkerMetrics::*field) {
  uint64_t sum = 0;
  for (const WorkerMetrics& w : workers) sum += w.*field;
  return sum;
}

// Holds every step of request `id` at the worker's before_step seam until released, so that
// its worker stays busy with it (the tests' "device serving an edit of its own").
struct StepHold {
  explicit StepHold(uint64_t id) : id(id) {}
  std::function<void(std::span<const uint64_t>)> seam() {
    return [this](std::span<const uint64_t> ids) {
      if (ids.empty() || ids[0] != id) return;
      std::unique_lock lock(mu);
      holding = true;
      cv.notify_all();
      cv.wait(lock, [&] { return released; });
    };
  }
  bool wait_holding() {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(300), [&] { return holding; });
  }
  void release() {
    {
      std::lock_guard lock(mu);
      released = true;
    }
    cv.notify_all();
  }
  const uint64_t id;
  std::mutex mu;
  std::condition_variable cv;
  bool holding = false, released = false;
};

}  // namespace

TEST_CASE("A FLUX.2 prepare runs in sequence parallel over two CPU devices and its edit equals one prepared alone",
          "[flux2-serving][parallel]") {
  Flux2Serving f;
  auto rt = two_cpu_devices(f);
  REQUIRE(rt->team_status().ok());
  const EditParams p = f.params("make the cup red", 7);
  const RequestResult r = submit(*rt, 1, f.tmpl, p).get();
  INFO(r.status.to_string());
  REQUIRE(r.state == RequestState::kDone);
  const auto workers = rt->worker_metrics();
  REQUIRE(workers.size() == 2);
  // Three prepare steps, each led by one worker with the other's share run on its own loop;
  // then the edit's three masked steps likewise (its mask covers over a quarter of the image).
  REQUIRE(double(r.output.masked_tokens) >= 0.25 * double(r.output.total_tokens));
  CHECK(total(workers, &WorkerMetrics::prepare_steps) == 3);
  CHECK(total(workers, &WorkerMetrics::prepare_steps_parallel) == 3);
  CHECK(total(workers, &WorkerMetrics::steps_parallel) == 3);
  CHECK(total(workers, &WorkerMetrics::team_shares) == 6);
  CHECK(workers[0].prepare_steps_parallel * workers[0].team_shares == 0);  // one leads, the other helps

  const PixelImage alone = run_alone(f, p);
  REQUIRE(alone.data.size() == r.output.image.data.size());
  CHECK(outside_identical(alone, r.output.image, p.mask));
  int worst = 0;
  for (size_t i = 0; i < alone.data.size(); ++i)
    worst = std::max(worst, std::abs(int(alone.data[i]) - int(r.output.image.data[i])));
  CHECK(worst <= 3);
}

TEST_CASE("A prepare step takes no device that is serving a request of its own", "[flux2-serving][parallel]") {
  Flux2Serving f;
  // Worker 1 holds an edit whose steps are held by the seam; worker 0's prepare must run alone.
  StepHold hold(1);
  std::vector<RuntimeDevice> devices(2);
  for (RuntimeDevice& d : devices) d.models = {ServedModel{f.model, fixed_cost_model()}};
  RuntimeOptions o;
  o.worker.before_step = hold.seam();
  auto made = ServingRuntime::create(std::move(devices), f.store, std::move(o));
  REQUIRE(made.ok());
  auto& rt = **made;
  if (!rt.team_status().ok()) {
    REQUIRE_THAT(rt.team_status().message(), Catch::Contains("no Gloo"));
    std::exit(4);
  }
  // Edit 1 prepares its template (in parallel: both devices are idle), then steps, held.
  auto first = submit(rt, 1, f.tmpl, f.params("make the cup red", 7));
  REQUIRE(hold.wait_holding());
  const auto before = rt.worker_metrics();
  // Edit 2 on another template: its worker's prepare finds the other device busy.
  const auto& codec = *f.model->parts().codec;
  auto other = template_from_pixels(codec, codec.factor(), 0.0, 1.0, serving_picture(12), "other");
  REQUIRE(other.ok());
  auto second = submit(rt, 2, *other, f.params("a dark blue patch", 8));
  const RequestResult r2 = second.get();
  REQUIRE(r2.state == RequestState::kDone);
  const auto after = rt.worker_metrics();
  CHECK(total(after, &WorkerMetrics::prepare_steps) - total(before, &WorkerMetrics::prepare_steps) == 3);
  CHECK(total(after, &WorkerMetrics::prepare_steps_parallel) == total(before, &WorkerMetrics::prepare_steps_parallel));
  hold.release();
  CHECK(first.get().state == RequestState::kDone);
}

TEST_CASE("A full-recompute FLUX.2 edit steps in sequence parallel over two CPU devices and equals it on one",
          "[flux2-serving][parallel]") {
  Flux2Serving f;
  EditParams p = f.params("make the cup red", 9);
  p.cache = CacheMode::kOff;  // every token at every step: whole sequences
  auto one = f.runtime();
  const RequestResult alone = submit(*one, 1, f.tmpl, p).get();
  REQUIRE(alone.state == RequestState::kDone);
  CHECK(one->worker_metrics()[0].steps_parallel == 0);

  auto rt = two_cpu_devices(f);
  const RequestResult r = submit(*rt, 2, f.tmpl, p).get();
  INFO(r.status.to_string());
  REQUIRE(r.state == RequestState::kDone);
  const auto workers = rt->worker_metrics();
  CHECK(total(workers, &WorkerMetrics::steps_parallel) == 3);
  CHECK(total(workers, &WorkerMetrics::team_shares) == 3);
  CHECK(total(workers, &WorkerMetrics::prepare_steps) == 0);  // no cache entry is made or read
  REQUIRE(alone.output.image.data.size() == r.output.image.data.size());
  CHECK(outside_identical(alone.output.image, r.output.image, p.mask));
  int worst = 0;
  for (size_t i = 0; i < alone.output.image.data.size(); ++i)
    worst = std::max(worst, std::abs(int(alone.output.image.data[i]) - int(r.output.image.data[i])));
  CHECK(worst <= 1);  // float32 on both: the forwards agree to 1e-5
}

TEST_CASE("A guided FLUX.2 edit runs its two halves at once on two CPU devices and equals it on one",
          "[flux2-serving][parallel]") {
  Flux2Serving f;
  EditParams p = f.params("make the cup red", 10);
  p.guidance_scale = 3.0;  // classifier-free guidance: a prompted and a null-prompt half per step
  auto one = f.runtime();
  const RequestResult alone = submit(*one, 1, f.tmpl, p).get();
  REQUIRE(alone.state == RequestState::kDone);

  auto rt = two_cpu_devices(f);
  const RequestResult r = submit(*rt, 2, f.tmpl, p).get();
  INFO(r.status.to_string());
  REQUIRE(r.state == RequestState::kDone);
  CHECK(r.output.cache_mode == "template_keyed");
  const auto workers = rt->worker_metrics();
  // The store already holds the template's entry (the first runtime prepared it): the edit's
  // 3 steps, each with its halves split over the two devices, read the same entry.
  CHECK(total(workers, &WorkerMetrics::prepare_steps) == 0);
  CHECK(total(workers, &WorkerMetrics::steps_halves_split) == 3);
  CHECK(total(workers, &WorkerMetrics::steps_parallel) == 3);
  CHECK(total(workers, &WorkerMetrics::team_shares) == 3);
  REQUIRE(alone.output.image.data.size() == r.output.image.data.size());
  CHECK(outside_identical(alone.output.image, r.output.image, p.mask));
  int worst = 0;
  for (size_t i = 0; i < alone.output.image.data.size(); ++i)
    worst = std::max(worst, std::abs(int(alone.output.image.data[i]) - int(r.output.image.data[i])));
  CHECK(worst <= 1);  // one entry; each half's forward computed alone equals it packed to 1e-5
}

TEST_CASE("A large mask's steps run in sequence parallel over two CPU devices and a small mask's stay on one and both equal the edit on one device",
          "[flux2-serving][parallel]") {
  Flux2Serving f;
  // The template is 4 x 3 tokens of 16 pixels; no halo, so that the masks' tokens are exact:
  // 8 of 12 (two thirds) and 1 of 12.
  EditParams large = f.params("make the cup red", 11);
  large.mask = ServingFixture::rect_mask(0, 0, 64, 32);
  large.halo_tokens = 0;
  EditParams small = f.params("a dark blue patch", 12);
  small.mask = ServingFixture::rect_mask(16, 16, 16, 16);
  small.halo_tokens = 0;
  const PixelImage large_alone = run_alone(f, large), small_alone = run_alone(f, small);

  auto rt = two_cpu_devices(f);
  const RequestResult r = submit(*rt, 1, f.tmpl, large).get();
  INFO(r.status.to_string());
  REQUIRE(r.state == RequestState::kDone);
  CHECK(r.output.cache_mode == "template_keyed");  // masked steps, reading the prepared entry
  CHECK(r.output.masked_tokens == 8);
  CHECK(r.output.total_tokens == 12);
  auto workers = rt->worker_metrics();
  CHECK(total(workers, &WorkerMetrics::prepare_steps_parallel) == 3);
  CHECK(total(workers, &WorkerMetrics::steps_parallel) == 3);  // every masked step over both devices
  REQUIRE(large_alone.data.size() == r.output.image.data.size());
  CHECK(outside_identical(large_alone, r.output.image, large.mask));
  int worst = 0;
  for (size_t i = 0; i < large_alone.data.size(); ++i)
    worst = std::max(worst, std::abs(int(large_alone.data[i]) - int(r.output.image.data[i])));
  CHECK(worst <= 3);  // the shares attend in float32 over the entry widened from fp16 as one device does

  const RequestResult s = submit(*rt, 2, f.tmpl, small).get();
  REQUIRE(s.state == RequestState::kDone);
  CHECK(s.output.cache_mode == "template_keyed");
  CHECK(s.output.masked_tokens == 1);
  workers = rt->worker_metrics();
  CHECK(total(workers, &WorkerMetrics::steps_parallel) == 3);  // none more: the small mask stayed
  REQUIRE(small_alone.data.size() == s.output.image.data.size());
  CHECK(outside_identical(small_alone, s.output.image, small.mask));
  const bool same_bytes = small_alone.data == s.output.image.data;
  CHECK(same_bytes);  // the same forward on one device: equal bytes
}

namespace {

std::unique_ptr<ServingRuntime> cpu_devices(const Flux2Serving& f, int count, RuntimeOptions o) {
  std::vector<RuntimeDevice> devices(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) {
    devices[static_cast<size_t>(i)].models = {ServedModel{f.model, fixed_cost_model()}};
    devices[static_cast<size_t>(i)].label = "cpu:" + std::to_string(i);
  }
  auto rt = ServingRuntime::create(std::move(devices), f.store, std::move(o));
  REQUIRE(rt.ok());
  const Status team = (*rt)->team_status();
  if (!team.ok() && team.message().find("no Gloo") != std::string::npos) {
    std::fprintf(stderr, "SKIPPED: %s\n", team.message().c_str());
    std::exit(4);
  }
  REQUIRE(team.ok());
  return std::move(*rt);
}

}  // namespace

TEST_CASE("With three CPU devices, one serving an edit, a prepare runs over the other two", "[flux2-serving][parallel]") {
  // Three devices make no aligned group of two: the lease the planner gives (the asker and
  // the one idle device) gets a process group made when first named.
  Flux2Serving f;
  StepHold hold(1);
  RuntimeOptions o;
  o.team_link = TeamLink{0.0, 1e12, 2};
  o.team_planning.learn = false;
  o.worker.before_step = hold.seam();
  auto rt = cpu_devices(f, 3, std::move(o));
  auto first = submit(*rt, 1, f.tmpl, f.params("make the cup red", 7));
  REQUIRE(hold.wait_holding());
  const auto before = rt->worker_metrics();
  const auto& codec = *f.model->parts().codec;
  auto other = template_from_pixels(codec, codec.factor(), 0.0, 1.0, serving_picture(12), "other");
  REQUIRE(other.ok());
  const RequestResult r2 = submit(*rt, 2, *other, f.params("a dark blue patch", 8)).get();
  REQUIRE(r2.state == RequestState::kDone);
  const auto after = rt->worker_metrics();
  CHECK(total(after, &WorkerMetrics::prepare_steps) - total(before, &WorkerMetrics::prepare_steps) == 3);
  CHECK(total(after, &WorkerMetrics::prepare_steps_parallel) - total(before, &WorkerMetrics::prepare_steps_parallel) == 3);
  const auto team = rt->team_metrics();
  REQUIRE(team.has_value());
  // Edit 1's prepare shared with one device too (the model has 2 heads), then edit 2's
  // with the third: two pairs, neither an aligned group (three devices have only the trio).
  CHECK(team->groups_made_later == 2);
  CHECK(team->groups == 3);
  CHECK(team->group_failures == 0);
  REQUIRE(team->planner.by_degree.count(2) == 1);
  CHECK(team->planner.by_degree.at(2) >= 3);
  hold.release();
  CHECK(first.get().state == RequestState::kDone);
}

TEST_CASE("On four CPU devices a guided edit's halves each run in sequence parallel over two and equal it on one",
          "[flux2-serving][parallel]") {
  // xDiT's CFG parallelism times Ulysses: the prompted half over two devices, the null-prompt
  // half over the other two, at once (the tiny model's 2 heads allow degree 2 at most, so
  // this is the fastest the planner can find on four idle devices).
  Flux2Serving f;
  EditParams p = f.params("make the cup red", 13);
  p.guidance_scale = 3.0;
  for (bool cached : {false, true}) {  // a full recompute's halves, then masked halves on the entry
    INFO((cached ? "masked halves" : "full halves"));
    p.cache = cached ? CacheMode::kUse : CacheMode::kOff;
    auto one = f.runtime();
    const RequestResult alone = submit(*one, 1, f.tmpl, p).get();
    REQUIRE(alone.state == RequestState::kDone);
    RuntimeOptions o;
    o.team_link = TeamLink{0.0, 1e12, 2};
    o.team_planning.learn = false;
    auto rt = cpu_devices(f, 4, std::move(o));
    const RequestResult r = submit(*rt, 2, f.tmpl, p).get();
    INFO(r.status.to_string());
    REQUIRE(r.state == RequestState::kDone);
    CHECK(r.output.cache_mode == (cached ? "template_keyed" : "off"));
    const auto workers = rt->worker_metrics();
    CHECK(total(workers, &WorkerMetrics::steps_halves_split) == 3);
    CHECK(total(workers, &WorkerMetrics::team_shares) == 3 * 3);  // three helpers a step
    const auto team = rt->team_metrics();
    REQUIRE(team.has_value());
    CHECK(team->planner.split == 3);
    CHECK(team->planner.by_degree.count(2) == 1);
    CHECK(team->group_failures == 0);
    REQUIRE(alone.output.image.data.size() == r.output.image.data.size());
    CHECK(outside_identical(alone.output.image, r.output.image, p.mask));
    int worst = 0;
    for (size_t i = 0; i < alone.output.image.data.size(); ++i)
      worst = std::max(worst, std::abs(int(alone.output.image.data[i]) - int(r.output.image.data[i])));
    CHECK(worst <= 3);
  }
}

TEST_CASE("A link the planner predicts too slow keeps every step of a prepare on its own device",
          "[flux2-serving][parallel]") {
  Flux2Serving f;
  RuntimeOptions o;
  o.team_link = TeamLink{1e6, 1e12, 2};  // a second per all-to-all
  o.team_planning.learn = false;
  auto rt = cpu_devices(f, 2, std::move(o));
  const RequestResult r = submit(*rt, 1, f.tmpl, f.params("make the cup red", 7)).get();
  REQUIRE(r.state == RequestState::kDone);
  const auto workers = rt->worker_metrics();
  CHECK(total(workers, &WorkerMetrics::prepare_steps) == 3);
  CHECK(total(workers, &WorkerMetrics::prepare_steps_parallel) == 0);
  CHECK(total(workers, &WorkerMetrics::team_shares) == 0);
  const auto team = rt->team_metrics();
  REQUIRE(team.has_value());
  // The prepare's three steps and the edit's three masked ones (a large mask) asked.
  CHECK(team->planner.decisions == 6);
  CHECK(team->planner.alone == 6);
  CHECK(team->planner.by_degree.at(1) == 6);
  CHECK(total(workers, &WorkerMetrics::steps_parallel) == 0);
  CHECK(team->groups_made_later == 0);
}

TEST_CASE("Mixed edits at once on four CPU devices shared wherever a device is idle all finish as on one device",
          "[flux2-serving][parallel]") {
  // Prepares of two templates, full recomputes and guided edits arrive together: the leaders
  // ask the planner, told that sharing is free (with the loopback link's guess it keeps these
  // tiny steps alone), leases cross, helpers run shares between their own steps. Nothing may
  // hang or be lost, and each edit equals the same edit on one device (outside the mask byte
  // for byte).
  Flux2Serving f;
  const auto& codec = *f.model->parts().codec;
  auto other = template_from_pixels(codec, codec.factor(), 0.0, 1.0, serving_picture(12), "other");
  REQUIRE(other.ok());
  struct Edit {
    std::shared_ptr<const TemplateImage> tmpl;
    EditParams params;
  };
  std::vector<Edit> edits;
  // Five edits for four devices: while the first ones prepare, others are still idle.
  for (int i = 0; i < 5; ++i) {
    EditParams p = f.params(i % 2 == 0 ? "make the cup red" : "a dark blue patch", 20 + i);
    if (i % 4 == 1) p.cache = CacheMode::kOff;
    if (i % 4 == 2) p.guidance_scale = 3.0;
    edits.push_back({i < 3 ? f.tmpl : *other, p});
  }
  std::vector<RequestResult> alone;
  {
    auto one = f.runtime();
    for (size_t i = 0; i < edits.size(); ++i) alone.push_back(submit(*one, 100 + i, edits[i].tmpl, edits[i].params).get());
  }
  // A store of its own, so that the four devices prepare the templates again.
  f.store = test::ServingFixture::new_store();
  RuntimeOptions o;
  o.team_link = TeamLink{0.0, 1e12, 2};
  o.team_planning.learn = false;
  auto rt = cpu_devices(f, 4, std::move(o));
  std::vector<std::future<RequestResult>> running;
  for (size_t i = 0; i < edits.size(); ++i) running.push_back(submit(*rt, 1 + i, edits[i].tmpl, edits[i].params));
  for (size_t i = 0; i < edits.size(); ++i) {
    const RequestResult r = running[i].get();
    INFO("edit " << i << ": " << r.status.to_string());
    REQUIRE(r.state == RequestState::kDone);
    REQUIRE(alone[i].state == RequestState::kDone);
    REQUIRE(r.output.image.data.size() == alone[i].output.image.data.size());
    CHECK(outside_identical(alone[i].output.image, r.output.image, edits[i].params.mask));
  }
  CHECK(rt->team_status().ok());
  const auto team = rt->team_metrics();
  REQUIRE(team.has_value());
  CHECK(team->planner.decisions > 0);
  CHECK(team->group_failures == 0);
  CHECK(team->planner.last_error.empty());
}

namespace {

// A step cost model predicting `ms_per_row` per row of a step (plus 1 ms), whatever this
// machine's speed.
std::shared_ptr<const StepCostModel> cost_per_row(double ms_per_row) {
  std::vector<StepSample> samples;
  for (double t : {4.0, 16.0, 64.0})
    for (double b : {1.0, 2.0, 4.0})
      for (double a : {50.0, 500.0, 4000.0}) samples.push_back({t, b, a, 1.0 + ms_per_row * t});
  auto fitted = StepCostModel::fit(samples);
  REQUIRE(fitted.ok());
  return std::make_shared<const StepCostModel>(*fitted);
}

// Two full recomputes of 6 steps on two CPU devices: an urgent edit (2) on worker 0, whose
// device's cost model predicts ten seconds per row of a step (two minutes a step), late alone and on time over both
// devices; and a slack one (1) with a day to go on worker 1, whose cost model predicts
// `slack_ms_per_row`: it can wait a round and still finish alone. The predictions hold the
// deadlines whatever this machine's speed. The seam orders the asks:
// the slack edit steps once alone, the urgent one asks (its plan has the slack one wait, but
// the slack one's device is in its step), the slack one asks and is held, and only then the
// urgent one steps again, now over both devices.
struct SlackAndUrgent {
  EditParams urgent_params, slack_params;
  RequestResult urgent, slack;
  std::vector<WorkerMetrics> workers;
  DeviceTeamMetrics team;
  bool order_kept = true;
};

SlackAndUrgent slack_and_urgent(const Flux2Serving& f, double slack_ms_per_row) {
  SlackAndUrgent out;
  EditParams& p = out.urgent_params;
  p = f.params("make the cup red", 31);
  p.cache = CacheMode::kOff;
  p.schedule.steps = 6;
  auto probe = f.model->create_session(f.tmpl, p, nullptr, nullptr);
  REQUIRE(probe.ok());
  const double rows = double((*probe)->tokens().count());
  const auto cost = cost_per_row(10000.0);
  const double alone_ms = cost->predict_ms(rows, 1.0, rows * rows);
  REQUIRE(alone_ms == Approx(1.0 + 10000.0 * rows).epsilon(1e-3));
  const double slack_deadline_ms = 86400.0 * 1000;  // a day
  REQUIRE(6 * (1.0 + slack_ms_per_row * rows) < 0.5 * slack_deadline_ms);  // on time alone with room to wait

  std::mutex mu;
  std::condition_variable cv;
  bool urgent_go = false, slack_go = false;
  int urgent_steps = 0, slack_steps = 0;
  ServingRuntime* runtime = nullptr;
  const auto planner = [&]() { return runtime->team_metrics().value().planner; };
  // Waits for a condition the other worker's progress makes true (polled: the team's
  // metrics have no event to wait on), at most five minutes.
  const auto await = [&](const std::function<bool()>& ready) {
    for (int i = 0; i < 30000 && !ready(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return ready();
  };
  std::atomic<bool> order_kept{true};
  RuntimeOptions o;
  o.team_link = TeamLink{0.0, 1e12, 2};
  o.team_planning.learn = false;
  o.worker.scheduler.allow_step_reduction = false;  // the urgent edit runs its 6 steps, late or not
  // The urgent edit to worker 0, the slack one to worker 1, whatever their cost models say.
  o.routing = RoutingPolicy::kLeastRequests;
  o.worker.before_step = [&](std::span<const uint64_t> ids) {
    if (ids.empty()) return;
    std::unique_lock lock(mu);
    if (ids[0] == 2) {
      ++urgent_steps;
      cv.notify_all();
      if (urgent_steps == 1) cv.wait(lock, [&] { return urgent_go; });
      if (urgent_steps == 2) {
        lock.unlock();
        if (!await([&] { return planner().held >= 1; })) order_kept = false;
      }
    } else if (ids[0] == 1) {
      ++slack_steps;
      cv.notify_all();
      if (slack_steps == 2) cv.wait(lock, [&] { return slack_go; });
    }
  };
  std::vector<RuntimeDevice> devices(2);
  devices[0].models = {ServedModel{f.model, cost}};
  devices[1].models = {ServedModel{f.model, cost_per_row(slack_ms_per_row)}};
  auto made = ServingRuntime::create(std::move(devices), f.store, std::move(o));
  REQUIRE(made.ok());
  runtime = made->get();
  if (!runtime->team_status().ok()) {
    REQUIRE_THAT(runtime->team_status().message(), Catch::Contains("no Gloo"));
    std::exit(4);
  }
  auto urgent = submit(*runtime, 2, f.tmpl, p, RequestClass::kInteractive, 4 * alone_ms);
  {
    std::unique_lock lock(mu);
    REQUIRE(cv.wait_for(lock, std::chrono::seconds(300), [&] { return urgent_steps == 1; }));
  }
  out.slack_params = f.params("a dark blue patch", 32);
  out.slack_params.cache = CacheMode::kOff;
  out.slack_params.schedule.steps = 6;
  auto slack = submit(*runtime, 1, f.tmpl, out.slack_params, RequestClass::kBatch, slack_deadline_ms);
  {
    std::unique_lock lock(mu);
    REQUIRE(cv.wait_for(lock, std::chrono::seconds(300), [&] { return slack_steps == 2; }));
    urgent_go = true;
  }
  cv.notify_all();
  REQUIRE(await([&] { return planner().decisions >= 2; }));  // the slack edit's first, the urgent one's
  {
    std::lock_guard lock(mu);
    slack_go = true;
  }
  cv.notify_all();
  out.urgent = urgent.get();
  out.slack = slack.get();
  out.order_kept = order_kept;
  out.workers = runtime->worker_metrics();
  uint64_t routed_to_0 = 0;
  for (const auto& [reason, count] : out.workers[0].routed) routed_to_0 += count;
  REQUIRE(routed_to_0 == 1);  // the urgent edit alone
  out.team = runtime->team_metrics().value();
  return out;
}

// Both edits equal the same edits on one device: outside the mask byte for byte, inside
// within one 8-bit level.
void check_equal_to_one_device(const Flux2Serving& f, const SlackAndUrgent& run) {
  INFO(run.urgent.status.to_string() << " / " << run.slack.status.to_string());
  REQUIRE(run.urgent.state == RequestState::kDone);
  REQUIRE(run.slack.state == RequestState::kDone);
  auto one = f.runtime();
  const RequestResult u1 = submit(*one, 3, f.tmpl, run.urgent_params).get();
  const RequestResult s1 = submit(*one, 4, f.tmpl, run.slack_params).get();
  REQUIRE(u1.state == RequestState::kDone);
  REQUIRE(s1.state == RequestState::kDone);
  CHECK(outside_identical(u1.output.image, run.urgent.output.image, run.urgent_params.mask));
  CHECK(outside_identical(s1.output.image, run.slack.output.image, run.slack_params.mask));
  int worst = 0;
  for (size_t i = 0; i < u1.output.image.data.size(); ++i)
    worst = std::max(worst, std::abs(int(u1.output.image.data[i]) - int(run.urgent.output.image.data[i])));
  CHECK(worst <= 1);
}

}  // namespace

TEST_CASE("A slack edit holds its steps back while its device serves an urgent edit that needs both and both equal the edit on one device",
          "[flux2-serving][parallel]") {
  // The slack edit's step is predicted at ten times the urgent one's: waiting for it would end
  // the urgent one's step later than running alone however long the seams below take, so that
  // step runs alone.
  Flux2Serving f;
  const SlackAndUrgent run = slack_and_urgent(f, 100000.0);
  CHECK(run.order_kept);
  CHECK(run.team.planner.held >= 1);
  CHECK(run.team.planner.awaited == 0);
  CHECK(run.team.planner.short_of_plan >= 1);
  CHECK(run.workers[1].team_holds >= 1);  // the slack edit held back ...
  CHECK(run.workers[0].team_holds == 0);
  CHECK(run.workers[0].steps_parallel >= 1);  // ... while the urgent one ran over both devices
  CHECK(run.workers[1].team_shares >= 1);
  CHECK(run.workers[0].steps + run.workers[1].steps == 12);  // every step ran once; a hold is none
  check_equal_to_one_device(f, run);
}

TEST_CASE("An urgent edit waits for the step its plan takes a device from and the team wakes it when the slack edit yields",
          "[flux2-serving][parallel]") {
  // The slack edit's step is predicted at 0.3 of the urgent one's: waiting for what is left of
  // it and then running over both devices ends the urgent step sooner than running alone, so
  // the urgent edit's first step is held (its device kept), for up to half a minute by the
  // prediction (a step past its predicted end would not be waited for: the margin keeps this
  // so on a loaded machine). The slack edit's next ask is held (it yields its device) and the
  // team wakes the urgent edit then, long before its hold would end.
  Flux2Serving f;
  const SlackAndUrgent run = slack_and_urgent(f, 3000.0);
  CHECK(run.order_kept);
  CHECK(run.team.planner.awaited >= 1);
  CHECK(run.team.wakes >= 1);
  CHECK(run.team.planner.held >= 1);
  CHECK(run.workers[0].team_holds >= 1);  // the urgent edit's wait
  CHECK(run.workers[1].team_holds >= 1);  // the slack edit's yield
  CHECK(run.workers[0].steps_parallel >= 1);
  CHECK(run.workers[1].team_shares >= 1);
  CHECK(run.workers[0].steps + run.workers[1].steps == 12);
  check_equal_to_one_device(f, run);
}
