#pragma once
// Runs the real infill-render binary of this build tree as a child process, stdout and stderr
// captured to files, with a bounded wait.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace infill::test {

// build/<dir>/tests/infill_tests_render -> build/<dir>/app/infill-render
inline std::string render_binary() {
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return (exe.parent_path().parent_path() / "app" / "infill-render").string();
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct RenderRun {
  bool exited = false;    // normal exit
  int code = -1;          // exit code when exited
  int signal = 0;         // terminating signal otherwise
  std::string out, err;
};

class RenderProcess {
 public:
  // `log` is a path prefix: log.out and log.err receive the streams.
  RenderProcess(const std::vector<std::string>& args, std::string log) : log_(std::move(log)) {
    std::vector<std::string> full = {render_binary()};
    full.insert(full.end(), args.begin(), args.end());
    // Unflushed stdio buffers would be written twice (by the child's freopen too).
    std::fflush(stdout);
    std::fflush(stderr);
    pid_ = ::fork();
    if (pid_ == 0) {
      std::vector<char*> argv;
      for (auto& a : full) argv.push_back(a.data());
      argv.push_back(nullptr);
      if (!std::freopen((log_ + ".out").c_str(), "w", stdout) || !std::freopen((log_ + ".err").c_str(), "w", stderr))
        ::_exit(126);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
  }
  ~RenderProcess() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  pid_t pid() const { return pid_; }
  std::string out() const { return read_text(log_ + ".out"); }

  // Waits up to `timeout_ms`; a process still running then is killed and reported as SIGKILL.
  RenderRun wait(int timeout_ms = 120000) {
    RenderRun r;
    int status = 0;
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    bool done = false;
    while (std::chrono::steady_clock::now() < until) {
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        done = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (!done) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
    }
    reaped_ = true;
    r.exited = WIFEXITED(status);
    r.code = r.exited ? WEXITSTATUS(status) : -1;
    r.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    r.out = read_text(log_ + ".out");
    r.err = read_text(log_ + ".err");
    return r;
  }

 private:
  std::string log_;
  pid_t pid_ = -1;
  bool reaped_ = false;
};

inline RenderRun run_render(const std::vector<std::string>& args, const std::string& log, int timeout_ms = 120000) {
  RenderProcess p(args, log);
  return p.wait(timeout_ms);
}

inline int count_lines_starting(const std::string& text, const std::string& prefix) {
  std::istringstream in(text);
  int n = 0;
  for (std::string line; std::getline(in, line);)
    if (line.rfind(prefix, 0) == 0) ++n;
  return n;
}

}  // namespace infill::test
