#include "render_cli.h"

#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "cache/disk_tier.h"
#include "embedded_backend.h"
#include "exit_codes.h"
#include "item_range.h"
#include "job_file.h"
#include "job_items.h"
#include "job_runner.h"
#include "remote_backend.h"
#include "render_protocol.h"
#include "signal_watch.h"

namespace infill::render {
namespace {

constexpr const char* kUsage = R"USAGE(usage: infill-render JOB.json [options]

Runs the edits of a job file (docs/job.schema.json, docs/farm.md) and writes one PNG per item
(an item is one seed of one edit, numbered from 1 in file order).

options:
  --items A-B          run items A to B only (also "A" or "A-"); for splitting a job across a farm
  --force              redo outputs even when they are up to date (same job hash)
  --engine ADDR        use a running infill-engine: unix:PATH or http://HOST:PORT
                       (default: an engine embedded in this process)
  --token-file FILE    bearer token for an http:// engine
  --model DIR          model of the embedded engine (default: the job's "model", else the
                       bundled infill-tiny)
  --cache-dir DIR      disk tier of the activation cache (default: $XDG_CACHE_HOME/infill/activations;
                       "none" = RAM only)
  --no-cache           recompute every token at every step (the full-recompute baseline)
  --threads N          compute threads of the embedded engine (default: every core)
  --max-in-flight N    edits submitted at once (default 8)
  --deadline S         seconds from start for the whole run (default: the job's deadline_s)
  --list               print "ITEM<TAB>OUTPUT" for every item and exit
  --help

output: "Progress: NN%" per change, "Saved: PATH" per output written, "Skipped: PATH (up to
date)"; errors only on stderr as "Error: ...".
exit codes: 0 done, 2 bad job file / file / option / range, 3 engine unreachable or refused
(or its model failed to load), 4 deadline missed, 5 internal error.
SIGTERM / SIGINT: in-flight edits are cancelled, no partial file is left, and the process dies
by the same signal.
)USAGE";

bool parse_positive(const std::string& text, int max, int& out) {
  if (text.empty() || text.size() > 9 || text.find_first_not_of("0123456789") != std::string::npos) return false;
  out = std::stoi(text);
  return out >= 1 && out <= max;
}

}  // namespace

int render_main(int argc, char** argv, std::ostream& out, std::ostream& err, int& stop_signal) {
  const auto t_start = std::chrono::steady_clock::now();
  stop_signal = 0;
  RenderProtocol protocol(out, err);
  auto bad = [&](const std::string& message) {
    protocol.error(message);
    return static_cast<int>(kExitBadJob);
  };

  std::map<std::string, std::string> opts;
  std::string job_path;
  const std::map<std::string, bool> known = {
      {"--items", true},   {"--force", false},   {"--engine", true},        {"--token-file", true},
      {"--model", true},   {"--cache-dir", true}, {"--no-cache", false},    {"--threads", true},
      {"--max-in-flight", true}, {"--deadline", true}, {"--list", false}, {"--help", false}};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.size() > 1 && arg[0] == '-') {
      auto it = known.find(arg);
      if (it == known.end()) return bad("unknown option " + arg + "; expected one of the options of infill-render --help");
      if (it->second) {
        if (i + 1 >= argc) return bad(arg + " needs a value");
        opts[arg] = argv[++i];
      } else {
        opts.emplace(arg, std::string());
      }
    } else if (job_path.empty()) {
      job_path = arg;
    } else {
      return bad("a second job file " + arg + "; expected one JOB.json (run the jobs one after another)");
    }
  }
  if (opts.count("--help")) {
    out << kUsage;
    return kExitOk;
  }
  if (job_path.empty()) return bad("no job file; expected: infill-render JOB.json [options] (see --help)");
  int threads = 0, max_in_flight = 8;
  if (opts.count("--threads") && !parse_positive(opts["--threads"], 1024, threads))
    return bad("--threads is " + opts["--threads"] + "; expected an integer in 1..1024");
  if (opts.count("--max-in-flight") && !parse_positive(opts["--max-in-flight"], 4096, max_in_flight))
    return bad("--max-in-flight is " + opts["--max-in-flight"] + "; expected an integer in 1..4096");
  std::optional<double> deadline_flag;
  if (opts.count("--deadline")) {
    char* end = nullptr;
    const double d = std::strtod(opts["--deadline"].c_str(), &end);
    if (end == opts["--deadline"].c_str() || *end != '\0' || !(d > 0) || d > 1e7)
      return bad("--deadline is " + opts["--deadline"] + "; expected seconds, a number in (0, 1e7]");
    deadline_flag = d;
  }
  std::optional<EngineAddress> engine;
  if (opts.count("--engine")) {
    auto parsed = parse_engine_address(opts["--engine"]);
    if (!parsed.ok()) return bad(parsed.status().message());
    engine = *parsed;
    if (opts.count("--model") || opts.count("--cache-dir") || opts.count("--threads"))
      return bad("--model, --cache-dir and --threads configure the embedded engine; expected none of them with --engine");
  } else if (opts.count("--token-file")) {
    return bad("--token-file without --engine; expected it only with --engine http://HOST:PORT");
  }

  // Before any thread exists (OIIO, libtorch and the runtime start theirs below).
  SignalWatcher signals;

  auto job = load_job(job_path);
  if (!job.ok()) return bad(job.status().message());
  const int item_count = static_cast<int>(job->items.size());
  ItemRange range{1, item_count};
  if (opts.count("--items")) {
    auto r = parse_item_range(opts["--items"], item_count);
    if (!r.ok()) return bad(r.status().message());
    range = *r;
  }
  if (opts.count("--list")) {
    for (const Job::Item& it : job->items)
      if (it.number >= range.first && it.number <= range.last) out << it.number << "\t" << it.output << "\n";
    out.flush();
    return kExitOk;
  }

  std::unique_ptr<RenderBackend> backend;
  if (engine) {
    RemoteOptions ro;
    ro.address = *engine;
    if (opts.count("--token-file")) ro.token_file = opts["--token-file"];
    auto opened = open_remote_backend(ro);
    if (!opened.ok()) {
      protocol.error(opened.status().message());
      return kExitEngine;
    }
    backend = std::move(*opened);
  } else {
    EmbeddedOptions eo;
    eo.model_path = opts.count("--model") ? opts["--model"] : job->model;
    eo.cache_dir = opts.count("--cache-dir") ? opts["--cache-dir"] : default_cache_dir();
    if (eo.cache_dir == "none") eo.cache_dir.clear();
    eo.threads = threads;
    auto opened = open_embedded_backend(eo);
    if (!opened.ok()) {
      protocol.error("the embedded engine cannot start: " + opened.status().message());
      return kExitEngine;
    }
    backend = std::move(*opened);
  }

  auto items = resolve_items(*job, backend->info());
  if (!items.ok()) return bad(items.status().message());

  RunOptions ro;
  ro.range = range;
  ro.force = opts.count("--force") > 0;
  ro.max_in_flight = max_in_flight;
  ro.use_cache = !opts.count("--no-cache");
  ro.deadline_s = deadline_flag ? *deadline_flag : job->deadline_s;
  if (ro.deadline_s > 0)
    ro.deadline = t_start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                std::chrono::duration<double>(ro.deadline_s));
  JobRunner runner(*backend, protocol);
  signals.on_signal([&runner](int sig) { runner.stop(sig); });
  const RunReport report = runner.run(*items, ro);
  signals.on_signal({});
  backend.reset();  // cancels and joins the engine's threads
  if (report.signal) {
    stop_signal = report.signal;
    return 128 + report.signal;
  }
  return report.exit_code;
}

}  // namespace infill::render
