#include "job_runner.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <sstream>

#include "exit_codes.h"
#include "output_stamp.h"

namespace infill::render {
namespace fs = std::filesystem;

namespace {

int exit_code_of(RenderFailure f) {
  switch (f) {
    case RenderFailure::kBadInput: return kExitBadJob;
    case RenderFailure::kEngine: return kExitEngine;
    case RenderFailure::kDeadline: return kExitDeadline;
    default: return kExitInternal;
  }
}

// How long cancelled edits get to report back before run() gives up on them.
constexpr auto kCancelWait = std::chrono::seconds(30);

}  // namespace

bool output_up_to_date(const std::string& path, const std::string& hash) {
  const auto stamped = read_output_stamp(path, kHashKeyword);
  return stamped && *stamped == hash;
}

Status write_atomically(const std::string& path, const std::vector<std::byte>& bytes) {
  const fs::path target(path);
  std::error_code ec;
  if (target.has_parent_path()) {
    fs::create_directories(target.parent_path(), ec);
    if (ec) return io_error("cannot create folder " + target.parent_path().string() + ": " + ec.message());
  }
  // Appended piecewise: g++ 12 raises a false -Wrestrict on "." + string.
  std::string temp_name(1, '.');
  temp_name += target.filename().string();
  temp_name += ".partial-";
  temp_name += std::to_string(::getpid());
  const fs::path temp = target.parent_path() / temp_name;
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return io_error("cannot create " + temp.string() + ": " + std::strerror(errno));
  size_t off = 0;
  while (off < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + off, bytes.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      const std::string why = std::strerror(errno);
      ::close(fd);
      fs::remove(temp, ec);
      return io_error("cannot write " + temp.string() + ": " + why);
    }
    off += static_cast<size_t>(n);
  }
  if (::close(fd) != 0) {
    const std::string why = std::strerror(errno);
    fs::remove(temp, ec);
    return io_error("cannot write " + temp.string() + ": " + why);
  }
  fs::rename(temp, target, ec);
  if (ec) {
    fs::remove(temp, ec);
    return io_error("cannot rename " + temp.string() + " to " + path + ": " + ec.message());
  }
  return {};
}

void JobRunner::push(Event e) {
  {
    std::lock_guard lock(mu_);
    events_.push_back(std::move(e));
  }
  cv_.notify_all();
}

void JobRunner::stop(int signal) {
  {
    std::lock_guard lock(mu_);
    if (stop_signal_ == 0) stop_signal_ = signal;
  }
  cv_.notify_all();
}

RunReport JobRunner::run(const std::vector<ResolvedItem>& items, const RunOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  RunReport report;
  auto finish = [&](int code) {
    report.exit_code = code;
    report.wall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return report;
  };

  // The selection, and what is already up to date.
  std::vector<const ResolvedItem*> todo;
  int selected = 0;
  for (const ResolvedItem& it : items) {
    if (it.number < options.range.first || it.number > options.range.last) continue;
    ++selected;
    if (!options.force && output_up_to_date(it.output, it.hash)) {
      protocol_.skipped(it.output);
      ++report.skipped;
      continue;
    }
    todo.push_back(&it);
  }
  // Progress: each selected item weighs the same; a skipped item counts as done.
  std::map<uint64_t, double> fraction;  // in-flight items' step fraction
  double done_items = report.skipped;
  auto report_progress = [&] {
    double sum = done_items;
    for (const auto& [id, f] : fraction) sum += f;
    protocol_.progress(selected ? sum / selected : 1.0);
  };
  report_progress();

  std::map<uint64_t, const ResolvedItem*> in_flight;
  size_t next = 0;
  int failure_code = 0;
  int stop_signal = 0;
  bool deadline_missed = false;

  // Cancels what is in flight and waits (bounded) for the completions.
  auto cancel_all = [&] {
    for (const auto& [id, item] : in_flight) backend_.cancel(id);
    const auto until = std::chrono::steady_clock::now() + kCancelWait;
    std::unique_lock lock(mu_);
    while (!in_flight.empty()) {
      if (events_.empty() && !cv_.wait_until(lock, until, [&] { return !events_.empty(); })) break;
      Event e = std::move(events_.front());
      events_.pop_front();
      if (e.complete) in_flight.erase(e.id);  // results that arrive now are dropped, not written
    }
  };

  while (next < todo.size() || !in_flight.empty()) {
    // Submit up to the window.
    while (failure_code == 0 && next < todo.size() && static_cast<int>(in_flight.size()) < options.max_in_flight) {
      {
        std::lock_guard lock(mu_);
        if (stop_signal_) break;
      }
      const ResolvedItem* item = todo[next++];
      RenderEdit edit = item->render;
      edit.use_cache = options.use_cache;
      RenderEvents events;
      events.on_progress = [this](uint64_t id, int done, int total) {
        Event e;
        e.id = id;
        e.steps_done = done;
        e.steps_total = total;
        push(std::move(e));
      };
      events.on_complete = [this](RenderOutcome outcome) {
        Event e;
        e.complete = true;
        e.id = outcome.id;
        e.outcome = std::move(outcome);
        push(std::move(e));
      };
      RenderFailure failure = RenderFailure::kInternal;
      Status st = backend_.submit(edit, std::move(events), failure);
      if (!st.ok()) {
        protocol_.error("item " + std::to_string(item->number) + " (" + item->output + "): " + st.message());
        failure_code = exit_code_of(failure);
        break;
      }
      in_flight[edit.id] = item;
      fraction[edit.id] = 0.0;
    }
    if (failure_code) break;

    // Wait for an event, a stop or the deadline.
    std::deque<Event> batch;
    {
      std::unique_lock lock(mu_);
      auto ready = [&] { return !events_.empty() || stop_signal_ != 0; };
      if (options.deadline) {
        if (!cv_.wait_until(lock, *options.deadline, ready)) deadline_missed = true;
      } else {
        cv_.wait(lock, ready);
      }
      stop_signal = stop_signal_;
      batch.swap(events_);
    }
    if (stop_signal || deadline_missed) {
      // A stop means stop: results that already arrived are dropped like later ones (and
      // their edits are no longer waited for).
      for (const Event& e : batch)
        if (e.complete) in_flight.erase(e.id);
      break;
    }
    for (Event& e : batch) {
      auto it = in_flight.find(e.id);
      if (it == in_flight.end()) continue;
      const ResolvedItem& item = *it->second;
      if (!e.complete) {
        // Below 1 until the file is written: 100% means every output is in place.
        if (e.steps_total > 0) fraction[e.id] = std::min(0.999, double(e.steps_done) / e.steps_total);
        continue;
      }
      in_flight.erase(it);
      fraction.erase(e.id);
      const RenderOutcome& out = e.outcome;
      if (!out.status.ok()) {
        if (failure_code == 0) {
          protocol_.error("item " + std::to_string(item.number) + " (" + item.output + "): " + out.status.message());
          failure_code = exit_code_of(out.failure);
        }
        continue;
      }
      if (failure_code) continue;
      auto stamped = stamp_output(out.file, {{kHashKeyword, item.hash}, {kCanonicalKeyword, item.canonical}});
      Status written = stamped.ok() ? write_atomically(item.output, *stamped) : stamped.status();
      if (!written.ok()) {
        protocol_.error("item " + std::to_string(item.number) + ": " + written.message());
        failure_code = kExitInternal;
        continue;
      }
      protocol_.saved(item.output);
      ++report.written;
      done_items += 1.0;
    }
    if (failure_code) break;
    report_progress();
  }

  if (!in_flight.empty()) cancel_all();
  if (!stop_signal) {
    std::lock_guard lock(mu_);
    stop_signal = stop_signal_;  // a signal that came while finishing still ends the process
  }
  if (stop_signal) {
    report.signal = stop_signal;
    return finish(0);
  }
  if (deadline_missed) {
    std::ostringstream seconds;
    seconds << options.deadline_s;
    protocol_.error("the deadline of " + seconds.str() + " s passed with " +
                    std::to_string(report.written + report.skipped) + " of " + std::to_string(selected) +
                    " items done; expected the run to finish in time (raise deadline_s or split the job with --items)");
    return finish(kExitDeadline);
  }
  return finish(failure_code);
}

}  // namespace infill::render
