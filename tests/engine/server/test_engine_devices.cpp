// An engine on two CPU devices (`device` "cpu,cpu": one worker each, each with its share of
// the cores): /health and /metrics per device; edits of one template go to the device holding
// its entry and the router's counters show it; a device taken out of service (the step fault
// seam throwing a sticky CUDA error) leaves the other serving with no edit lost; a device that
// cannot hold the model (the load seam saying out of memory) is left out, and with none left
// the start fails naming each.
#include "support/catch.h"
#include "support/prometheus_sample.h"

#include <cmath>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <set>
#include <span>
#include <stdexcept>

#include "engine_process.h"
#include "server_fixture.h"

using namespace infill;
using namespace infill::test;

namespace {

// The workers' before_step seam: holds a step that runs a held edit until released, then
// throws the sticky CUDA error for a poisoned one.
struct StepSeam {
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::set<uint64_t> hold, held, poison;
  };
  std::shared_ptr<State> s = std::make_shared<State>();

  std::function<void(std::span<const uint64_t>)> hook() const {
    return [s = s](std::span<const uint64_t> ids) {
      std::unique_lock lock(s->mu);
      for (uint64_t id : ids) {
        if (!s->hold.count(id)) continue;
        s->held.insert(id);
        s->cv.notify_all();
        s->cv.wait(lock, [&] { return !s->hold.count(id); });
      }
      for (uint64_t id : ids)
        if (s->poison.count(id))
          throw std::runtime_error("CUDA error: an illegal memory access was encountered");
    };
  }
  void set(std::set<uint64_t> hold, std::set<uint64_t> poison = {}) const {
    std::lock_guard lock(s->mu);
    s->hold = std::move(hold);
    s->poison = std::move(poison);
  }
  bool wait_held(uint64_t id) const {
    std::unique_lock lock(s->mu);
    return s->cv.wait_for(lock, std::chrono::seconds(120), [&] { return s->held.count(id) > 0; });
  }
  void release_all() const {
    std::lock_guard lock(s->mu);
    s->hold.clear();
    s->cv.notify_all();
  }
  struct Opener {
    const StepSeam* seam;
    ~Opener() { seam->release_all(); }
  };
};


uint64_t submit(const Endpoint& ep, const std::string& tmpl, const std::string& client = "painter",
                const std::string& cls = "interactive") {
  const nlohmann::json p = {
      {"template", tmpl}, {"mask_rect", {8, 8, 24, 20}}, {"steps", 4}, {"class", cls}};
  Response r = request(ep, "POST", "/v1/edits", p.dump(),
                       {"Content-Type: application/json", "X-Infill-Client: " + client});
  INFO(r.body);
  REQUIRE(r.status == 202);
  return r.json()["id"].get<uint64_t>();
}

// The worker an edit ran on, once it is done.
int done_on(const Endpoint& ep, uint64_t id) {
  const nlohmann::json s = wait_edit(ep, id, 120000);
  INFO(s.dump());
  REQUIRE(s["state"] == "done");
  return s["metrics"]["worker"].get<int>();
}

void two_cpu_devices(ServiceOptions& o) {
  o.device = "cpu,cpu";
  // The device team's settings as the config keys give them: shown in /v1/metrics.
  o.team_round_ms = 20;
  o.team_link = DeviceTeamLink{0.05, 25};
  o.team_masked_share = 0.6;
}

}  // namespace

TEST_CASE(
    "an engine on two CPU devices: health and metrics per device, template locality, a device out "
    "of service",
    "[server][devices]") {
  StepSeam seam;
  ServerFixture f(true, test_limits(), false, seam.hook(), {}, two_cpu_devices);
  StepSeam::Opener opener{&seam};
  const Endpoint& ep = f.unix_ep;

  Response health = request(ep, "GET", "/health");
  INFO(health.body);
  REQUIRE(health.status == 200);
  CHECK(health.json()["status"] == "ok");
  const nlohmann::json devices = health.json()["devices"];
  REQUIRE(devices.size() == 2);
  CHECK(devices[0] ==
        nlohmann::json({{"device", "cpu:0"}, {"in_service", true}, {"workers", {0}}}));
  CHECK(devices[1] ==
        nlohmann::json({{"device", "cpu:1"}, {"in_service", true}, {"workers", {1}}}));
  CHECK(health.json()["workers"][1]["device"] == "cpu:1");
  // Two devices make a device team (Gloo among CPU devices) unless this build has no Gloo.
  const nlohmann::json team = health.json()["device_team"];
  if (team["in_use"] != true) CHECK_THAT(team["why"].get<std::string>(), Catch::Contains("no Gloo"));

  const std::string a = f.upload();
  Response uploaded = request(ep, "POST", "/v1/templates?name=b.png",
                              png_string(serving_picture(37)), {"Content-Type: image/png"});
  REQUIRE(uploaded.status == 201);
  const std::string b = uploaded.json()["id"];

  // Edit 1 (template a) on worker 0, held at its first step; template b's first edit then
  // goes to the idle worker 1, which prepares b's entry.
  seam.set({1});
  REQUIRE(submit(ep, a) == 1);
  REQUIRE(seam.wait_held(1));
  const uint64_t first_b = submit(ep, b);
  CHECK(done_on(ep, first_b) == 1);
  seam.release_all();
  CHECK(done_on(ep, 1) == 0);

  // One after the other (ties): each template's edits on the device holding its entry.
  for (int i = 0; i < 2; ++i) {
    CHECK(done_on(ep, submit(ep, b)) == 1);
    CHECK(done_on(ep, submit(ep, a)) == 0);
  }
  Response prom = request(ep, "GET", "/metrics");
  REQUIRE(prom.status == 200);
  INFO(prom.body);
  CHECK(
      sample_value(
          prom.body,
          R"(infill_router_routed_total{device="cpu:1",worker="1",reason="template_locality"})") ==
      2);
  CHECK(
      sample_value(
          prom.body,
          R"(infill_router_routed_total{device="cpu:0",worker="0",reason="template_locality"})") ==
      2);
  CHECK(sample_value(prom.body, R"(infill_device_in_service{device="cpu:1"})") == 1);
  Response json_metrics = request(ep, "GET", "/v1/metrics");
  CHECK(json_metrics.json()["devices"].size() == 2);
  CHECK(json_metrics.json()["workers"][1]["routed"]["template_locality"] == 2);
  if (team["in_use"] == true) {
    const nlohmann::json planner = json_metrics.json()["device_team"];
    INFO(planner.dump());
    CHECK(planner["round_ms"] == 20);
    CHECK(planner["link"]["latency_ms"] == 0.05);
    CHECK(planner["link"]["gbytes_per_s"] == 25);
    CHECK(planner["link"]["bytes_per_element"] == 4);  // float32 among CPU devices
    CHECK(planner["masked_share"] == 0.6);
  }

  // A live painter's strokes stay on one device: its first (template b) on worker 1, the
  // next on worker 1 too, held there, while two more queue behind it; then worker 1's device
  // fails for good on the held stroke. That stroke fails naming the fault; the two queued
  // ones are handed to worker 0 and done there.
  const uint64_t stroke = submit(ep, b, "live-painter", "live");
  CHECK(done_on(ep, stroke) == 1);
  const uint64_t next_id = stroke + 1;
  seam.set({next_id}, {next_id});
  REQUIRE(submit(ep, b, "live-painter", "live") == next_id);
  REQUIRE(seam.wait_held(next_id));
  const uint64_t queued1 = submit(ep, b, "live-painter", "live"),
                 queued2 = submit(ep, a, "live-painter", "live");
  seam.release_all();
  const nlohmann::json failed = wait_edit(ep, next_id, 120000);
  INFO(failed.dump());
  CHECK(failed["state"] == "failed");
  CHECK(failed["error"]["message"].get<std::string>().find(
            "failed on cpu:1: CUDA error: an illegal memory access") != std::string::npos);
  CHECK(done_on(ep, queued1) == 0);
  CHECK(done_on(ep, queued2) == 0);

  Response degraded = request(ep, "GET", "/health");
  INFO(degraded.body);
  CHECK(degraded.status == 200);
  CHECK(degraded.json()["status"] == "degraded");
  CHECK(degraded.json()["devices"][0]["in_service"] == true);
  CHECK(degraded.json()["devices"][1]["in_service"] == false);
  CHECK(degraded.json()["devices"][1]["fault"].get<std::string>().find(
            "cpu:1 failed: CUDA error") != std::string::npos);
  // The other device serves on, template b's edits included.
  CHECK(done_on(ep, submit(ep, b)) == 0);
  const uint64_t last = submit(ep, b, "live-painter", "live");
  CHECK(done_on(ep, last) == 0);
  Response after = request(ep, "GET", "/metrics");
  INFO(after.body);
  CHECK(sample_value(after.body, R"(infill_device_in_service{device="cpu:1"})") == 0);
  CHECK(sample_value(after.body, R"(infill_worker_rerouted_total{device="cpu:1",worker="1"})") ==
        2);
  CHECK(sample_value(after.body,
                     R"(infill_router_locality_misses_total{device="cpu:1",worker="1"})") >= 1);
  // No edit lost: every edit submitted (ids 1..last) ended, all done but the one whose step
  // failed.
  CHECK(sample_value(after.body, R"(infill_edits_finished_total{state="failed"})") == 1);
  CHECK(sample_value(after.body, R"(infill_edits_finished_total{state="done"})") ==
        double(last - 1));
}

TEST_CASE(
    "a device that cannot hold the model is left out, and with none left the start fails naming "
    "each",
    "[server][devices]") {
  const Status oom(ErrorCode::kResourceExhausted,
                   "CUDA out of memory. Tried to allocate 2.00 GiB.");
  {
    ServerFixture f(true, test_limits(), false, {}, {}, [&](ServiceOptions& o) {
      o.device = "cpu,cpu";
      o.before_load = [&](const std::string& device, const std::string&) {
        return device == "cpu:1" ? oom : Status();
      };
    });
    Response health = request(f.unix_ep, "GET", "/health");
    INFO(health.body);
    CHECK(health.status == 200);
    CHECK(health.json()["status"] == "degraded");
    const nlohmann::json devices = health.json()["devices"];
    REQUIRE(devices.size() == 2);
    CHECK(devices[0]["in_service"] == true);
    CHECK(devices[1]["in_service"] == false);
    CHECK(devices[1]["workers"].empty());
    CHECK(devices[1]["fault"].get<std::string>().find("cpu:1: CUDA out of memory") !=
          std::string::npos);
    CHECK(health.json()["workers"].size() == 1);
    CHECK(done_on(f.unix_ep, submit(f.unix_ep, f.upload())) == 0);
    Response prom = request(f.unix_ep, "GET", "/metrics");
    CHECK(sample_value(prom.body, R"(infill_device_in_service{device="cpu:0"})") == 1);
    CHECK(sample_value(prom.body, R"(infill_device_in_service{device="cpu:1"})") == 0);
  }
  {
    ServerFixture f(false, test_limits(), false, {}, {}, [&](ServiceOptions& o) {
      o.device = "cpu,cpu";
      o.before_load = [&](const std::string&, const std::string&) { return oom; };
    });
    const Status st = f.service->load();
    INFO(st.to_string());
    CHECK_FALSE(st.ok());
    CHECK(st.message().find("no device could hold the models") != std::string::npos);
    CHECK(st.message().find("cpu:0: CUDA out of memory") != std::string::npos);
    CHECK(st.message().find("cpu:1: CUDA out of memory") != std::string::npos);
    CHECK(request(f.unix_ep, "GET", "/health").status == 503);
  }
  {
    // The model's own error is no device's: the start fails, naming where it was found.
    ServerFixture f(false, test_limits(), false, {}, {}, [&](ServiceOptions& o) {
      o.device = "cpu,cpu";
      o.before_load = [&](const std::string& device, const std::string&) {
        return device == "cpu:1" ? corrupt_data("weights.safetensors is truncated") : Status();
      };
    });
    const Status st = f.service->load();
    CHECK_FALSE(st.ok());
    CHECK(st.message().find("cpu:1: weights.safetensors is truncated") != std::string::npos);
  }
}

TEST_CASE("infill-engine --check lists the devices of --device cpu,cpu",
          "[server][process][devices]") {
  const std::string bin = required_engine_binary();
  TempDir dir("infill-devices");
  const std::vector<std::string> args = {bin,
                                         "--model",
                                         build_random_model(),
                                         "--socket",
                                         dir.file("engine.sock"),
                                         "--no-calibrate",
                                         "--journal",
                                         "off",
                                         "--device",
                                         "cpu,cpu",
                                         "--check"};
  REQUIRE(wait_exit(spawn(args, dir.file("check.log")), 60000) == 0);
  std::ifstream out(dir.file("check.log.out"));
  const nlohmann::json summary = nlohmann::json::parse(out);
  INFO(summary.dump());
  REQUIRE(summary["devices"].size() == 2);
  CHECK(summary["devices"][0]["device"] == "cpu:0");
  CHECK(summary["devices"][1]["device"] == "cpu:1");
  std::vector<std::string> bad = args;
  bad[9] = "cpu,,cpu";
  CHECK(wait_exit(spawn(bad, dir.file("bad.log")), 60000) == 2);
}
