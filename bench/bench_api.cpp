// bench_api: the API's added latency per edit. Submits the same small edit (tiny random-weight
// model, 64x48 template, 4 steps) in-process (EngineService directly), over the Unix socket and
// over TCP on loopback, sequentially, and reports submit -> first event (queued) and
// submit -> done event, median and P99, as JSON on stdout.
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <iostream>
#include <mutex>

#include <nlohmann/json.hpp>

#include "common/blas_kernel.h"
#include "engine/server/http_test_client.h"
#include "engine/serving/serving_fixture.h"
#include "machine_info.h"
#include "server/engine_service.h"
#include "server/http_server.h"

using namespace infill;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

double ms_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }

json summary(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  auto q = [&](double p) { return v.empty() ? 0.0 : v[std::min(v.size() - 1, static_cast<size_t>(p * double(v.size() - 1) + 0.5))]; };
  return {{"median_ms", q(0.5)}, {"p99_ms", q(0.99)}, {"n", v.size()}};
}

}  // namespace

int main(int argc, char** argv) {
  infill::select_blas_kernel();  // first: before any GEMM (common/blas_kernel.h)
  const int n = argc > 1 ? std::max(1, std::atoi(argv[1])) : 200;
  c10::InferenceMode guard;
  test::TempDir dir("infill-bench-api");
  if (!write_random_model(dir.file("model"), test::tiny_serving_dit(), 16, 42).ok()) return 5;
  ServiceOptions o;
  o.model_path = dir.file("model");
  o.calibrate = false;
  o.ram_cache_bytes = 64 << 20;
  o.limits.max_queued_per_client = 1000;
  EngineService service(o);
  if (!service.load().ok()) return 5;
  auto png = encode_png(test::serving_picture(0));
  if (!png.ok()) return 5;
  const std::string template_png(reinterpret_cast<const char*>(png->data()), png->size());
  std::string tmpl;
  {
    std::mutex mu;
    std::condition_variable cv;
    bool got = false;
    service.create_template(template_png, "bench.png", [&](ApiReply r) {
      std::lock_guard lock(mu);
      tmpl = json::parse(r.body)["id"].get<std::string>();
      got = true;
      cv.notify_all();
    });
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return got; });
  }
  const json params = {{"template", tmpl}, {"mask_rect", {16, 16, 24, 16}}, {"steps", 4}, {"seed", 1}};

  // In-process: the service's own callbacks and event sink.
  std::vector<double> in_first, in_done;
  {
    std::mutex mu;
    std::condition_variable cv;
    Clock::time_point first, done;
    bool have_first = false, have_done = false;
    service.set_event_sink([&](const ServiceEvent& e) {
      std::lock_guard lock(mu);
      if (!have_first) {
        first = Clock::now();
        have_first = true;
      }
      if (e.type == "done" || e.type == "failed") {
        done = Clock::now();
        have_done = true;
      }
      cv.notify_all();
    });
    for (int i = 0; i < n + 1; ++i) {
      {
        std::lock_guard lock(mu);
        have_first = have_done = false;
      }
      const auto t0 = Clock::now();
      EditSubmission s;
      s.client = "bench";
      s.params = params;
      service.submit_edit(std::move(s), [](ApiReply) {});
      std::unique_lock lock(mu);
      cv.wait(lock, [&] { return have_done; });
      if (i == 0) continue;  // the first edit runs the template's prepare job
      in_first.push_back(ms_between(t0, first));
      in_done.push_back(ms_between(t0, done));
    }
    service.set_event_sink({});
  }

  HttpServerOptions h;
  h.socket_path = dir.file("run/engine.sock");
  h.tcp_host = "127.0.0.1";
  h.token = std::string(64, 'b');
  h.limits = o.limits;
  auto server = HttpServer::start(service, h);
  if (!server.ok()) return 5;
  auto over = [&](const test::Endpoint& ep, std::vector<std::string> headers, std::vector<double>& first,
                  std::vector<double>& done) {
    test::EventStream events(ep, "bench", headers);
    headers.push_back("Content-Type: application/json");
    headers.push_back("X-Infill-Client: bench");
    for (int i = 0; i < n; ++i) {
      const auto t0 = Clock::now();
      test::Response r = test::request(ep, "POST", "/v1/edits", params.dump(), headers);
      if (r.status != 202) continue;
      const uint64_t id = r.json()["id"].get<uint64_t>();
      bool seen_first = false;
      events.wait_for([&](const test::SseEvent& e) {
        if (e.data["id"] != id) return false;
        if (!seen_first) {
          seen_first = true;
          first.push_back(ms_between(t0, Clock::now()));
        }
        return e.type == "done" || e.type == "failed";
      }, 30000);
      done.push_back(ms_between(t0, Clock::now()));
    }
  };
  std::vector<double> unix_first, unix_done, tcp_first, tcp_done;
  over(test::Endpoint{h.socket_path, 0}, {}, unix_first, unix_done);
  over(test::Endpoint{"", (*server)->tcp_port()}, {"Authorization: Bearer " + h.token}, tcp_first, tcp_done);
  (*server)->stop();

  auto med = [](std::vector<double> v) { return summary(std::move(v))["median_ms"].get<double>(); };
  json out = {{"machine", bench::machine_info()},
              {"edits_per_path", n},
              {"model", "tiny random DiT (hidden 64, depth 2), 64x48 template, 4 steps"},
              {"in_process", {{"submit_to_first_event", summary(in_first)}, {"submit_to_done", summary(in_done)}}},
              {"unix_socket", {{"submit_to_first_event", summary(unix_first)}, {"submit_to_done", summary(unix_done)}}},
              {"tcp", {{"submit_to_first_event", summary(tcp_first)}, {"submit_to_done", summary(tcp_done)}}},
              {"added_ms_median", {{"unix_socket", med(unix_done) - med(in_done)}, {"tcp", med(tcp_done) - med(in_done)}}},
              {"note", "over HTTP the client is sequential: the first event is read from the SSE stream after the "
                       "POST reply, and each request opens its own connection (Connection: close)"}};
  std::cout << out.dump(2) << std::endl;
  return 0;
}
