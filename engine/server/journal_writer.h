#pragma once
/// The one thread that writes the job journal. Writes are queued and run in order, off the
/// io thread and off the service's mutex, so that no HTTP request waits on the disk: a dropped
/// result is forgotten in the background, and a finished batch edit's "done" event goes out
/// from here once its record has committed. Callers that must know a write committed before
/// they answer (a batch edit's 202) wait for it on their own (pool) thread with run().
///
/// Torch-free.

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "common/status.h"
#include "server/job_journal.h"

namespace infill {

class JournalWriter {
 public:
  using Write = std::function<Status(JobJournal&)>;
  /// `journal` must outlive the writer.
  explicit JournalWriter(JobJournal& journal);
  /// Runs every queued write, then joins the thread.
  ~JournalWriter();
  JournalWriter(const JournalWriter&) = delete;
  JournalWriter& operator=(const JournalWriter&) = delete;

  /// Queues `write`; `committed` (optional) runs on the writer's thread after it, with its
  /// status. A failed write without `committed` is logged to stderr.
  void post(Write write, std::function<void(Status)> committed = {});
  /// Queues `write` and waits for it. Never call it from the io thread or under a lock that
  /// the io thread takes.
  Status run(Write write);
  /// Waits until everything queued before the call has run.
  void flush();
  /// Writes queued and not yet finished (for metrics and tests).
  size_t pending() const;

 private:
  struct Task {
    Write write;
    std::function<void(Status)> committed;
  };
  void loop();

  JobJournal& journal_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  size_t running_ = 0;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace infill
