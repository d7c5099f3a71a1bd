#include "server/journal_writer.h"

#include <cstdio>
#include <future>

namespace infill {

JournalWriter::JournalWriter(JobJournal& journal) : journal_(journal), thread_([this] { loop(); }) {}

JournalWriter::~JournalWriter() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void JournalWriter::post(Write write, std::function<void(Status)> committed) {
  {
    std::lock_guard lock(mu_);
    queue_.push_back({std::move(write), std::move(committed)});
  }
  cv_.notify_all();
}

Status JournalWriter::run(Write write) {
  std::promise<Status> done;
  auto result = done.get_future();
  post(std::move(write), [&done](Status st) { done.set_value(std::move(st)); });
  return result.get();
}

void JournalWriter::flush() { (void)run([](JobJournal&) { return Status(); }); }

size_t JournalWriter::pending() const {
  std::lock_guard lock(mu_);
  return queue_.size() + running_;
}

void JournalWriter::loop() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and everything queued has run
    Task task = std::move(queue_.front());
    queue_.pop_front();
    ++running_;
    lock.unlock();
    Status st;
    try {
      st = task.write(journal_);
    } catch (const std::exception& e) {
      st = io_error(std::string("journal write threw: ") + e.what());
    }
    if (task.committed) {
      task.committed(st);
    } else if (!st.ok()) {
      std::fprintf(stderr, "infill-engine: journal: %s\n", st.message().c_str());
    }
    lock.lock();
    --running_;
  }
}

}  // namespace infill
