// `infill-engine --check` (server/engine_check.h): the models load on every device as the
// engine's start loads them, each device is reported, and a device that cannot hold them fails
// the check naming it. In-process through the load fault seam, and the binary on the bundled
// models with `--device cpu,cpu` and a config that sets the device team.
#include "support/catch.h"

#include <fstream>
#include <iterator>

#include "engine_process.h"
#include "model/compute_device.h"
#include "server/engine_check.h"
#include "server_fixture.h"

using namespace infill;
using namespace infill::test;

namespace {

ServiceOptions two_cpu_devices(const TempDir& dir) {
  if (!write_random_model(dir.file("model"), tiny_serving_dit(), 16, 42).ok())
    throw std::runtime_error("model");
  ServiceOptions o;
  o.model_path = dir.file("model");
  o.device = "cpu,cpu";
  o.team_timeout_ms = 2500;
  return o;
}

std::string file_text(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace

TEST_CASE("the engine check loads the models on every device and reports each",
          "[server][check][devices]") {
  c10::InferenceMode guard;
  TempDir dir("infill-check");
  const ServiceOptions o = two_cpu_devices(dir);
  const EngineCheckReport report = check_engine(o);
  INFO(report.status.to_string());
  REQUIRE(report.status.ok());
  REQUIRE(report.models.size() == 1);
  CHECK(report.models[0].path == o.model_path);
  CHECK_FALSE(report.models[0].id.empty());
  REQUIRE(report.devices.size() == 2);
  CHECK(report.devices[0].device == "cpu:0");
  CHECK(report.devices[1].device == "cpu:1");
  CHECK(report.devices[0].ok());
  CHECK(report.devices[1].ok());
  // The CPU devices serve one copy of the models, as the engine's do; no GPU memory to show.
  CHECK(report.devices[0].shares_models_of.empty());
  CHECK(report.devices[1].shares_models_of == "cpu:0");
  CHECK_FALSE(report.devices[1].memory.has_value());
  REQUIRE(report.device_team.has_value());
  if (report.device_team->ok()) {
    CHECK(report.team_timeout_ms == 2500);  // the option reached the runtime
  } else {
    CHECK_THAT(report.device_team->message(), Catch::Contains("no Gloo"));
  }
  const nlohmann::json j = engine_check_json(report);
  INFO(j.dump());
  CHECK(j["ok"] == true);
  CHECK_FALSE(j.contains("error"));
  CHECK(j["devices"][1]["ok"] == true);
  CHECK(j["devices"][1]["shares_models_of"] == "cpu:0");

  ServiceOptions off = o;
  off.sequence_parallel = false;
  const EngineCheckReport no_team = check_engine(off);
  REQUIRE(no_team.status.ok());
  REQUIRE(no_team.device_team.has_value());
  CHECK(no_team.device_team->message() == "sequence parallelism is switched off");
  CHECK(engine_check_json(no_team)["device_team"] ==
        nlohmann::json({{"in_use", false}, {"why", "sequence parallelism is switched off"}}));
}

TEST_CASE("the engine check fails naming the device that cannot hold the models",
          "[server][check][devices]") {
  c10::InferenceMode guard;
  TempDir dir("infill-check");
  ServiceOptions o = two_cpu_devices(dir);

  SECTION("out of its memory: the engine would leave it out, the check fails") {
    o.before_load = [](const std::string& device, const std::string&) {
      return device == "cpu:1" ? Status(ErrorCode::kResourceExhausted,
                                        "CUDA out of memory. Tried to allocate 2.00 GiB.")
                               : Status();
    };
    const EngineCheckReport report = check_engine(o);
    INFO(report.status.to_string());
    REQUIRE_FALSE(report.status.ok());
    CHECK(report.status.message().rfind("cpu:1: CUDA out of memory", 0) == 0);
    CHECK_THAT(report.status.message(), Catch::Contains("would leave it out"));
    REQUIRE(report.devices.size() == 2);
    CHECK(report.devices[0].ok());
    CHECK_FALSE(report.devices[1].ok());
    CHECK(report.devices[1].checked);
    CHECK(report.devices[1].fault.rfind("cpu:1: CUDA out of memory", 0) == 0);
    const nlohmann::json j = engine_check_json(report);
    CHECK(j["ok"] == false);
    CHECK(j["error"] == report.status.message());
    CHECK(j["devices"][0]["ok"] == true);
    CHECK(j["devices"][1]["ok"] == false);
    CHECK(j["devices"][1]["fault"] == report.devices[1].fault);
  }
  SECTION("another error there: the check stops at that device") {
    o.device = "cpu,cpu,cpu";
    o.before_load = [](const std::string& device, const std::string&) {
      return device == "cpu:1" ? corrupt_data("weights.safetensors is truncated") : Status();
    };
    const EngineCheckReport report = check_engine(o);
    REQUIRE_FALSE(report.status.ok());
    CHECK(report.status.message() == "cpu:1: weights.safetensors is truncated");
    REQUIRE(report.devices.size() == 3);
    CHECK(report.devices[0].ok());
    CHECK(report.devices[1].fault == "cpu:1: weights.safetensors is truncated");
    CHECK_FALSE(report.devices[2].checked);
    CHECK(engine_check_json(report)["devices"][2]["checked"] == false);
  }
  SECTION("one device out of its memory is named too") {
    o.device = "cpu";
    o.before_load = [](const std::string&, const std::string&) {
      return Status(ErrorCode::kResourceExhausted,
                    "CUDA out of memory. Tried to allocate 2.00 GiB.");
    };
    const EngineCheckReport report = check_engine(o);
    REQUIRE_FALSE(report.status.ok());
    CHECK(report.status.message() == "cpu: CUDA out of memory. Tried to allocate 2.00 GiB.");
    REQUIRE(report.devices.size() == 1);
    CHECK(report.devices[0].fault == report.status.message());
  }
  SECTION("a device this machine lacks: the list is refused naming it") {
    const std::string missing = "cuda:" + std::to_string(cuda_device_count());
    o.device = "cpu," + missing;
    const EngineCheckReport report = check_engine(o);
    REQUIRE_FALSE(report.status.ok());
    CHECK(report.status.message().rfind(missing + ": ", 0) == 0);
    CHECK(report.devices.empty());
    CHECK(engine_check_json(report)["ok"] == false);
  }
}

TEST_CASE("infill-engine --check loads the bundled models on both devices of --device cpu,cpu",
          "[server][process][check][devices]") {
  const std::string bin = required_engine_binary();
  TempDir dir("infill-check");
  {
    std::ofstream(dir.file("engine.json"))
        << R"({"device_team_timeout_ms": 2500, "sequence_parallel": true})";
  }
  // No --model: the bundled models (infill-tiny-2, then infill-tiny), as an installed engine.
  const std::vector<std::string> args = {bin,
                                         "--config",
                                         dir.file("engine.json"),
                                         "--socket",
                                         dir.file("engine.sock"),
                                         "--no-calibrate",
                                         "--journal",
                                         "off",
                                         "--device",
                                         "cpu,cpu",
                                         "--check"};
  REQUIRE(wait_exit(spawn(args, dir.file("check.log")), 120000) == 0);
  const nlohmann::json summary = nlohmann::json::parse(file_text(dir.file("check.log.out")));
  INFO(summary.dump(2));
  CHECK(summary["ok"] == true);
  REQUIRE(summary["models"].size() == 2);
  CHECK(summary["models"][0]["family"] == "flux2");
  REQUIRE(summary["devices"].size() == 2);
  CHECK(summary["devices"][0]["device"] == "cpu:0");
  CHECK(summary["devices"][0]["ok"] == true);
  CHECK(summary["devices"][1]["device"] == "cpu:1");
  CHECK(summary["devices"][1]["ok"] == true);
  CHECK(summary["devices"][1]["shares_models_of"] == "cpu:0");
  // The config's timeout reached the device team (FLUX.2 on two CPU devices: Gloo).
  if (summary["device_team"]["in_use"] == true) {
    CHECK(summary["device_team"]["timeout_ms"] == 2500);
  } else {
    CHECK_THAT(summary["device_team"]["why"].get<std::string>(), Catch::Contains("no Gloo"));
  }

  // A device this machine lacks: exit 2, naming it, on stderr and in the summary.
  const std::string missing = "cuda:" + std::to_string(cuda_device_count());
  std::vector<std::string> bad = args;
  bad[9] = "cpu," + missing;
  CHECK(wait_exit(spawn(bad, dir.file("bad.log")), 120000) == 2);
  CHECK_THAT(file_text(dir.file("bad.log")), Catch::Contains(missing + ": "));
  const nlohmann::json failed = nlohmann::json::parse(file_text(dir.file("bad.log.out")));
  CHECK(failed["ok"] == false);
  CHECK(failed["error"].get<std::string>().rfind(missing + ": ", 0) == 0);

  // A timeout out of its range: exit 2 naming the key.
  { std::ofstream(dir.file("short.json")) << R"({"device_team_timeout_ms": 10})"; }
  std::vector<std::string> short_timeout = args;
  short_timeout[2] = dir.file("short.json");
  CHECK(wait_exit(spawn(short_timeout, dir.file("short.log")), 120000) == 2);
  CHECK_THAT(file_text(dir.file("short.log")),
             Catch::Contains("device_team_timeout_ms is 10, expected 1000..3600000 ms"));
}
