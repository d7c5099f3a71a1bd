// The job runner against a scripted backend: exit codes per failure kind, deadline, stop by
// signal, the progress protocol and atomic writes.
#include "support/catch.h"

#include <signal.h>

#include <filesystem>
#include <functional>
#include <map>
#include <sstream>
#include <thread>

#include "exit_codes.h"
#include "job_file.h"
#include "job_items.h"
#include "job_runner.h"
#include "png_text.h"
#include "support/file_bytes.h"
#include "support/temp_dir.h"

using namespace infill;
using namespace infill::render;
namespace fs = std::filesystem;

namespace {

const std::string kGolden = std::string(INFILL_SOURCE_DIR) + "/tests/data/golden";

// Completes every edit at once with a PNG, unless told to fail it or to hang until cancelled.
class ScriptedBackend final : public RenderBackend {
 public:
  std::map<uint64_t, RenderFailure> fail;
  bool hang = false;
  int complete_first = 0;               // with hang: this many edits still complete at once
  std::function<void()> during_submit;  // runs at the start of every submit
  int submitted = 0, cancelled = 0;

  ScriptedBackend() {
    info_.model_id = "scripted";
    info_.default_steps = 4;
    info_.default_sampler = "euler_rf";
  }
  const BackendInfo& info() const override { return info_; }
  Status submit(const RenderEdit& edit, RenderEvents events, RenderFailure&) override {
    ++submitted;
    if (during_submit) during_submit();
    if (hang && submitted > complete_first) {
      pending_[edit.id] = std::move(events);
      return {};
    }
    for (int s = 1; s <= edit.steps; ++s) events.on_progress(edit.id, s, edit.steps);
    RenderOutcome o;
    o.id = edit.id;
    if (auto it = fail.find(edit.id); it != fail.end()) {
      o.status = Status(ErrorCode::kInternal, "scripted failure of edit " + std::to_string(edit.id));
      o.failure = it->second;
    } else {
      o.file = test::file_bytes(kGolden + "/hills_128_mask.png");
    }
    events.on_complete(std::move(o));
    return {};
  }
  void cancel(uint64_t id) override {
    auto it = pending_.find(id);
    if (it == pending_.end()) return;
    ++cancelled;
    RenderOutcome o;
    o.id = id;
    o.status = Status(ErrorCode::kCancelled, "cancelled");
    o.failure = RenderFailure::kCancelled;
    auto events = std::move(it->second);
    pending_.erase(it);
    events.on_complete(std::move(o));
  }

 private:
  BackendInfo info_;
  std::map<uint64_t, RenderEvents> pending_;
};

struct Fixture {
  test::TempDir dir{"infill-runner"};
  Job job;
  std::vector<ResolvedItem> items;
  std::ostringstream out, err;
  RenderProtocol protocol{out, err};

  explicit Fixture(int seeds = 4) {
    fs::copy_file(kGolden + "/hills_128.png", dir.file("t.png"));
    fs::copy_file(kGolden + "/hills_128_mask.png", dir.file("m.png"));
    auto parsed = parse_job(R"({"format": "infill-job/1", "edits": [{"template": "t.png", "mask": "m.png",
        "seeds": {"first": 1, "count": )" + std::to_string(seeds) + R"(}, "output": "out/{seed}.png"}]})",
                            dir.file("job.json"));
    REQUIRE(parsed.ok());
    job = std::move(*parsed);
  }
  RunReport run(ScriptedBackend& backend, RunOptions options = {}) {
    auto resolved = resolve_items(job, backend.info());
    REQUIRE(resolved.ok());
    items = std::move(*resolved);
    if (options.range.last == 0) options.range = {1, static_cast<int>(items.size())};
    JobRunner runner(backend, protocol);
    return runner.run(items, options);
  }
};

}  // namespace

TEST_CASE("job runner: writes every item stamped with its hash and reports progress to 100%", "[render][runner]") {
  Fixture f;
  ScriptedBackend backend;
  const RunReport r = f.run(backend);
  CHECK(r.exit_code == kExitOk);
  CHECK(r.written == 4);
  CHECK(f.err.str().empty());
  for (const ResolvedItem& it : f.items) {
    CHECK(read_png_text(it.output, kHashKeyword) == std::optional<std::string>(it.hash));
    CHECK(f.out.str().find("Saved: " + it.output + "\n") != std::string::npos);
  }
  const std::string out = f.out.str();
  CHECK(out.rfind("Progress: 0%\n", 0) == 0);
  CHECK(out.substr(out.size() - std::string("Progress: 100%\n").size()) == "Progress: 100%\n");
  // Skipped on the next run, without submitting anything.
  ScriptedBackend again;
  CHECK(f.run(again).skipped == 4);
  CHECK(again.submitted == 0);
}

TEST_CASE("job runner: a failed edit stops the run with the exit code of its kind", "[render][runner]") {
  for (auto [failure, code] : {std::pair{RenderFailure::kBadInput, int(kExitBadJob)},
                               std::pair{RenderFailure::kEngine, int(kExitEngine)},
                               std::pair{RenderFailure::kDeadline, int(kExitDeadline)},
                               std::pair{RenderFailure::kInternal, int(kExitInternal)}}) {
    Fixture f;
    ScriptedBackend backend;
    backend.fail[2] = failure;
    RunOptions o;
    o.max_in_flight = 1;
    const RunReport r = f.run(backend, o);
    INFO(f.err.str());
    CHECK(r.exit_code == code);
    CHECK(r.written == 1);
    CHECK(f.err.str().rfind("Error: item 2 (", 0) == 0);
    CHECK(f.out.str().find("Error") == std::string::npos);
    CHECK_FALSE(fs::exists(f.items[2].output));  // nothing after the failure
  }
}

TEST_CASE("job runner: a deadline cancels the edits in flight and exits 4", "[render][runner]") {
  Fixture f;
  ScriptedBackend backend;
  backend.hang = true;
  RunOptions o;
  o.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
  o.deadline_s = 0.1;
  const RunReport r = f.run(backend, o);
  CHECK(r.exit_code == kExitDeadline);
  CHECK(backend.cancelled == backend.submitted);
  CHECK(f.err.str().rfind("Error: the deadline of 0.1 s passed with 0 of 4 items done", 0) == 0);
  CHECK_FALSE(fs::exists(f.dir.file("out")));
}

TEST_CASE("job runner: stop() cancels everything and reports the signal", "[render][runner]") {
  Fixture f;
  ScriptedBackend backend;
  backend.hang = true;
  auto resolved = resolve_items(f.job, backend.info());
  REQUIRE(resolved.ok());
  JobRunner runner(backend, f.protocol);
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    runner.stop(SIGTERM);
  });
  RunOptions o;
  o.range = {1, 4};
  const RunReport r = runner.run(*resolved, o);
  stopper.join();
  CHECK(r.signal == SIGTERM);
  CHECK(backend.cancelled == backend.submitted);
  CHECK(f.err.str().empty());
}

TEST_CASE("write_atomically: creates folders, replaces files and leaves no temporary", "[render][runner]") {
  test::TempDir dir("infill-atomic");
  const std::vector<std::byte> bytes(100, std::byte{7});
  REQUIRE(write_atomically(dir.file("a/b/c.png"), bytes).ok());
  REQUIRE(write_atomically(dir.file("a/b/c.png"), bytes).ok());
  CHECK(fs::file_size(dir.file("a/b/c.png")) == 100);
  CHECK(std::distance(fs::directory_iterator(dir.file("a/b")), fs::directory_iterator()) == 1);
  // A folder in the way: an error naming the path, nothing left behind.
  fs::create_directories(dir.file("d/e.png"));
  Status s = write_atomically(dir.file("d/e.png"), bytes);
  CHECK_FALSE(s.ok());
  CHECK(s.message().find(dir.file("d/e.png")) != std::string::npos);
  CHECK(std::distance(fs::directory_iterator(dir.file("d")), fs::directory_iterator()) == 1);
}

TEST_CASE("job runner: a result that arrives with the stop is dropped and not waited for", "[render][runner]") {
  Fixture f;
  ScriptedBackend backend;
  backend.hang = true;
  backend.complete_first = 1;
  auto resolved = resolve_items(f.job, backend.info());
  REQUIRE(resolved.ok());
  JobRunner runner(backend, f.protocol);
  // The stop lands while the first edit's result is already queued.
  backend.during_submit = [&] {
    if (backend.submitted == 1) runner.stop(SIGTERM);
  };
  RunOptions o;
  o.range = {1, 4};
  const auto t0 = std::chrono::steady_clock::now();
  const RunReport r = runner.run(*resolved, o);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  CHECK(r.signal == SIGTERM);
  CHECK(r.written == 0);
  CHECK_FALSE(fs::exists(f.dir.file("out")));
}
