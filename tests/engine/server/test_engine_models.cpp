// An infill-engine process serving two models: the bundled infill-tiny (the default) and the
// build's random model. /v1/models lists both, an edit naming the second runs on it (its
// status and events say so), one worker's step loop runs the edits of both (/v1/metrics), an
// unknown model is 400 naming it, and a journaled batch edit resumes on its own model after
// SIGKILL, or fails clearly when that model is gone.
#include "support/catch.h"

#include <filesystem>
#include <set>

#include "engine_process.h"
#include "server_fixture.h"

using namespace infill;
using namespace infill::test;

namespace {

// Both are built with the suite (tests/CMakeLists.txt): missing means a broken build, a failure.
// The engine and the build's random model, both built with the suite.
std::string require_binaries() {
  const std::string bin = required_engine_binary();
  INFO("the build's random model is not at " << build_random_model() << "; build the infill_random_model target");
  REQUIRE(std::filesystem::exists(build_random_model() + "/manifest.json"));
  return bin;
}

}  // namespace

TEST_CASE("infill-engine with two models: lists both, an edit picks one, one step loop runs both, an unknown model is 400",
          "[server][process][models]") {
  const std::string bin = require_binaries();
  TempDir dir("infill-models");
  const std::string tiny = std::string(INFILL_SOURCE_DIR) + "/resources/models/infill-tiny";
  const std::string sock = dir.file("run/engine.sock");
  pid_t pid = spawn({bin, "--model", tiny, "--model", build_random_model(), "--socket", sock, "--no-calibrate", "--threads",
                     "1", "--journal", "off"},
                    dir.file("engine.log"));
  ReapOnExit reap{pid};
  REQUIRE(wait_healthy(sock, 60000));
  const Endpoint ep{sock, 0};

  Response models = request(ep, "GET", "/v1/models");
  REQUIRE(models.status == 200);
  const auto list = models.json()["models"];
  REQUIRE(list.size() == 2);
  const std::string tiny_id = list[0]["id"], random_id = list[1]["id"];
  CHECK(list[0]["name"] == "infill-tiny");
  CHECK(list[0]["default"] == true);
  CHECK(list[1]["default"] == false);
  CHECK(tiny_id != random_id);
  Response health = request(ep, "GET", "/health");
  CHECK(health.json()["model"] == tiny_id);
  CHECK(health.json()["models"].size() == 2);

  Response t = request(ep, "POST", "/v1/templates?name=picture.png", png_string(serving_picture(0)), {"Content-Type: image/png"});
  REQUIRE(t.status == 201);
  const std::string tmpl = t.json()["id"];

  // On the second model: the reply, the status and the result say so.
  nlohmann::json p = {{"template", tmpl}, {"mask_rect", {8, 8, 24, 16}}, {"seed", 3}, {"steps", 4}, {"model", random_id}};
  Response r = request(ep, "POST", "/v1/edits", p.dump(), {"Content-Type: application/json"});
  REQUIRE(r.status == 202);
  CHECK(r.json()["model"] == random_id);
  const nlohmann::json on_random = wait_edit(ep, r.json()["id"].get<uint64_t>(), 60000);
  INFO(on_random.dump());
  CHECK(on_random["state"] == "done");
  CHECK(on_random["model"] == random_id);
  Response png = request(ep, "GET", "/v1/edits/" + std::to_string(r.json()["id"].get<uint64_t>()) + "/result");
  CHECK(png.status == 200);
  auto img = decode_image(bytes_of(png.body), "result", 1 << 20);
  REQUIRE(img.ok());
  CHECK(img->width == 64);

  // Without "model": the default.
  p.erase("model");
  Response d = request(ep, "POST", "/v1/edits", p.dump(), {"Content-Type: application/json"});
  REQUIRE(d.status == 202);
  const nlohmann::json on_default = wait_edit(ep, d.json()["id"].get<uint64_t>(), 60000);
  CHECK(on_default["state"] == "done");
  CHECK(on_default["model"] == tiny_id);

  // The same seed and mask on two models: two different results.
  Response png_default = request(ep, "GET", "/v1/edits/" + std::to_string(d.json()["id"].get<uint64_t>()) + "/result");
  CHECK(png_default.body != png.body);

  // One step loop on the one device ran the edits of both models.
  Response metrics = request(ep, "GET", "/v1/metrics");
  REQUIRE(metrics.status == 200);
  const nlohmann::json workers = metrics.json()["workers"];
  INFO(workers.dump());
  REQUIRE(workers.size() == 1);
  CHECK(workers[0]["device"] == "cpu");
  CHECK(workers[0]["models"] == nlohmann::json::array({tiny_id, random_id}));
  CHECK(workers[0]["steps_by_model"][tiny_id].get<int>() >= 4);
  CHECK(workers[0]["steps_by_model"][random_id].get<int>() >= 4);
  CHECK(workers[0]["steps"].get<int>() >= 8);  // the edits ran one after the other here
  CHECK(metrics.json()["loads"].size() == 1);

  // An unknown model: 400 naming it and the loaded ones.
  p["model"] = "no-such-model";
  Response bad = request(ep, "POST", "/v1/edits", p.dump(), {"Content-Type: application/json"});
  CHECK(bad.status == 400);
  INFO(bad.body);
  CHECK(bad.json()["error"]["code"] == "unknown_model");
  const std::string message = bad.json()["error"]["message"];
  CHECK(message.find("no-such-model") != std::string::npos);
  CHECK(message.find(tiny_id) != std::string::npos);
  CHECK(message.find(random_id) != std::string::npos);

  ::kill(pid, SIGTERM);
  CHECK(wait_exit(pid, 20000) == 0);
}

TEST_CASE("a journaled batch edit resumes on its own model, and fails clearly when that model is gone",
          "[server][process][journal][models]") {
  const std::string bin = require_binaries();
  c10::InferenceMode guard;
  TempDir dir("infill-models-journal");
  // A: a small random model, the default; B: the build's random model (another architecture,
  // so another id).
  REQUIRE(write_random_model(dir.file("model-a"), tiny_serving_dit(), 16, 42).ok());
  const std::string sock = dir.file("run/engine.sock");
  const std::vector<std::string> common = {"--socket", sock, "--no-calibrate", "--threads", "1",
                                           "--journal", dir.file("state/journal.sqlite")};
  auto args = [&](std::vector<std::string> models) {
    std::vector<std::string> a = {bin};
    for (const auto& m : models) a.insert(a.end(), {"--model", m});
    a.insert(a.end(), common.begin(), common.end());
    return a;
  };
  const Endpoint ep{sock, 0};
  pid_t pid = spawn(args({dir.file("model-a"), build_random_model()}), dir.file("engine1.log"));
  ReapOnExit reap{pid};
  REQUIRE(wait_healthy(sock, 60000));
  const auto list = request(ep, "GET", "/v1/models").json()["models"];
  REQUIRE(list.size() == 2);
  const std::string a_id = list[0]["id"], b_id = list[1]["id"];
  const std::string tmpl = request(ep, "POST", "/v1/templates?name=picture.png", png_string(serving_picture(0)),
                                   {"Content-Type: image/png"}).json()["id"];
  auto submit = [&](int n) {
    std::vector<uint64_t> ids;
    for (int i = 0; i < n; ++i) {
      nlohmann::json p = {{"template", tmpl}, {"mask_rect", {(8 * i) % 48, 8, 16, 16}}, {"seed", i}, {"steps", 60},
                          {"class", "batch"}, {"model", b_id}};
      Response r = request(ep, "POST", "/v1/edits", p.dump(), {"Content-Type: application/json", "X-Infill-Client: farm"});
      REQUIRE(r.status == 202);
      ids.push_back(r.json()["id"].get<uint64_t>());
    }
    return ids;
  };

  // Killed while its edits on B are queued; restarted with A still the default: every edit
  // ends on B, the model it named.
  const std::vector<uint64_t> first = submit(6);
  ::kill(pid, SIGKILL);
  CHECK(wait_exit(pid, 20000) == 128 + SIGKILL);
  pid = spawn(args({dir.file("model-a"), build_random_model()}), dir.file("engine2.log"));
  REQUIRE(wait_healthy(sock, 60000));
  for (uint64_t id : first) {
    const nlohmann::json j = wait_edit(ep, id, 120000);
    INFO("edit " << id << ": " << j.dump());
    CHECK(j["state"] == "done");
    CHECK(j["model"] == b_id);
  }

  // Killed again with edits on B in flight; restarted with A only: those edits fail, naming B.
  const std::vector<uint64_t> second = submit(6);
  ::kill(pid, SIGKILL);
  CHECK(wait_exit(pid, 20000) == 128 + SIGKILL);
  pid = spawn(args({dir.file("model-a")}), dir.file("engine3.log"));
  REQUIRE(wait_healthy(sock, 60000));
  int failed = 0;
  for (uint64_t id : second) {
    const nlohmann::json j = wait_edit(ep, id, 30000);
    INFO("edit " << id << ": " << j.dump());
    REQUIRE(j.contains("state"));
    if (j["state"] == "done") continue;  // finished before the kill
    CHECK(j["state"] == "failed");
    const std::string message = j["error"]["message"];
    CHECK(message.find(b_id) != std::string::npos);
    CHECK(message.find("does not serve") != std::string::npos);
    ++failed;
  }
  CHECK(failed >= 1);
  ::kill(pid, SIGTERM);
  CHECK(wait_exit(pid, 20000) == 0);
}
