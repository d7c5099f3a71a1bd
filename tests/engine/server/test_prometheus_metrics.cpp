// GET /metrics in the Prometheus text format, checked by Prometheus's own parser and linter
// (`promtool check metrics`, Debian's prometheus package) and against what the engine did.
#include "support/prometheus_sample.h"
#include <fstream>
#include <regex>

#include "server/prometheus_metrics.h"
#include "server_fixture.h"
#include "support/command_output.h"

using namespace infill;
using namespace infill::test;

namespace {

// promtool's verdict on an exposition: exit 0 means it parsed and passed the lint rules.
CommandOutput promtool_check(const TempDir& dir, const std::string& text) {
  const std::string path = dir.file("metrics.txt");
  std::ofstream(path, std::ios::binary) << text;
  return run_command("promtool check metrics < " + path + " 2>&1");
}


}  // namespace

TEST_CASE("the Prometheus text escapes label values and makes the step histogram cumulative", "[server][metrics]") {
  require_tool_or_skip("promtool", "prometheus");
  TempDir dir("infill-prom");
  ServiceMetrics m;
  ServiceWorkerMetrics w;
  w.models = {"m0"};
  w.worker.device = "odd \"device\" \\ name\nwith a newline";
  w.worker.index = 1;
  w.worker.steps = 3;
  w.worker.count_step_seconds(0.0005);  // first bucket (<= 1 ms)
  w.worker.count_step_seconds(0.03);    // <= 50 ms
  w.worker.count_step_seconds(60.0);    // beyond the last bound: +Inf only
  m.workers.push_back(w);
  m.loads.push_back({w.worker.device, 1, WorkerLoad{2, 1500.0}});
  m.edits_finished["done"] = 5;
  m.edits_by_state["running"] = 1;
  m.resident_bytes = 123456789;
  const std::string text = prometheus_metrics_text(m);
  INFO(text);
  const CommandOutput check = promtool_check(dir, text);
  INFO(check.output);
  REQUIRE(check.exit_code == 0);

  const std::string labels = R"(device="odd \"device\" \\ name\nwith a newline",worker="1")";
  CHECK(sample_value(text, "infill_step_duration_seconds_bucket{" + labels + ",le=\"0.001\"}") == 1);
  CHECK(sample_value(text, "infill_step_duration_seconds_bucket{" + labels + ",le=\"0.02\"}") == 1);
  CHECK(sample_value(text, "infill_step_duration_seconds_bucket{" + labels + ",le=\"0.05\"}") == 2);
  CHECK(sample_value(text, "infill_step_duration_seconds_bucket{" + labels + ",le=\"5\"}") == 2);
  CHECK(sample_value(text, "infill_step_duration_seconds_bucket{" + labels + ",le=\"+Inf\"}") == 3);
  CHECK(sample_value(text, "infill_step_duration_seconds_count{" + labels + "}") == 3);
  CHECK(sample_value(text, "infill_step_duration_seconds_sum{" + labels + "}") == Approx(60.0305));
  CHECK(sample_value(text, "infill_queue_requests{" + labels + "}") == 2);
  CHECK(sample_value(text, "infill_queue_backlog_seconds{" + labels + "}") == Approx(1.5));
  CHECK(sample_value(text, R"(infill_edits_finished_total{state="done"})") == 5);
  CHECK(sample_value(text, R"(infill_edits_finished_total{state="failed"})") == 0);
  CHECK(sample_value(text, R"(infill_edits{state="running"})") == 1);
  CHECK(sample_value(text, R"(infill_device_memory_bytes{device="cpu"})") == 123456789);

  // The checker is not a rubber stamp: an unescaped quote in a label value fails it.
  std::string broken = text;
  broken.replace(broken.find(R"(\"device\")"), 10, R"("device")");
  CHECK(promtool_check(dir, broken).exit_code != 0);
}

TEST_CASE("a GPU's memory is reported per device next to the CPU's resident set",
          "[server][metrics]") {
  require_tool_or_skip("promtool", "prometheus");
  ServiceMetrics m;
  m.resident_bytes = 5000;
  ServiceDevice gpu;
  gpu.device = "cuda:1";
  gpu.in_service = true;
  gpu.workers = {1};
  gpu.memory = DeviceMemory{3000, 4000, 6000, 10000};
  ServiceDevice cpu;  // a CPU device has no memory of its own: the resident set is its
  cpu.device = "cpu:0";
  cpu.in_service = true;
  cpu.workers = {0};
  m.devices = {cpu, gpu};
  const std::string text = prometheus_metrics_text(m);
  INFO(text);
  CHECK(sample_value(text, R"(infill_device_memory_bytes{device="cpu"})") == 5000);
  CHECK(sample_value(text, R"(infill_device_memory_bytes{device="cuda:1"})") == 4000);
  CHECK(sample_value(text, R"(infill_device_memory_allocated_bytes{device="cuda:1"})") == 3000);
  CHECK(sample_value(text, R"(infill_device_memory_free_bytes{device="cuda:1"})") == 6000);
  CHECK(sample_value(text, R"(infill_device_memory_total_bytes{device="cuda:1"})") == 10000);
  CHECK(text.find(R"(infill_device_memory_allocated_bytes{device="cpu:0"})") == std::string::npos);
  const nlohmann::json j = service_metrics_json(m);
  CHECK_FALSE(j["devices"][0].contains("memory"));
  CHECK(j["devices"][1]["memory"] == nlohmann::json({{"allocated_bytes", 3000},
                                                     {"reserved_bytes", 4000},
                                                     {"free_bytes", 6000},
                                                     {"total_bytes", 10000}}));
  // No resident set and no GPU: no device memory family at all.
  ServiceMetrics none;
  CHECK(prometheus_metrics_text(none).find("infill_device_memory") == std::string::npos);

  TempDir dir("infill-prom");
  const CommandOutput check = promtool_check(dir, text);
  INFO(check.output);
  CHECK(check.exit_code == 0);
}

TEST_CASE("GET /metrics after an edit: promtool accepts it and it counts the edit, its steps and the cache", "[server][metrics]") {
  require_tool_or_skip("promtool", "prometheus");
  ServerFixture f;
  const std::string tmpl = f.upload();
  EventStream events(f.unix_ep, "painter");
  Response sub = request(f.unix_ep, "POST", "/v1/edits",
                         R"({"template":")" + tmpl + R"(","mask_rect":[8,8,24,20],"seed":3,"steps":4})",
                         {"Content-Type: application/json", "X-Infill-Client: painter"});
  INFO(sub.body);
  REQUIRE(sub.status == 202);
  const uint64_t id = sub.json()["id"].get<uint64_t>();
  const auto& got = events.wait_for([&](const SseEvent& e) { return (e.type == "done" || e.type == "failed") && e.data["id"] == id; });
  REQUIRE(got.back().type == "done");

  Response r = request(f.unix_ep, "GET", "/metrics");
  REQUIRE(r.status == 200);
  CHECK(r.headers.at("content-type") == "text/plain; version=0.0.4; charset=utf-8");
  INFO(r.body);
  const CommandOutput check = promtool_check(f.dir, r.body);
  INFO(check.output);
  REQUIRE(check.exit_code == 0);

  const std::string model = request(f.unix_ep, "GET", "/v1/models").json()["models"][0]["id"].get<std::string>();
  const std::string worker = "device=\"cpu\",worker=\"0\"";
  CHECK(sample_value(r.body, "infill_edits_submitted_total") == 1);
  CHECK(sample_value(r.body, R"(infill_edits_finished_total{state="done"})") == 1);
  CHECK(sample_value(r.body, R"(infill_edits{state="done"})") == 1);
  CHECK(sample_value(r.body, "infill_live_edits") == 0);
  CHECK(sample_value(r.body, "infill_templates") == 1);
  const double steps = sample_value(r.body, "infill_worker_steps_total{" + worker + "}");
  CHECK(steps >= 4);
  CHECK(sample_value(r.body, "infill_worker_model_steps_total{" + worker + ",model=\"" + model + "\"}") == steps);
  // Every batched step lands in the histogram once.
  CHECK(sample_value(r.body, "infill_step_duration_seconds_count{" + worker + "}") == steps);
  CHECK(sample_value(r.body, "infill_step_duration_seconds_sum{" + worker + "}") > 0);
  CHECK(sample_value(r.body, "infill_queue_requests{" + worker + "}") == 0);
  // The prepare run stored the template's activations in the RAM tier.
  CHECK(sample_value(r.body, R"(infill_cache_entries{tier="ram"})") >= 1);
  CHECK(sample_value(r.body, R"(infill_cache_bytes{tier="ram"})") > 0);
  CHECK(sample_value(r.body, R"(infill_device_memory_bytes{device="cpu"})") > 1e6);

  // The same numbers as the JSON form.
  Response j = request(f.unix_ep, "GET", "/v1/metrics");
  REQUIRE(j.status == 200);
  CHECK(j.json()["workers"][0]["steps"].get<double>() >= steps);
  CHECK(j.json()["service"]["edits_finished"]["done"] == 1);
  CHECK(request(f.unix_ep, "POST", "/metrics").status == 405);
}

TEST_CASE("a GPU worker's step graphs and codec fallbacks are reported per model and a CPU worker's not at all",
          "[server][metrics]") {
  require_tool_or_skip("promtool", "prometheus");
  ServiceMetrics m;
  ServiceWorkerMetrics gpu;
  gpu.models = {"klein"};
  gpu.worker.device = "cuda:0";
  gpu.worker.index = 0;
  StepGraphStats graphs;
  graphs.graphs = 3;
  graphs.bytes = 700;
  graphs.budget_bytes = 2000;
  graphs.recorded = 4;
  graphs.replayed = 96;
  graphs.evicted = 1;
  graphs.eager_rounds = 7;
  graphs.failed_recordings = 1;
  graphs.last_failure = "t0+64/2577: CUDA out of memory";
  gpu.worker.step_graphs_by_model["klein"] = graphs;
  gpu.worker.codec_host_fallbacks_by_model["klein"] = 2;
  ServiceWorkerMetrics cpu;
  cpu.models = {"klein"};
  cpu.worker.device = "cpu";
  cpu.worker.index = 1;
  m.workers = {gpu, cpu};
  const std::string text = prometheus_metrics_text(m);
  INFO(text);
  const std::string labels = R"({device="cuda:0",worker="0",model="klein"})";
  CHECK(sample_value(text, "infill_step_graphs" + labels) == 3);
  CHECK(sample_value(text, "infill_step_graph_bytes" + labels) == 700);
  CHECK(sample_value(text, "infill_step_graph_budget_bytes" + labels) == 2000);
  CHECK(sample_value(text, "infill_step_graph_recorded_total" + labels) == 4);
  CHECK(sample_value(text, "infill_step_graph_replays_total" + labels) == 96);
  CHECK(sample_value(text, "infill_step_graph_evictions_total" + labels) == 1);
  CHECK(sample_value(text, "infill_step_graph_eager_rounds_total" + labels) == 7);
  CHECK(sample_value(text, "infill_step_graph_failed_recordings_total" + labels) == 1);
  CHECK(text.find(R"(infill_step_graphs{device="cpu")") == std::string::npos);
  CHECK(sample_value(text, "infill_codec_host_fallbacks_total" + labels) == 2);
  CHECK(text.find(R"(infill_codec_host_fallbacks_total{device="cpu")") == std::string::npos);
  const nlohmann::json j = service_metrics_json(m);
  CHECK(j["workers"][0]["step_graphs"]["klein"]["replayed"] == 96);
  CHECK(j["workers"][0]["step_graphs"]["klein"]["last_failure"] == "t0+64/2577: CUDA out of memory");
  CHECK(j["workers"][1]["step_graphs"].empty());
  CHECK(j["workers"][0]["codec_host_fallbacks"]["klein"] == 2);
  CHECK(j["workers"][1]["codec_host_fallbacks"].empty());

  TempDir dir("infill-prom");
  const CommandOutput check = promtool_check(dir, text);
  INFO(check.output);
  CHECK(check.exit_code == 0);
}

TEST_CASE("the device team's planner is reported: rounds, degrees, corrections and groups", "[server][metrics]") {
  require_tool_or_skip("promtool", "prometheus");
  ServiceMetrics m;
  DeviceTeamMetrics team;
  team.planner.rounds = 7;
  team.planner.decisions = 12;
  team.planner.alone = 5;
  team.planner.split = 2;
  team.planner.short_of_plan = 1;
  team.planner.held = 3;
  team.planner.awaited = 6;
  team.planner.by_degree = {{1, 5}, {2, 4}, {3, 3}};
  team.planner.correction = {{"d2", 1.75}, {"split", 0.5}};
  team.groups = 4;
  team.wakes = 2;
  team.groups_made_later = 1;
  team.group_failures = 0;
  m.team = team;
  const std::string text = prometheus_metrics_text(m);
  CHECK(sample_value(text, "infill_team_rounds_total") == 7);
  CHECK(sample_value(text, R"(infill_team_decisions_total{degree="3"})") == 3);
  CHECK(sample_value(text, R"(infill_team_step_correction{mode="d2"})") == 1.75);
  CHECK(sample_value(text, "infill_team_split_decisions_total") == 2);
  CHECK(sample_value(text, "infill_team_held_total") == 3);
  CHECK(sample_value(text, "infill_team_awaited_total") == 6);
  CHECK(sample_value(text, "infill_team_wakes_total") == 2);
  CHECK(sample_value(text, "infill_team_groups") == 4);
  const nlohmann::json j = service_metrics_json(m);
  CHECK(j["device_team"]["by_degree"]["2"] == 4);
  CHECK(j["device_team"]["correction"]["split"] == 0.5);
  CHECK(j["device_team"]["groups_made_later"] == 1);
  CHECK(j["device_team"]["awaited"] == 6);
  CHECK(j["device_team"]["wakes"] == 2);
  CHECK(j["device_team"]["held"] == 3);
  // Without a team: no family, and null in the JSON.
  ServiceMetrics none;
  CHECK(prometheus_metrics_text(none).find("infill_team_") == std::string::npos);
  CHECK(service_metrics_json(none)["device_team"].is_null());

  TempDir dir("infill-prom");
  const CommandOutput check = promtool_check(dir, text);
  INFO(check.output);
  CHECK(check.exit_code == 0);
}
