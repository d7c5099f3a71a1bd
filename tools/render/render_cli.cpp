#include "render_cli.h"

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
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
  --token-file FILE    bearer token for an http:// engine (the engine's --token-file)
  --model DIR          model of the embedded engine (default: the job's "model", else the
                       bundled infill-tiny-2)
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

// The command line, checked.
struct CliOptions {
  std::string job_path;
  std::optional<std::string> items;
  bool force = false, no_cache = false, list = false, help = false;
  std::optional<EngineAddress> engine;
  std::string token_file;
  std::optional<std::string> model, cache_dir;
  int threads = 0;
  int max_in_flight = 8;
  std::optional<double> deadline_s;
};

// Returns an error message, or "" when `o` is complete.
std::string parse_cli(int argc, char** argv, CliOptions& o) {
  const std::map<std::string, bool> known = {
      {"--items", true},   {"--force", false},    {"--engine", true},     {"--token-file", true},
      {"--model", true},   {"--cache-dir", true}, {"--no-cache", false},  {"--threads", true},
      {"--max-in-flight", true}, {"--deadline", true}, {"--list", false}, {"--help", false}};
  std::map<std::string, std::string> opts;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.size() > 1 && arg[0] == '-') {
      auto it = known.find(arg);
      if (it == known.end()) {
        static const std::set<std::string> single_edit = {"--template", "--mask",     "--out-dir", "--prompt",
                                                          "--seed",     "--steps",    "--strength", "--sampler",
                                                          "--halo",     "--feather",  "--guidance", "--format"};
        if (single_edit.count(arg))
          return "option " + arg + " of the former single-edit command line; expected a job file that lists the "
                 "edit (see resources/jobs/sample.json and docs/farm.md)";
        return "unknown option " + arg + "; expected one of the options of infill-render --help";
      }
      if (it->second) {
        if (i + 1 >= argc) return arg + " needs a value";
        opts[arg] = argv[++i];
      } else {
        opts.emplace(arg, std::string());
      }
    } else if (o.job_path.empty()) {
      o.job_path = arg;
    } else {
      return "a second job file " + arg + "; expected one JOB.json (run the jobs one after another)";
    }
  }
  o.help = opts.count("--help") > 0;
  if (o.help) return "";
  if (o.job_path.empty()) return "no job file; expected: infill-render JOB.json [options] (see --help)";
  o.force = opts.count("--force") > 0;
  o.no_cache = opts.count("--no-cache") > 0;
  o.list = opts.count("--list") > 0;
  if (opts.count("--items")) o.items = opts["--items"];
  if (opts.count("--model")) o.model = opts["--model"];
  if (opts.count("--cache-dir")) o.cache_dir = opts["--cache-dir"];
  if (opts.count("--token-file")) o.token_file = opts["--token-file"];
  if (opts.count("--threads") && !parse_positive(opts["--threads"], 1024, o.threads))
    return "--threads is " + opts["--threads"] + "; expected an integer in 1..1024";
  if (opts.count("--max-in-flight") && !parse_positive(opts["--max-in-flight"], 4096, o.max_in_flight))
    return "--max-in-flight is " + opts["--max-in-flight"] + "; expected an integer in 1..4096";
  if (opts.count("--deadline")) {
    const std::string& text = opts["--deadline"];
    char* end = nullptr;
    const double d = std::strtod(text.c_str(), &end);
    if (end == text.c_str() || *end != '\0' || !(d > 0) || d > 1e7)
      return "--deadline is " + text + "; expected seconds, a number in (0, 1e7]";
    o.deadline_s = d;
  }
  if (opts.count("--engine")) {
    auto parsed = parse_engine_address(opts["--engine"]);
    if (!parsed.ok()) return parsed.status().message();
    o.engine = *parsed;
    if (o.model || o.cache_dir || opts.count("--threads"))
      return "--model, --cache-dir and --threads configure the embedded engine; expected none of them with --engine";
    if (o.no_cache) return "--no-cache is a mode of the embedded engine; expected it without --engine";
    if (!o.engine->host.empty() && o.token_file.empty())
      return "--engine " + o.engine->text + " needs --token-file (TCP engines require a bearer token)";
    std::error_code ec;
    if (!o.token_file.empty() && !std::filesystem::is_regular_file(o.token_file, ec))
      return "--token-file " + o.token_file + " does not exist; expected the engine's token file";
  } else if (opts.count("--token-file")) {
    return "--token-file without --engine; expected it only with --engine http://HOST:PORT";
  }
  return "";
}

// Everything after the command line; `stop_signal` is set when a signal stopped the run.
int run_job_file(const CliOptions& o, std::chrono::steady_clock::time_point t_start, SignalWatcher& signals,
                 RenderProtocol& protocol, std::ostream& out, int& stop_signal) {
  auto bad = [&](const std::string& message) {
    protocol.error(message);
    return static_cast<int>(kExitBadJob);
  };
  auto job = load_job(o.job_path);
  if (!job.ok()) return bad(job.status().message());
  const int item_count = static_cast<int>(job->items.size());
  ItemRange range{1, item_count};
  if (o.items) {
    auto r = parse_item_range(*o.items, item_count);
    if (!r.ok()) return bad(r.status().message());
    range = *r;
  }
  if (o.list) {
    for (const Job::Item& it : job->items)
      if (it.number >= range.first && it.number <= range.last) out << it.number << "\t" << it.output << "\n";
    out.flush();
    return kExitOk;
  }

  std::unique_ptr<RenderBackend> backend;
  if (o.engine) {
    RemoteOptions ro;
    ro.address = *o.engine;
    ro.token_file = o.token_file;
    auto opened = open_remote_backend(ro);
    if (!opened.ok()) {
      protocol.error(opened.status().message());
      return kExitEngine;
    }
    backend = std::move(*opened);
  } else {
    EmbeddedOptions eo;
    eo.model_path = o.model ? *o.model : job->model;
    eo.cache_dir = o.cache_dir ? *o.cache_dir : default_cache_dir();
    if (eo.cache_dir == "none") eo.cache_dir.clear();
    eo.threads = o.threads;
    auto opened = open_embedded_backend(eo);
    if (!opened.ok()) {
      protocol.error("the embedded engine cannot start: " + opened.status().message());
      return kExitEngine;
    }
    backend = std::move(*opened);
  }

  auto items = resolve_items(*job, backend->info());
  if (!items.ok()) return bad(items.status().message());
  RenderFailure input_failure = RenderFailure::kBadInput;
  if (Status loaded = load_job_inputs(*job, *backend, input_failure); !loaded.ok()) {
    if (input_failure == RenderFailure::kBadInput) return bad(loaded.message());
    protocol.error(loaded.message());
    return input_failure == RenderFailure::kEngine ? kExitEngine : kExitInternal;
  }

  RunOptions ro;
  ro.range = range;
  ro.force = o.force;
  ro.max_in_flight = o.max_in_flight;
  ro.use_cache = !o.no_cache;
  ro.deadline_s = o.deadline_s ? *o.deadline_s : job->deadline_s;
  if (ro.deadline_s > 0)
    ro.deadline = t_start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                std::chrono::duration<double>(ro.deadline_s));
  JobRunner runner(*backend, protocol);
  signals.on_signal([&runner](int sig) { runner.stop(sig); });
  const RunReport report = runner.run(*items, ro);
  signals.on_signal({});
  backend.reset();  // cancels and joins the engine's threads
  if (report.signal) stop_signal = report.signal;
  return report.exit_code;
}

}  // namespace

int render_main(int argc, char** argv, std::ostream& out, std::ostream& err, int& stop_signal) {
  const auto t_start = std::chrono::steady_clock::now();
  stop_signal = 0;
  RenderProtocol protocol(out, err);
  CliOptions o;
  if (std::string e = parse_cli(argc, argv, o); !e.empty()) {
    protocol.error(e);
    return kExitBadJob;
  }
  if (o.help) {
    out << kUsage;
    return kExitOk;
  }
  // Before any thread exists (OIIO, libtorch and the runtime start theirs).
  SignalWatcher signals;
  const int code = run_job_file(o, t_start, signals, protocol, out, stop_signal);
  // A signal that came before the runner existed (say, while the model loaded) still ends
  // the process by that signal.
  if (!stop_signal && signals.received()) stop_signal = signals.received();
  return stop_signal ? 128 + stop_signal : code;
}

}  // namespace infill::render
