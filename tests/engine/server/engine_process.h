#pragma once
// The infill-engine binary as a child process of a test: where the build put it (and the
// random model it generates), spawning with logs, reaping, waiting for /health.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "http_test_client.h"
#include "support/catch.h"

namespace infill::test {

// build/<preset>/tests/infill_tests_server -> build/<preset>/app/infill-engine
inline std::string engine_binary() {
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return (exe.parent_path().parent_path() / "app" / "infill-engine").string();
}

// engine_binary(), which the suite builds with it (tests/CMakeLists.txt): a missing one is a
// broken build, so the calling test fails here.
inline std::string required_engine_binary() {
  const std::string bin = engine_binary();
  INFO("infill-engine is not built at " << bin << "; build the infill-engine target");
  REQUIRE(std::filesystem::exists(bin));
  return bin;
}

// build/<preset>/models/infill-random: the random-weight model the build generates.
inline std::string build_random_model() {
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return (exe.parent_path().parent_path() / "models" / "infill-random").string();
}

// Starts `args` (args[0] the binary, a path or a name looked up in PATH) with stderr to `log`
// and stdout to `log`.out, and `env` ("NAME=value") added to this process's environment.
inline pid_t spawn(const std::vector<std::string>& args, const std::string& log, const std::vector<std::string>& env = {}) {
  // Everything the child needs is built before fork: after it, only exec-safe calls.
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    FILE* err = std::freopen(log.c_str(), "w", stderr);
    FILE* out = std::freopen((log + ".out").c_str(), "w", stdout);
    (void)err;
    (void)out;
    ::execvpe(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  return pid;
}

// Kills the engine a test started when the test ends early (a failed REQUIRE), so that no
// engine outlives its test; wait_exit reaps a finished one first.
struct ReapOnExit {
  pid_t& pid;
  ~ReapOnExit() {
    if (pid > 0 && ::waitpid(pid, nullptr, WNOHANG) == 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
};

// Polls /health on the socket until it answers 200 (true) or `timeout_ms` passes.
inline bool wait_healthy(const std::string& sock, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    if (std::filesystem::exists(sock)) {
      try {
        if (request(Endpoint{sock, 0}, "GET", "/health").status == 200) return true;
      } catch (const std::exception&) {
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// Exit status of `pid`, or -1 if it did not end within `timeout_ms` (then it is killed).
inline int wait_exit(pid_t pid, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  int status = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    if (::waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  return -1;
}

// Polls an edit until it ends (done, failed or cancelled) or the timeout passes; returns its
// last status JSON.
inline nlohmann::json wait_edit(const Endpoint& ep, uint64_t id, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  nlohmann::json j;
  while (std::chrono::steady_clock::now() < deadline) {
    Response s = request(ep, "GET", "/v1/edits/" + std::to_string(id));
    if (s.status != 200) return {{"http_status", s.status}, {"body", s.body}};
    j = s.json();
    const std::string state = j["state"];
    if (state == "done" || state == "failed" || state == "cancelled") return j;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return j;
}

// Submits `params` (JSON), waits for the edit to end and returns its result file's body; a
// failed REQUIRE names the edit's last state when it does not end done.
inline std::string edit_result_body(const Endpoint& ep, const nlohmann::json& params) {
  Response r = request(ep, "POST", "/v1/edits", params.dump(), {"Content-Type: application/json"});
  INFO(r.body);
  REQUIRE(r.status == 202);
  const uint64_t id = r.json()["id"];
  const nlohmann::json done = wait_edit(ep, id, 120000);
  INFO(done.dump());
  REQUIRE(done["state"] == "done");
  Response file = request(ep, "GET", "/v1/edits/" + std::to_string(id) + "/result");
  REQUIRE(file.status == 200);
  return file.body;
}

}  // namespace infill::test
