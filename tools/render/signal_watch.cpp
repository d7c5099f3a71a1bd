#include "signal_watch.h"

#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

namespace infill::render {
namespace {

sigset_t watched() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

}  // namespace

SignalWatcher::SignalWatcher() {
  const sigset_t set = watched();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  thread_ = std::thread([this] { loop(); });
}

SignalWatcher::~SignalWatcher() {
  stop_ = true;
  thread_.join();
}

void SignalWatcher::loop() {
  const sigset_t set = watched();
  // sigtimedwait so the destructor needs no signal of its own to wake the thread.
  const timespec poll = {0, 100 * 1000 * 1000};
  while (!stop_) {
    const int sig = sigtimedwait(&set, nullptr, &poll);
    if (sig <= 0) continue;
    int expected = 0;
    if (!received_.compare_exchange_strong(expected, sig)) continue;  // the first one counts
    std::lock_guard lock(mu_);
    if (handler_) handler_(sig);
  }
}

void SignalWatcher::on_signal(std::function<void(int)> handler) {
  std::lock_guard lock(mu_);
  handler_ = std::move(handler);
  if (received_ && handler_) handler_(received_);
}

void die_by_signal(int signal) {
  struct sigaction sa = {};
  sa.sa_handler = SIG_DFL;
  sigemptyset(&sa.sa_mask);
  sigaction(signal, &sa, nullptr);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, signal);
  ::raise(signal);  // pending while blocked ...
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);  // ... delivered here
  _exit(128 + signal);
}

}  // namespace infill::render
