// The infill-engine binary as a process: --check, a bad config, start-up to /health 200 and a
// clean exit 0 on SIGTERM with the socket removed; SIGKILL and resume; socket activation.
#include "support/catch.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sqlite3.h>

#include <algorithm>
#include <filesystem>
#include <future>
#include <fstream>
#include <thread>

#include "engine_process.h"
#include "model/compute_device.h"
#include "server_fixture.h"
#include "support/command_output.h"

using namespace infill;
using namespace infill::test;

TEST_CASE("infill-engine: --check, bad config, start, serve, SIGTERM exits 0", "[server][process]") {
  const std::string bin = required_engine_binary();
  c10::InferenceMode guard;
  TempDir dir("infill-proc");
  REQUIRE(write_random_model(dir.file("model"), tiny_serving_dit(), 16, 42).ok());
  const std::string sock = dir.file("run/engine.sock");
  const std::vector<std::string> base = {bin, "--model", dir.file("model"), "--socket", sock,
                                         "--token-file", dir.file("conf/token"), "--no-calibrate", "--threads", "1",
                                         "--journal", dir.file("state/journal.sqlite")};

  auto with = [&](std::vector<std::string> extra) {
    auto a = base;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  CHECK(wait_exit(spawn(with({"--check"}), dir.file("check.log")), 30000) == 0);
  {
    std::ofstream(dir.file("bad.json")) << R"({"workers": 1, "colour": "blue"})";
  }
  CHECK(wait_exit(spawn(with({"--config", dir.file("bad.json"), "--check"}), dir.file("bad.log")), 30000) == 2);
  CHECK(wait_exit(spawn(with({"--model", dir.file("missing"), "--check"}), dir.file("missing.log")), 30000) == 2);
  // A device this machine (or build) lacks, or that the model's family cannot use, is an
  // error naming it; a misspelt one names what is expected.
  const std::string device = infill::cuda_device_count() > 0 ? "cuda:0" : "cuda:" + std::to_string(infill::cuda_device_count());
  CHECK(wait_exit(spawn(with({"--device", device, "--check"}), dir.file("device.log")), 30000) == 2);
  {
    std::ifstream log(dir.file("device.log"));
    const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    INFO(text);
    CHECK(text.find(device) != std::string::npos);
  }
  CHECK(wait_exit(spawn(with({"--device", "gpu", "--check"}), dir.file("gpu.log")), 30000) == 2);
  {
    std::ifstream log(dir.file("gpu.log"));
    const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    CHECK(text.find("device \"gpu\": expected cpu, cuda or cuda:N") != std::string::npos);
  }

  pid_t pid = spawn(with({"--listen", "127.0.0.1:0"}), dir.file("engine.log"));
  ReapOnExit reap{pid};
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    if (std::filesystem::exists(sock)) {
      try {
        status = request(Endpoint{sock, 0}, "GET", "/health").status;
      } catch (const std::exception&) {
        status = 0;
      }
      if (status == 200) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  CHECK(status == 200);
  struct stat st {};
  CHECK(::stat(dir.file("conf/token").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  ::kill(pid, SIGTERM);
  CHECK(wait_exit(pid, 20000) == 0);
  CHECK_FALSE(std::filesystem::exists(sock));
}

TEST_CASE("infill-engine tells systemd when it is ready and when it stops, and marks journald priorities",
          "[server][process]") {
  const std::string bin = required_engine_binary();
  c10::InferenceMode guard;
  TempDir dir("infill-notify");
  REQUIRE(write_random_model(dir.file("model"), tiny_serving_dit(), 16, 42).ok());
  // The service manager's side: a datagram socket as NOTIFY_SOCKET, read here.
  const std::string notify_path = dir.file("notify.sock");
  const int notify_fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  REQUIRE(notify_fd >= 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", notify_path.c_str());
  REQUIRE(::bind(notify_fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  auto next_message = [&](int timeout_ms) {
    pollfd p{notify_fd, POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) != 1) return std::string();
    char buf[4096];
    const ssize_t n = ::recv(notify_fd, buf, sizeof buf, 0);
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
  };
  // journald's side: stderr is the log file, named by JOURNAL_STREAM as systemd names it.
  const std::string log = dir.file("engine.log");
  { std::ofstream create(log); }
  struct stat st {};
  REQUIRE(::stat(log.c_str(), &st) == 0);
  const std::string journal_stream =
      "JOURNAL_STREAM=" + std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
  const std::string sock = dir.file("run/engine.sock");
  pid_t pid = spawn({bin, "--model", dir.file("model"), "--socket", sock, "--no-calibrate", "--threads", "1",
                     "--journal", "off"},
                    log, {"NOTIFY_SOCKET=" + notify_path, journal_stream});
  ReapOnExit reap{pid};
  // READY=1 comes once the model is loaded: /health answers 200 from then on.
  std::string ready;
  for (int i = 0; i < 10 && ready.find("READY=1") == std::string::npos; ++i) ready = next_message(60000);
  INFO("notifications: " << ready);
  REQUIRE(ready.find("READY=1") != std::string::npos);
  CHECK(ready.find("STATUS=serving") != std::string::npos);
  CHECK(request(Endpoint{sock, 0}, "GET", "/health").status == 200);
  ::kill(pid, SIGTERM);
  const std::string stopping = next_message(30000);
  CHECK(stopping.find("STOPPING=1") != std::string::npos);
  CHECK(wait_exit(pid, 20000) == 0);
  ::close(notify_fd);
  // Every line carries its priority: info for "ready", notice for the stop.
  std::ifstream in(log);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  std::string all;
  for (const std::string& line : lines) all += line + "\n";
  INFO("log: " << all);
  REQUIRE_FALSE(lines.empty());
  for (const std::string& line : lines) CHECK((line.rfind("<", 0) == 0 && line.find(">infill-engine: ") == 2));
  CHECK(std::find(lines.begin(), lines.end(), "<6>infill-engine: ready") != lines.end());
  CHECK(std::find(lines.begin(), lines.end(), "<5>infill-engine: SIGTERM, stopping") != lines.end());
}

TEST_CASE("infill-engine killed with SIGKILL resumes its queued batch edits on restart", "[server][process][journal]") {
  const std::string bin = required_engine_binary();
  c10::InferenceMode guard;
  TempDir dir("infill-kill");
  REQUIRE(write_random_model(dir.file("model"), tiny_serving_dit(), 16, 42).ok());
  const std::string sock = dir.file("run/engine.sock");
  const std::vector<std::string> args = {bin, "--model", dir.file("model"), "--socket", sock, "--no-calibrate",
                                         "--threads", "1", "--journal", dir.file("state/journal.sqlite")};
  const Endpoint ep{sock, 0};
  pid_t pid = spawn(args, dir.file("engine1.log"));
  ReapOnExit reap{pid};
  REQUIRE(wait_healthy(sock, 30000));
  Response t = request(ep, "POST", "/v1/templates?name=picture.png", png_string(serving_picture(0)), {"Content-Type: image/png"});
  REQUIRE(t.status == 201);
  const std::string tmpl = t.json()["id"];
  std::vector<uint64_t> ids;
  for (int i = 0; i < 8; ++i) {
    nlohmann::json p = {{"template", tmpl}, {"mask_rect", {(8 * i) % 48, 8, 16, 16}}, {"seed", i}, {"steps", 200}, {"class", "batch"}};
    Response r = request(ep, "POST", "/v1/edits", p.dump(), {"Content-Type: application/json", "X-Infill-Client: farm"});
    REQUIRE(r.status == 202);
    ids.push_back(r.json()["id"].get<uint64_t>());
  }
  const std::string last_state = request(ep, "GET", "/v1/edits/" + std::to_string(ids.back())).json()["state"];
  ::kill(pid, SIGKILL);
  CHECK(wait_exit(pid, 20000) == 128 + SIGKILL);

  pid = spawn(args, dir.file("engine2.log"));  // the stale socket is replaced
  REQUIRE(wait_healthy(sock, 30000));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  for (uint64_t id : ids) {
    INFO("edit " << id);
    std::string state;
    while (std::chrono::steady_clock::now() < deadline) {
      Response s = request(ep, "GET", "/v1/edits/" + std::to_string(id));
      REQUIRE(s.status == 200);
      state = s.json()["state"];
      if (state == "done" || state == "failed" || state == "cancelled") break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    CHECK(state == "done");
    Response png = request(ep, "GET", "/v1/edits/" + std::to_string(id) + "/result");
    CHECK(png.status == 200);
    auto img = decode_image(std::as_bytes(std::span<const char>(png.body.data(), png.body.size())), "result", 1 << 20);
    REQUIRE(img.ok());
    CHECK(img->width == 64);
  }
  Response m = request(ep, "GET", "/v1/metrics");
  INFO("the last edit was " << last_state << " when the engine was killed");
  const int resumed = m.json()["service"]["edits_resumed"].get<int>();
  WARN("edits resumed after SIGKILL: " << resumed << " (the last edit was " << last_state << ")");
  if (last_state != "done") CHECK(resumed >= 1);
  ::kill(pid, SIGTERM);
  CHECK(wait_exit(pid, 20000) == 0);
}

namespace {

// `infill_journal_pending_writes` from GET /metrics, or -1.
int journal_pending_writes(const Endpoint& ep) {
  const std::string text = request(ep, "GET", "/metrics").body;
  const std::string name = "\ninfill_journal_pending_writes ";
  const size_t at = text.find(name);
  return at == std::string::npos ? -1 : std::stoi(text.substr(at + name.size()));
}

}  // namespace

TEST_CASE("infill-engine killed while journal writes are queued loses no accepted edit and keeps no unanswered one",
          "[server][process][journal]") {
  const std::string bin = required_engine_binary();
  c10::InferenceMode guard;
  TempDir dir("infill-kill-queued");
  REQUIRE(write_random_model(dir.file("model"), tiny_serving_dit(), 16, 42).ok());
  const std::string sock = dir.file("run/engine.sock");
  const std::string journal = dir.file("state/journal.sqlite");
  const std::vector<std::string> args = {bin, "--model", dir.file("model"), "--socket", sock, "--no-calibrate",
                                         "--threads", "1", "--journal", journal};
  const Endpoint ep{sock, 0};
  pid_t pid = spawn(args, dir.file("engine1.log"));
  ReapOnExit reap{pid};
  REQUIRE(wait_healthy(sock, 30000));
  Response t = request(ep, "POST", "/v1/templates?name=picture.png", png_string(serving_picture(0)), {"Content-Type: image/png"});
  REQUIRE(t.status == 201);
  const std::string tmpl = t.json()["id"];
  auto batch_edit = [&](int seed) {
    nlohmann::json p = {{"template", tmpl}, {"mask_rect", {8, 8, 16, 16}}, {"seed", seed}, {"steps", 1000}, {"class", "batch"}};
    return request(ep, "POST", "/v1/edits", p.dump(), {"Content-Type: application/json", "X-Infill-Client: farm"});
  };
  Response accepted = batch_edit(1);
  REQUIRE(accepted.status == 202);
  const uint64_t accepted_id = accepted.json()["id"].get<uint64_t>();

  // Another connection holds the journal's write lock, as a stalled disk would: the engine's
  // journal thread blocks on its next write and the writes after it queue.
  sqlite3* holder = nullptr;
  REQUIRE(sqlite3_open(journal.c_str(), &holder) == SQLITE_OK);
  REQUIRE(sqlite3_exec(holder, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr) == SQLITE_OK);
  // Still running now: its end cannot commit either, so it must resume after the kill.
  const std::string state_at_lock = request(ep, "GET", "/v1/edits/" + std::to_string(accepted_id)).json()["state"];
  // Two batch edits whose records cannot commit: their POSTs wait (on the engine's pool, not
  // its io thread).
  auto answer_of = [&](int seed) {
    return std::async(std::launch::async, [&, seed]() -> int {
      try {
        return batch_edit(seed).status;
      } catch (const std::exception&) {
        return 0;  // the connection died with the engine: no answer
      }
    });
  };
  std::future<int> second = answer_of(2), third = answer_of(3);
  int pending = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline && (pending = journal_pending_writes(ep)) < 2)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  INFO("journal writes queued when the engine was killed: " << pending);
  CHECK(pending >= 2);
  ::kill(pid, SIGKILL);
  CHECK(wait_exit(pid, 20000) == 128 + SIGKILL);
  const int second_status = second.get(), third_status = third.get();
  CHECK(sqlite3_exec(holder, "ROLLBACK", nullptr, nullptr, nullptr) == SQLITE_OK);
  sqlite3_close(holder);
  // Neither was told 202: their records never committed.
  CHECK(second_status != 202);
  CHECK(third_status != 202);

  pid = spawn(args, dir.file("engine2.log"));
  REQUIRE(wait_healthy(sock, 30000));
  // The accepted edit resumes and ends done ...
  std::string state;
  const auto done_by = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < done_by) {
    Response s = request(ep, "GET", "/v1/edits/" + std::to_string(accepted_id));
    REQUIRE(s.status == 200);
    state = s.json()["state"];
    if (state == "done" || state == "failed" || state == "cancelled") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  CHECK(state == "done");
  // ... and the engine holds nothing else: no edit was half-accepted.
  nlohmann::json metrics = request(ep, "GET", "/v1/metrics").json();
  INFO("the accepted edit was " << state_at_lock << " when the journal was locked");
  if (state_at_lock != "done") CHECK(metrics["service"]["edits_resumed"] == 1);
  CHECK(metrics["service"]["edits_resumed"].get<int>() <= 1);
  CHECK(request(ep, "GET", "/v1/edits/" + std::to_string(accepted_id + 1)).status == 404);
  CHECK(request(ep, "GET", "/v1/edits/" + std::to_string(accepted_id + 2)).status == 404);
  // New edits never take an id handed out before the kill.
  Response next = batch_edit(4);
  REQUIRE(next.status == 202);
  CHECK(next.json()["id"].get<uint64_t>() > accepted_id + 2);
  ::kill(pid, SIGTERM);
  CHECK(wait_exit(pid, 20000) == 0);
}

namespace {

// A TCP port nothing listens on now (bound to 0 and released), for a listener made by
// another process: systemd-socket-activate takes no port 0.
uint16_t unused_tcp_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    throw std::runtime_error("no free TCP port");
  ::close(fd);
  return ntohs(addr.sin_port);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

TEST_CASE("infill-engine socket-activated by systemd-socket-activate serves on the passed Unix and TCP sockets",
          "[server][process][activation]") {
  const std::string bin = required_engine_binary();
  require_tool_or_skip("systemd-socket-activate", "systemd");
  c10::InferenceMode guard;
  TempDir dir("infill-activate");
  REQUIRE(write_random_model(dir.file("model"), tiny_serving_dit(), 16, 42).ok());
  std::filesystem::create_directories(dir.file("run"));
  const std::string sock = dir.file("run/engine.sock");
  const uint16_t port = unused_tcp_port();
  // --socket names another path: the passed socket wins, as under the .socket unit.
  pid_t pid = spawn({"systemd-socket-activate", "-l", sock, "-l", "127.0.0.1:" + std::to_string(port), bin, "--model",
                     dir.file("model"), "--socket", dir.file("not-this.sock"), "--token-file", dir.file("conf/token"),
                     "--no-calibrate", "--threads", "1", "--journal", "off"},
                    dir.file("engine.log"));
  ReapOnExit reap{pid};
  // The activator makes the socket, then starts the engine on the first connection; requests
  // made while the model loads wait in the backlog (or get 503 until it is ready).
  REQUIRE(wait_healthy(sock, 60000));
  CHECK_FALSE(std::filesystem::exists(dir.file("not-this.sock")));
  const std::string log = read_file(dir.file("engine.log"));
  INFO(log);
  CHECK(log.find("unix:" + sock) != std::string::npos);
  CHECK(log.find("(socket-activated)") != std::string::npos);

  // The passed TCP socket serves too, with the bearer token.
  std::string token;
  std::ifstream(dir.file("conf/token")) >> token;
  REQUIRE(token.size() >= 32);
  const Endpoint tcp{"", port};
  CHECK(request(tcp, "GET", "/v1/models").status == 401);
  Response models = request(tcp, "GET", "/v1/models", "", {"Authorization: Bearer " + token});
  CHECK(models.status == 200);
  CHECK(models.json()["models"].size() == 1);

  ::kill(pid, SIGTERM);
  CHECK(wait_exit(pid, 20000) == 0);
  // The socket file belongs to the service manager: the engine leaves it for the next start.
  CHECK(std::filesystem::exists(sock));
}
