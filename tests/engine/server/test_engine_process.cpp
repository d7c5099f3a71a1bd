// The infill-engine binary as a process: --check, a bad config, start-up to /health 200 and a
// clean exit 0 on SIGTERM with the socket removed.
#include "support/catch.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "server_fixture.h"

using namespace infill;
using namespace infill::test;

namespace {

// build/<preset>/tests/infill_tests_server -> build/<preset>/app/infill-engine
std::string engine_binary() {
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return (exe.parent_path().parent_path() / "app" / "infill-engine").string();
}

pid_t spawn(const std::vector<std::string>& args, const std::string& log) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    FILE* err = std::freopen(log.c_str(), "w", stderr);
    FILE* out = std::freopen((log + ".out").c_str(), "w", stdout);
    (void)err;
    (void)out;
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

// Exit status of `pid`, or -1 if it did not end within `timeout_ms` (then it is killed).
int wait_exit(pid_t pid, int timeout_ms) {
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

}  // namespace

TEST_CASE("infill-engine: --check, bad config, start, serve, SIGTERM exits 0", "[server][process]") {
  const std::string bin = engine_binary();
  if (!std::filesystem::exists(bin)) {
    WARN("infill-engine is not built at " << bin << "; build the infill-engine target");
    return;
  }
  c10::InferenceMode guard;
  TempDir dir("infill-proc");
  REQUIRE(write_random_model(dir.file("model"), tiny_serving_dit(), 16, 42).ok());
  const std::string sock = dir.file("run/engine.sock");
  const std::vector<std::string> base = {bin, "--model", dir.file("model"), "--socket", sock,
                                         "--token-file", dir.file("conf/token"), "--no-calibrate", "--threads", "1"};

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

  const pid_t pid = spawn(with({"--listen", "127.0.0.1:0"}), dir.file("engine.log"));
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
