#pragma once
// A real infill-engine of this build tree for the remote-mode tests: the default bundled model
// (the one the embedded engine of infill-render loads, so their outputs compare) or a model
// folder, a Unix socket and TCP on a free loopback port with a token, killed (SIGTERM) at the end.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "pipeline/bundled_models.h"
#include "render_process.h"

namespace infill::test {

class EngineProcess {
 public:
  // Starts the engine with files under `dir` (which must exist) on the model folder `model`
  // ("" = the bundled one); ready() tells whether it came up within a minute.
  explicit EngineProcess(const std::string& dir, int threads = 2, const std::string& model = {}) : dir_(dir) {
    std::error_code ec;
    const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
    const std::string bin = (exe.parent_path().parent_path() / "app" / "infill-engine").string();
    socket_ = dir + "/run/engine.sock";
    token_file_ = dir + "/conf/token";
    log_ = dir + "/engine.log";
    const std::vector<std::string> bundled = bundled_model_dirs(INFILL_SOURCE_DIR);
    if (model.empty() && bundled.empty()) return;
    const std::vector<std::string> args = {bin, "--model", model.empty() ? bundled.front() : model,
                                           "--socket", socket_, "--listen", "127.0.0.1:0", "--token-file", token_file_,
                                           "--no-calibrate", "--threads", std::to_string(threads), "--config", dir + "/engine.json"};
    std::ofstream(dir + "/engine.json") << "{\"cache_dir\": \"" << dir << "/cache\"}";
    if (!std::filesystem::exists(bin)) return;
    // Unflushed stdio buffers would be written twice (by the child's freopen too).
    std::fflush(stdout);
    std::fflush(stderr);
    pid_ = ::fork();
    if (pid_ == 0) {
      std::vector<char*> argv;
      std::vector<std::string> copy = args;
      for (auto& a : copy) argv.push_back(a.data());
      argv.push_back(nullptr);
      if (!std::freopen(log_.c_str(), "w", stderr) || !std::freopen((log_ + ".out").c_str(), "w", stdout)) ::_exit(126);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    const std::regex tcp(R"(tcp:127\.0\.0\.1:(\d+))");
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < until) {
      const std::string text = read_text(log_);
      std::smatch m;
      if (port_ == 0 && std::regex_search(text, m, tcp)) port_ = std::stoi(m[1]);
      if (text.find("infill-engine: ready") != std::string::npos) {
        ready_ = port_ != 0;
        break;
      }
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  ~EngineProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (std::chrono::steady_clock::now() < until && ::waitpid(pid_, nullptr, WNOHANG) != pid_)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  EngineProcess(const EngineProcess&) = delete;
  EngineProcess& operator=(const EngineProcess&) = delete;

  bool ready() const { return ready_; }
  int port() const { return port_; }
  const std::string& socket() const { return socket_; }
  const std::string& token_file() const { return token_file_; }
  std::string log() const { return read_text(log_); }

 private:
  std::string dir_, socket_, token_file_, log_;
  pid_t pid_ = -1;
  int port_ = 0;
  bool ready_ = false;
};

}  // namespace infill::test
