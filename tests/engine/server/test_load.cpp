// Load on real sockets: 32 concurrent clients x 20 edits each (half on the Unix socket, half
// on TCP), while another client walks away mid-job. No result may be lost, duplicated or
// delivered to the wrong client, and each result must be its own edit (its mask).
#include "support/catch.h"

#include <cstdio>
#include <mutex>
#include <set>
#include <thread>

#include "server_fixture.h"

using namespace infill;
using namespace infill::test;
using nlohmann::json;

namespace {

struct Rect {
  int x, y, w, h;
};

// Every client paints a different square, so a result delivered to the wrong edit shows.
Rect rect_of(int client) { return {(client * 8) % 48, ((client / 6) * 8) % 32, 16, 16}; }

// `result` equals the template outside `r` and differs from it somewhere inside.
bool is_edit_of(const PixelImage& result, const PixelImage& tmpl, Rect r) {
  if (result.width != tmpl.width || result.height != tmpl.height || result.channels != tmpl.channels) return false;
  const auto* a = reinterpret_cast<const uint8_t*>(result.data.data());
  const auto* b = reinterpret_cast<const uint8_t*>(tmpl.data.data());
  bool changed_inside = false;
  for (int y = 0; y < tmpl.height; ++y)
    for (int x = 0; x < tmpl.width; ++x) {
      const bool inside = x >= r.x && x < r.x + r.w && y >= r.y && y < r.y + r.h;
      for (int c = 0; c < tmpl.channels; ++c) {
        const size_t i = (size_t(y) * tmpl.width + x) * tmpl.channels + c;
        if (inside) changed_inside |= a[i] != b[i];
        else if (a[i] != b[i]) return false;
      }
    }
  return changed_inside;
}

}  // namespace

TEST_CASE("32 clients x 20 edits: no lost, duplicated or misdelivered result, a vanishing client disturbs no one",
          "[server][concurrency][load]") {
  ServerLimits limits = test_limits();
  limits.max_queued_per_client = 20;
  limits.max_live_edits = 1024;
  limits.max_results = 4096;
  ServerFixture f(true, limits);
  const std::string tmpl = f.upload();
  constexpr int kClients = 32, kEdits = 20;

  // The client that walks away: a long edit, then it closes its event stream and its socket.
  std::vector<uint64_t> abandoned;
  {
    EventStream events(f.unix_ep, "leaver");
    for (int e = 0; e < 3; ++e) {
      json p = {{"template", tmpl}, {"mask_rect", {0, 0, 32, 32}}, {"seed", 900 + e}, {"steps", 60}};
      Response r = request(f.unix_ep, "POST", "/v1/edits", p.dump(), {"Content-Type: application/json", "X-Infill-Client: leaver"});
      REQUIRE(r.status == 202);
      abandoned.push_back(r.json()["id"].get<uint64_t>());
    }
    events.wait_for([](const SseEvent& e) { return e.type == "progress"; }, 20000);
  }  // the event stream's socket closes here, mid-job

  std::mutex mu;
  std::map<uint64_t, int> done_events;  // id -> number of "done" events seen, over all clients
  std::vector<std::set<uint64_t>> submitted(kClients);
  std::vector<int> refused(kClients, 0), wrong(kClients, 0), foreign(kClients, 0);
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      const Endpoint& ep = c % 2 ? f.tcp_ep : f.unix_ep;
      std::vector<std::string> headers;
      if (c % 2) headers.push_back(f.auth());
      const std::string client = "load" + std::to_string(c);
      EventStream events(ep, client, headers);
      const Rect r = rect_of(c);
      for (int e = 0; e < kEdits; ++e) {
        json p = {{"template", tmpl}, {"mask_rect", {r.x, r.y, r.w, r.h}}, {"seed", c * 100 + e}, {"steps", 2}};
        auto h = headers;
        h.push_back("Content-Type: application/json");
        h.push_back("X-Infill-Client: " + client);
        Response resp = request(ep, "POST", "/v1/edits", p.dump(), h);
        if (resp.status == 202) submitted[c].insert(resp.json()["id"].get<uint64_t>());
        else ++refused[c];
      }
      events.wait_for([&](const SseEvent&) {
        size_t n = 0;
        for (const auto& ev : events.events()) n += ev.type == "done" || ev.type == "failed";
        return n >= submitted[c].size();
      }, 120000);
      std::set<uint64_t> done;
      for (const auto& ev : events.events()) {
        const uint64_t id = ev.data["id"].get<uint64_t>();
        if (!submitted[c].count(id)) ++foreign[c];
        if (ev.type == "done") {
          done.insert(id);
          std::lock_guard lock(mu);
          ++done_events[id];
        }
      }
      for (uint64_t id : submitted[c]) {
        Response res = request(ep, "GET", "/v1/edits/" + std::to_string(id) + "/result", "", headers);
        auto img = decode_image(bytes_of(res.body), "result", 1 << 20);
        const bool good = res.status == 200 && img.ok() && is_edit_of(*img, f.picture, r) && done.count(id);
        if (!good) {
          ++wrong[c];
          std::lock_guard lock(mu);
          std::fprintf(stderr, "client %d edit %llu: status %d, decoded %d, is its edit %d, done event %d, %zu bytes, %s\n", c,
                       static_cast<unsigned long long>(id), res.status, int(img.ok()),
                       int(img.ok() && is_edit_of(*img, f.picture, r)), int(done.count(id)), res.body.size(), img.ok() ? "" : img.status().message().c_str());
        }
      }
    });
  }
  for (auto& t : threads) t.join();

  std::set<uint64_t> all;
  for (int c = 0; c < kClients; ++c) {
    INFO("client " << c);
    CHECK(refused[c] == 0);
    CHECK(submitted[c].size() == size_t(kEdits));
    CHECK(wrong[c] == 0);
    CHECK(foreign[c] == 0);
    all.insert(submitted[c].begin(), submitted[c].end());
  }
  CHECK(all.size() == size_t(kClients * kEdits));
  for (const auto& [id, n] : done_events) {
    INFO("edit " << id);
    CHECK(n == 1);
  }
  CHECK(done_events.size() == all.size());
  // The abandoned edits still finish, and their results wait for their client to come back.
  for (uint64_t id : abandoned) {
    std::string state;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < until) {
      state = request(f.unix_ep, "GET", "/v1/edits/" + std::to_string(id)).json()["state"];
      if (state != "queued" && state != "preparing" && state != "running") break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    CHECK(state == "done");
  }
  CHECK(request(f.unix_ep, "GET", "/health").status == 200);
}
