// The engine's HTTP API end to end: real sockets (a Unix socket in a temp dir and TCP on
// loopback), a real engine with a small random-weight model.
#include "support/catch.h"

#include <sys/stat.h>

#include <atomic>
#include <set>
#include <thread>

#include "server/multipart.h"
#include "server_fixture.h"
#include "support/step_gate.h"

using namespace infill;
using namespace infill::test;
using nlohmann::json;

namespace {

bool is_error_body(const Response& r, const std::string& code = "") {
  json j = r.json();
  if (!j.is_object() || !j.contains("error")) return false;
  const json& e = j["error"];
  if (!e.contains("code") || !e.contains("message") || !e.contains("type") || !e["message"].is_string()) return false;
  return code.empty() || e["code"] == code;
}

std::string message_of(const Response& r) { return r.json()["error"]["message"].get<std::string>(); }

uint64_t submit_rect(const ServerFixture& f, const Endpoint& ep, const std::string& tmpl, const std::string& client,
                     uint64_t seed, int steps = 4, std::vector<std::string> extra_headers = {}) {
  json p = {{"template", tmpl}, {"mask_rect", {16, 16, 24, 16}}, {"seed", seed}, {"steps", steps}};
  extra_headers.push_back("Content-Type: application/json");
  extra_headers.push_back("X-Infill-Client: " + client);
  Response r = request(ep, "POST", "/v1/edits", p.dump(), extra_headers);
  INFO(r.body);
  REQUIRE(r.status == 202);
  return r.json()["id"].get<uint64_t>();
}

}  // namespace

TEST_CASE("health answers 503 until the model is loaded, then 200", "[server]") {
  ServerFixture f(/*load=*/false);
  Response r = request(f.unix_ep, "GET", "/health");
  CHECK(r.status == 503);
  CHECK(is_error_body(r, "not_ready"));
  CHECK(r.headers.count("retry-after") == 1);
  // Other routes are not ready either, with the same error shape.
  Response m = request(f.unix_ep, "GET", "/v1/models");
  CHECK(m.status == 503);
  CHECK(is_error_body(m, "not_ready"));
  REQUIRE(f.service->load().ok());
  r = request(f.unix_ep, "GET", "/health");
  CHECK(r.status == 200);
  CHECK(r.json()["status"] == "ok");
  // /health needs no token on TCP.
  CHECK(request(f.tcp_ep, "GET", "/health").status == 200);
}

TEST_CASE("the Unix socket lives in a 0700 directory and the socket is 0600", "[server]") {
  ServerFixture f;
  struct stat st {};
  REQUIRE(::stat((f.dir.path() + "/run").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
  REQUIRE(::stat(f.unix_ep.unix_path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  // A second server on the same socket refuses to start while the first one answers.
  HttpServerOptions h;
  h.socket_path = f.unix_ep.unix_path;
  auto second = HttpServer::start(*f.service, h);
  CHECK_FALSE(second.ok());
}

TEST_CASE("upload, edit, events through done, result PNG keeps every pixel outside the mask", "[server]") {
  ServerFixture f;
  Response models = request(f.unix_ep, "GET", "/v1/models");
  REQUIRE(models.status == 200);
  CHECK(models.json()["models"].size() == 1);

  const std::string tmpl = f.upload();
  Response t = request(f.unix_ep, "GET", "/v1/templates/" + tmpl);
  REQUIRE(t.status == 200);
  CHECK(t.json()["width"] == 64);
  CHECK(t.json()["height"] == 48);
  CHECK(t.json()["state"] == "ready");

  EventStream events(f.unix_ep, "painter");
  CHECK(events.head().status == 200);
  CHECK(events.head().headers.at("content-type") == "text/event-stream");

  const PixelImage mask = rect_mask_image(64, 48, 8, 8, 24, 20);
  auto [ct, body] = multipart_body({{"template", "", "", tmpl},
                                    {"seed", "", "", "7"},
                                    {"steps", "", "", "4"},
                                    {"params", "", "application/json", R"({"preview_every_steps": 2, "class": "interactive"})"},
                                    {"mask", "mask.png", "image/png", png_string(mask)}});
  Response sub = request(f.unix_ep, "POST", "/v1/edits", body, {ct, "X-Infill-Client: painter"});
  INFO(sub.body);
  REQUIRE(sub.status == 202);
  const uint64_t id = sub.json()["id"].get<uint64_t>();

  const auto& got = events.wait_for([&](const SseEvent& e) {
    return (e.type == "done" || e.type == "failed") && e.data["id"] == id;
  });
  std::vector<std::string> types;
  for (const auto& e : got) {
    CHECK(e.data["id"] == id);
    CHECK(e.data["type"] == e.type);
    types.push_back(e.type);
  }
  REQUIRE(!types.empty());
  CHECK(types.front() == "queued");
  CHECK(types.back() == "done");
  CHECK(std::count(types.begin(), types.end(), "started") == 1);
  CHECK(std::count(types.begin(), types.end(), "progress") == 4);
  CHECK(std::count(types.begin(), types.end(), "preview") >= 1);
  for (const auto& e : got) {
    if (e.type != "preview") continue;
    auto png = base64_decode(e.data["png_base64"].get<std::string>());
    REQUIRE(png.ok());
    auto img = decode_image(std::as_bytes(std::span<const char>(png->data(), png->size())), "preview", 1 << 20);
    CHECK(img.ok());
  }

  Response status = request(f.unix_ep, "GET", "/v1/edits/" + std::to_string(id));
  REQUIRE(status.status == 200);
  CHECK(status.json()["state"] == "done");
  CHECK(status.json()["steps_done"] == 4);
  Response result = request(f.unix_ep, "GET", "/v1/edits/" + std::to_string(id) + "/result");
  REQUIRE(result.status == 200);
  CHECK(result.headers.at("content-type") == "image/png");
  auto out = decode_image(std::as_bytes(std::span<const char>(result.body.data(), result.body.size())), "result", 1 << 20);
  REQUIRE(out.ok());
  REQUIRE(out->width == 64);
  REQUIRE(out->height == 48);
  REQUIRE(out->channels == 3);
  const auto* a = reinterpret_cast<const uint8_t*>(out->data.data());
  const auto* b = reinterpret_cast<const uint8_t*>(f.picture.data.data());
  const auto* m = reinterpret_cast<const uint8_t*>(mask.data.data());
  int64_t kept = 0, differing_inside = 0;
  for (int i = 0; i < 64 * 48; ++i) {
    for (int c = 0; c < 3; ++c) {
      if (m[i] == 0) {
        REQUIRE(a[i * 3 + c] == b[i * 3 + c]);
        ++kept;
      } else {
        differing_inside += a[i * 3 + c] != b[i * 3 + c];
      }
    }
  }
  CHECK(kept == (64 * 48 - 24 * 20) * 3);
  CHECK(differing_inside > 0);
  // Accept: image/png on the edit itself gives the same bytes.
  Response same = request(f.unix_ep, "GET", "/v1/edits/" + std::to_string(id), "", {"Accept: image/png"});
  CHECK(same.body == result.body);
  // The template is prepared now.
  CHECK(request(f.unix_ep, "GET", "/v1/templates/" + tmpl).json()["state"] == "prepared");
  Response metrics = request(f.unix_ep, "GET", "/v1/metrics");
  REQUIRE(metrics.status == 200);
  CHECK(metrics.json()["workers"][0]["steps"].get<int>() >= 4);
}

TEST_CASE("on TCP every route except /health needs the bearer token", "[server][auth]") {
  ServerFixture f;
  const std::string tmpl = f.upload();
  const std::vector<std::pair<std::string, std::string>> routes = {
      {"GET", "/v1/models"},        {"GET", "/v1/metrics"},      {"GET", "/metrics"},      {"POST", "/v1/templates"},
      {"GET", "/v1/templates/" + tmpl}, {"POST", "/v1/edits"},  {"GET", "/v1/edits/1"},
      {"DELETE", "/v1/edits/1"},    {"GET", "/v1/edits/1/result"}, {"GET", "/v1/events"},
      {"GET", "/v1/nonexistent"}};
  for (const auto& [method, path] : routes) {
    INFO(method << " " << path);
    Response none = request(f.tcp_ep, method, path, "{}");
    CHECK(none.status == 401);
    CHECK(is_error_body(none, "unauthorized"));
    CHECK(none.headers.count("www-authenticate") == 1);
    Response wrong = request(f.tcp_ep, method, path, "{}", {"Authorization: Bearer " + std::string(64, 'x')});
    CHECK(wrong.status == 401);
    Response basic = request(f.tcp_ep, method, path, "{}", {"Authorization: Basic " + f.token});
    CHECK(basic.status == 401);
  }
  CHECK(request(f.tcp_ep, "GET", "/health").status == 200);
  CHECK(request(f.tcp_ep, "GET", "/v1/models", "", {f.auth()}).status == 200);
  CHECK(request(f.tcp_ep, "GET", "/v1/templates/" + tmpl, "", {f.auth()}).status == 200);
  // The Unix socket needs no token (its directory is private to the user).
  CHECK(request(f.unix_ep, "GET", "/v1/models").status == 200);
  // A full edit over TCP with the token.
  EventStream events(f.tcp_ep, "remote", {f.auth()});
  const uint64_t id = submit_rect(f, f.tcp_ep, tmpl, "remote", 3, 4, {f.auth()});
  events.wait_for([&](const SseEvent& e) { return e.type == "done" && e.data["id"] == id; });
  REQUIRE(!events.events().empty());
  CHECK(events.events().back().type == "done");
  CHECK(request(f.tcp_ep, "GET", "/v1/edits/" + std::to_string(id) + "/result", "", {f.auth()}).status == 200);
}

TEST_CASE("browser origins are refused", "[server][auth]") {
  ServerFixture f;
  Response r = request(f.unix_ep, "GET", "/v1/models", "", {"Origin: http://evil.example"});
  CHECK(r.status == 403);
  CHECK(is_error_body(r, "origin_not_allowed"));
  CHECK(message_of(r).find("http://evil.example") != std::string::npos);
  CHECK(request(f.tcp_ep, "GET", "/v1/models", "", {f.auth(), "Origin: null"}).status == 403);
}

TEST_CASE("malformed requests get a 4xx with a JSON error naming the input", "[server][errors]") {
  ServerFixture f;
  const std::string tmpl = f.upload();
  auto post_json = [&](const std::string& body) {
    return request(f.unix_ep, "POST", "/v1/edits", body, {"Content-Type: application/json"});
  };
  Response bad_json = post_json("{\"template\": ");
  CHECK(bad_json.status == 400);
  CHECK(is_error_body(bad_json, "invalid_json"));

  Response no_template = post_json(R"({"mask_rect": [0, 0, 8, 8]})");
  CHECK(no_template.status == 400);
  CHECK(message_of(no_template).find("template") != std::string::npos);

  Response unknown_template = post_json(R"({"template": "abc", "mask_rect": [0, 0, 8, 8]})");
  CHECK(unknown_template.status == 404);
  CHECK(is_error_body(unknown_template, "template_not_found"));

  Response unknown_key = post_json(json({{"template", tmpl}, {"mask_rect", {0, 0, 8, 8}}, {"sed", 1}}).dump());
  CHECK(unknown_key.status == 400);
  CHECK(message_of(unknown_key).find("sed") != std::string::npos);

  Response bad_type = post_json(json({{"template", tmpl}, {"mask_rect", {0, 0, 8, 8}}, {"steps", "many"}}).dump());
  CHECK(bad_type.status == 400);
  CHECK(message_of(bad_type).find("steps") != std::string::npos);

  Response bad_class = post_json(json({{"template", tmpl}, {"mask_rect", {0, 0, 8, 8}}, {"class", "urgent"}}).dump());
  CHECK(bad_class.status == 400);
  CHECK(message_of(bad_class).find("urgent") != std::string::npos);

  Response rect_outside = post_json(json({{"template", tmpl}, {"mask_rect", {60, 0, 8, 8}}}).dump());
  CHECK(rect_outside.status == 400);
  CHECK(is_error_body(rect_outside, "invalid_mask"));

  Response no_mask = post_json(json({{"template", tmpl}}).dump());
  CHECK(no_mask.status == 400);
  CHECK(is_error_body(no_mask, "invalid_mask"));

  // Mask of the wrong size.
  auto [ct, body] = multipart_body({{"template", "", "", tmpl},
                                    {"mask", "m.png", "image/png", png_string(rect_mask_image(63, 48, 0, 0, 8, 8))}});
  Response wrong_size = request(f.unix_ep, "POST", "/v1/edits", body, {ct});
  CHECK(wrong_size.status == 400);
  CHECK(message_of(wrong_size) == "mask is 63x48, template is 64x48");
  CHECK(is_error_body(wrong_size, "invalid_mask"));

  // A mask that is not an image.
  auto [ct2, body2] = multipart_body({{"template", "", "", tmpl}, {"mask", "m.png", "image/png", "not a png at all"}});
  Response garbage_mask = request(f.unix_ep, "POST", "/v1/edits", body2, {ct2});
  CHECK(garbage_mask.status == 400);
  CHECK(is_error_body(garbage_mask));
  Response bad_b64 = post_json(json({{"template", tmpl}, {"mask_png_base64", "!!!"}}).dump());
  CHECK(bad_b64.status == 400);

  // Multipart without a closing boundary.
  Response truncated = request(f.unix_ep, "POST", "/v1/edits", body.substr(0, body.size() / 2), {ct});
  CHECK(truncated.status == 400);
  CHECK(is_error_body(truncated, "invalid_multipart"));
  Response no_boundary = request(f.unix_ep, "POST", "/v1/edits", "x", {"Content-Type: multipart/form-data"});
  CHECK(no_boundary.status == 400);
  Response other_type = request(f.unix_ep, "POST", "/v1/edits", "x", {"Content-Type: text/plain"});
  CHECK(other_type.status == 415);

  // Templates that are not images, empty or too large.
  Response not_image = request(f.unix_ep, "POST", "/v1/templates?name=junk.png", "this is no image", {"Content-Type: image/png"});
  CHECK(not_image.status == 400);
  CHECK(message_of(not_image).find("junk.png") != std::string::npos);
  CHECK(request(f.unix_ep, "POST", "/v1/templates", "").status == 400);
  Response huge = request(f.unix_ep, "POST", "/v1/templates", std::string(2 << 20, 'x'));
  CHECK(huge.status == 413);
  CHECK(is_error_body(huge, "body_too_large"));

  // Routes, methods, ids.
  CHECK(request(f.unix_ep, "GET", "/v2/anything").status == 404);
  CHECK(request(f.unix_ep, "PUT", "/v1/models").status == 405);
  CHECK(request(f.unix_ep, "GET", "/v1/edits/abc").status == 400);
  CHECK(request(f.unix_ep, "GET", "/v1/edits/999999").status == 404);
  CHECK(request(f.unix_ep, "GET", "/v1/templates/nope").status == 404);
  CHECK(request(f.unix_ep, "GET", "/v1/models", "", {"X-Infill-Client: bad client!"}).status == 400);

  // Broken HTTP.
  Response garbage = raw_exchange(f.unix_ep, "HELLO\r\n\r\n");
  CHECK(garbage.status == 400);
  CHECK(is_error_body(garbage, "malformed_request"));
  Response big_header = raw_exchange(f.unix_ep, "GET /health HTTP/1.1\r\nX-Big: " + std::string(40000, 'a') + "\r\n\r\n");
  CHECK(big_header.status == 431);
  // The engine still works.
  CHECK(request(f.unix_ep, "GET", "/health").status == 200);
}

TEST_CASE("an edit can be cancelled and ends as cancelled", "[server]") {
  StepGate gate(1);  // held before its second step: running when the DELETE arrives
  ServerFixture f(true, test_limits(), false, gate.hook());
  auto opener = gate.open_on_exit();
  const std::string tmpl = f.upload();
  EventStream events(f.unix_ep, "canceller");
  const uint64_t id = submit_rect(f, f.unix_ep, tmpl, "canceller", 1, 8);
  REQUIRE(gate.wait_held(60000));
  // Its first step's progress reached the ledger (callbacks run on the pool, after the step).
  events.wait_for([&](const SseEvent& e) { return e.type == "progress" && e.data["id"] == id; });
  CHECK(request(f.unix_ep, "GET", "/v1/edits/" + std::to_string(id)).json()["state"] == "running");
  Response del = request(f.unix_ep, "DELETE", "/v1/edits/" + std::to_string(id));
  INFO(del.body);
  REQUIRE(del.status == 202);
  CHECK(del.json()["cancelling"] == true);
  gate.open();
  events.wait_for([&](const SseEvent& e) { return (e.type == "failed" || e.type == "done") && e.data["id"] == id; });
  REQUIRE(!events.events().empty());
  const SseEvent& last = events.events().back();
  CHECK(last.type == "failed");
  CHECK(last.data["state"] == "cancelled");
  Response st = request(f.unix_ep, "GET", "/v1/edits/" + std::to_string(id));
  CHECK(st.json()["state"] == "cancelled");
  CHECK(request(f.unix_ep, "GET", "/v1/edits/" + std::to_string(id) + "/result").status == 409);
  CHECK(request(f.unix_ep, "DELETE", "/v1/edits/" + std::to_string(id)).status == 409);
}

TEST_CASE("a client may not queue more than its limit of edits", "[server][limits]") {
  StepGate gate(0);  // no step runs until the limits are checked: all three stay live
  ServerFixture f(true, test_limits(), false, gate.hook());  // max_queued_per_client = 3
  auto opener = gate.open_on_exit();
  const std::string tmpl = f.upload();
  std::vector<uint64_t> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(submit_rect(f, f.unix_ep, tmpl, "greedy", uint64_t(i), 4));
  Response fourth = request(f.unix_ep, "POST", "/v1/edits",
                            json({{"template", tmpl}, {"mask_rect", {0, 0, 8, 8}}}).dump(),
                            {"Content-Type: application/json", "X-Infill-Client: greedy"});
  CHECK(fourth.status == 429);
  CHECK(is_error_body(fourth, "too_many_edits"));
  // Another client is not affected.
  const uint64_t other = submit_rect(f, f.unix_ep, tmpl, "polite", 9, 2);
  for (uint64_t id : ids) request(f.unix_ep, "DELETE", "/v1/edits/" + std::to_string(id));
  gate.open();
  REQUIRE(f.service->drain(20000, 5000));
  CHECK(request(f.unix_ep, "GET", "/v1/edits/" + std::to_string(other)).json()["state"] == "done");
}

TEST_CASE("a slow client cannot hold a connection past the header timeout", "[server][limits]") {
  ServerFixture f;  // header_timeout_ms = 1500
  const int fd = connect_to(f.unix_ep);
  send_all(fd, "GET /health HTTP/1.1\r\nHost: x\r\n");  // never finishes its header
  std::string got;
  const auto t0 = std::chrono::steady_clock::now();
  bool open = true;
  while (open && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(8)) open = read_some(fd, got, 100);
  ::close(fd);
  CHECK_FALSE(open);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  CHECK(request(f.unix_ep, "GET", "/health").status == 200);
}

TEST_CASE("8 concurrent clients x 3 edits each get exactly their own results", "[server][concurrency]") {
  ServerFixture f;
  const std::string tmpl = f.upload();
  constexpr int kClients = 8, kEdits = 3;
  std::vector<std::set<uint64_t>> submitted(kClients), done(kClients), foreign(kClients);
  std::vector<int> bad_results(kClients, 0);
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      const Endpoint& ep = c % 2 ? f.tcp_ep : f.unix_ep;
      std::vector<std::string> headers;
      if (c % 2) headers.push_back(f.auth());
      const std::string client = "client" + std::to_string(c);
      EventStream events(ep, client, headers);
      for (int e = 0; e < kEdits; ++e) {
        json p = {{"template", tmpl}, {"mask_rect", {8 * c % 48, 8, 16, 16}}, {"seed", c * 10 + e}, {"steps", 3}};
        auto h = headers;
        h.push_back("Content-Type: application/json");
        h.push_back("X-Infill-Client: " + client);
        Response r = request(ep, "POST", "/v1/edits", p.dump(), h);
        if (r.status == 202) submitted[c].insert(r.json()["id"].get<uint64_t>());
      }
      events.wait_for([&](const SseEvent&) {
        size_t n = 0;
        for (const auto& ev : events.events()) n += ev.type == "done" || ev.type == "failed";
        return n >= submitted[c].size();
      }, 45000);
      for (const auto& ev : events.events()) {
        const uint64_t id = ev.data["id"].get<uint64_t>();
        if (!submitted[c].count(id)) foreign[c].insert(id);
        if (ev.type == "done") done[c].insert(id);
      }
      for (uint64_t id : done[c]) {
        Response r = request(ep, "GET", "/v1/edits/" + std::to_string(id) + "/result", "", headers);
        auto img = decode_image(std::as_bytes(std::span<const char>(r.body.data(), r.body.size())), "result", 1 << 20);
        if (r.status != 200 || !img.ok() || img->width != 64 || img->height != 48) ++bad_results[c];
        Response s = request(ep, "GET", "/v1/edits/" + std::to_string(id), "", headers);
        if (s.json()["client"] != client) ++bad_results[c];
      }
    });
  }
  for (auto& t : threads) t.join();
  std::set<uint64_t> all;
  for (int c = 0; c < kClients; ++c) {
    INFO("client " << c);
    CHECK(submitted[c].size() == size_t(kEdits));
    CHECK(done[c] == submitted[c]);
    CHECK(foreign[c].empty());
    CHECK(bad_results[c] == 0);
    all.insert(submitted[c].begin(), submitted[c].end());
  }
  CHECK(all.size() == size_t(kClients * kEdits));
}

TEST_CASE("/health after a sticky device error: failed and 503 naming the fault, and edits refused as unavailable",
          "[server][http][device]") {
  ServerFixture f(true, test_limits(), false, [](std::span<const uint64_t>) {
    throw std::runtime_error("CUDA error: an illegal memory access was encountered");
  });
  Response healthy = request(f.unix_ep, "GET", "/health");
  REQUIRE(healthy.status == 200);
  CHECK(healthy.json()["status"] == "ok");
  REQUIRE(healthy.json()["workers"].size() == 1);
  CHECK(healthy.json()["workers"][0]["in_service"] == true);
  CHECK(healthy.json()["workers"][0]["device"] == "cpu");

  const std::string tmpl = f.upload();
  EventStream events(f.unix_ep, "painter");
  Response sub = request(f.unix_ep, "POST", "/v1/edits", R"({"template":")" + tmpl + R"(","mask_rect":[8,8,24,20],"steps":4})",
                         {"Content-Type: application/json", "X-Infill-Client: painter"});
  REQUIRE(sub.status == 202);
  const uint64_t id = sub.json()["id"].get<uint64_t>();
  const auto& got = events.wait_for([&](const SseEvent& e) { return (e.type == "done" || e.type == "failed") && e.data["id"] == id; });
  REQUIRE(got.back().type == "failed");
  CHECK(got.back().data["error"]["message"].get<std::string>().find("out of service") != std::string::npos);

  Response health = request(f.unix_ep, "GET", "/health");
  INFO(health.body);
  CHECK(health.status == 503);
  CHECK(health.json()["status"] == "failed");
  CHECK(health.json()["workers"][0]["in_service"] == false);
  CHECK(health.json()["workers"][0]["fault"].get<std::string>().find("illegal memory access") != std::string::npos);
  Response refused = request(f.unix_ep, "POST", "/v1/edits", R"({"template":")" + tmpl + R"(","mask_rect":[8,8,24,20],"steps":4})",
                             {"Content-Type: application/json", "X-Infill-Client: painter"});
  CHECK(refused.status == 503);
  CHECK(refused.json()["error"]["code"] == "unavailable");
  Response metrics = request(f.unix_ep, "GET", "/v1/metrics");
  CHECK(metrics.json()["workers"][0]["in_service"] == false);
}
