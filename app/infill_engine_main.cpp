// infill-engine: the daemon. Loads the model, serves the HTTP API on a Unix socket (and on
// TCP with --listen), and on SIGTERM / SIGINT stops accepting, lets live edits finish within
// drain_timeout_ms, cancels the rest and exits 0.
// Exit codes: 0 clean exit (or --check passed), 2 bad configuration or model, 5 failure.
#include <c10/core/InferenceMode.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <vector>
#include <filesystem>
#include <iostream>
#include <map>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "cache/disk_tier.h"
#include "common/blas_kernel.h"
#include "model/compute_threads.h"
#include "model/model.h"
#include "pipeline/bundled_models.h"
#include "serving/device_list.h"
#include "server/daemon_log.h"
#include "server/engine_check.h"
#include "server/engine_service.h"
#include "server/http_server.h"
#include "server/socket_activation.h"
#include "server/server_config.h"
#include "server/service_notify.h"

namespace {

constexpr const char* kUsage = R"(usage: infill-engine [options]

Serves the Infill API (docs/api.md) on a Unix socket and, with --listen, on TCP.

options:
  --socket PATH       Unix socket (default: $XDG_RUNTIME_DIR/infill/engine.sock)
  --listen HOST:PORT  also listen on TCP (bearer token required; use 127.0.0.1 unless you mean it)
  --token-file PATH   TCP bearer token, created on first use (default: $XDG_CONFIG_HOME/infill/token)
  --config PATH       JSON config (default: the first of $XDG_CONFIG_HOME/infill/engine.json,
                      $XDG_CONFIG_DIRS/infill/engine.json, <prefix>/share/infill/engine.json)
  --model PATH        model folder (default: the bundled infill-tiny-2 and infill-tiny, else the
                      build's random model):
                      an Infill model (manifest.json) or a FLUX.2 folder (diffusers layout, or the
                      transformer file + ae.safetensors + text_encoder/ + tokenizer/);
                      repeat to serve several models: the first is the default, an edit's
                      "model" picks another
  --device DEVICES    where the models compute: cpu (default), cuda (every visible GPU),
                      cuda:N, or several separated by commas (cuda:0,cuda:1; cpu,cpu = two CPU
                      devices, each with its share of the cores); the models are loaded on each
                      device and each gets its own workers (GPUs: FLUX.2 models; needs a build
                      against a CUDA libtorch, the cuda preset)
  --workers N         step-loop workers per device (default 1)
  --threads N         compute threads per worker (default: cores / (workers x devices))
  --journal PATH      SQLite journal of accepted batch edits, resumed after a crash
                      (default: $XDG_STATE_HOME/infill/journal.sqlite; "off" = none)
  --no-calibrate      skip the start-up timing of the cost model
  --check             validate the config and load the models on every device as the engine
                      would, print a JSON summary (each device: ok, or its fault), exit 0 when
                      every device holds every model, else 2 naming the device
  --help

Socket activation: started with listening sockets passed by systemd (infill-engine.socket)
or systemd-socket-activate, it serves on those (one Unix, at most one TCP) instead of
--socket and --listen; connections made while the model loads wait in the socket's backlog.
)";

int fail(const std::string& message, int code) {
  infill::log_line(infill::LogLevel::kError, "error: " + message);
  return code;
}

bool has_manifest(const std::filesystem::path& dir) {
  std::error_code ec;
  return std::filesystem::exists(dir / "manifest.json", ec);
}

// The bundled models next to an installed binary or in the source tree (infill-tiny-2 first:
// the default); else the random model the build generates.
std::vector<std::string> default_models(const char* argv0) {
  std::vector<std::string> models = infill::bundled_model_dirs(INFILL_SOURCE_DIR);
  if (!models.empty()) return models;
  std::error_code ec;
  std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) exe = std::filesystem::absolute(argv0, ec);
  for (const auto& candidate : {exe.parent_path() / "../models/infill-random", std::filesystem::path(INFILL_RANDOM_MODEL_DIR)}) {
    if (has_manifest(candidate)) return {std::filesystem::weakly_canonical(candidate, ec).string()};
  }
  return {};
}

// The first engine.json of: the user's ($XDG_CONFIG_HOME/infill), the system's
// ($XDG_CONFIG_DIRS, default /etc/xdg), the package's default next to the binary.
std::string default_config_file(const char* argv0) {
  std::error_code ec;
  std::vector<std::filesystem::path> candidates = {std::filesystem::path(infill::default_config_dir()) / "engine.json"};
  const char* dirs = std::getenv("XDG_CONFIG_DIRS");
  std::string list = dirs && *dirs ? dirs : "/etc/xdg";
  for (size_t start = 0; start <= list.size();) {
    const size_t colon = std::min(list.find(':', start), list.size());
    if (colon > start) candidates.push_back(std::filesystem::path(list.substr(start, colon - start)) / "infill/engine.json");
    start = colon + 1;
  }
  std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) exe = std::filesystem::absolute(argv0, ec);
  candidates.push_back(exe.parent_path() / "../share/infill/engine.json");
  for (const auto& c : candidates)
    if (std::filesystem::exists(c, ec)) return std::filesystem::weakly_canonical(c, ec).string();
  return "";
}

bool parse_int(const std::string& text, int lo, int hi, int& out) {
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (end == text.c_str() || *end != '\0' || v < lo || v > hi) return false;
  out = static_cast<int>(v);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  infill::select_blas_kernel();  // first: before any GEMM (common/blas_kernel.h)
  std::map<std::string, std::string> opts;
  std::vector<std::string> model_flags;  // --model may be repeated
  const std::map<std::string, bool> known = {{"--socket", true},  {"--listen", true},  {"--token-file", true},
                                             {"--config", true},  {"--model", true},   {"--workers", true},
                                             {"--threads", true}, {"--check", false},  {"--help", false},
                                             {"--no-calibrate", false}, {"--journal", true},
                                             {"--device", true}};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto it = known.find(arg);
    if (it == known.end()) return fail("unknown option " + arg + "\n" + kUsage, 2);
    if (it->second) {
      if (i + 1 >= argc) return fail(arg + " needs a value", 2);
      opts[arg] = argv[++i];
      if (arg == "--model") model_flags.push_back(opts[arg]);
    } else {
      // emplace, not operator= with a literal: g++ 12 raises a false -Wrestrict on the latter.
      opts.emplace(arg, std::string());
    }
  }
  if (opts.count("--help")) {
    std::cout << kUsage;
    return 0;
  }

  // Config file, then flags over it.
  infill::EngineConfig config;
  const std::string config_path = opts.count("--config") ? opts["--config"] : default_config_file(argv[0]);
  {
    std::error_code ec;
    if (opts.count("--config") || (!config_path.empty() && std::filesystem::exists(config_path, ec))) {
      auto loaded = infill::load_engine_config(config_path);
      if (!loaded.ok()) return fail(loaded.status().message(), 2);
      config = std::move(*loaded);
    }
  }
  if (opts.count("--socket")) config.socket_path = opts["--socket"];
  if (opts.count("--listen")) config.listen = opts["--listen"];
  if (opts.count("--token-file")) config.token_file = opts["--token-file"];
  if (!model_flags.empty()) config.models = model_flags;  // flags replace the config's list
  if (opts.count("--no-calibrate")) config.calibrate = false;
  if (opts.count("--device")) config.device = opts["--device"];
  if (opts.count("--journal")) config.journal = opts["--journal"];
  if (config.journal.empty()) config.journal = infill::default_state_dir() + "/journal.sqlite";
  if (opts.count("--workers") && !parse_int(opts["--workers"], 1, 64, config.workers))
    return fail("--workers is " + opts["--workers"] + ", expected 1..64", 2);
  if (opts.count("--threads") && !parse_int(opts["--threads"], 1, 1024, config.threads))
    return fail("--threads is " + opts["--threads"] + ", expected 1..1024", 2);
  if (config.socket_path.empty()) config.socket_path = infill::default_runtime_dir() + "/engine.sock";
  if (config.token_file.empty()) config.token_file = infill::default_config_dir() + "/token";
  if (config.models.empty()) {
    config.models = default_models(argv[0]);
    if (config.models.empty()) return fail("no model: pass --model PATH (no bundled or generated model was found)", 2);
  }
  if (const infill::Status devices = infill::check_device_list(config.device); !devices.ok())
    return fail("--device: " + devices.message(), 2);
  if (config.threads <= 0) {
    const int devices = std::max(1, infill::count_devices(config.device, infill::cuda_device_count()));
    config.threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / (config.workers * devices));
  }
  // Socket activation (infill-engine.socket, systemd-socket-activate): serve on the sockets
  // the service manager made; they replace --socket and --listen.
  auto activated = infill::take_activated_sockets();
  if (!activated.ok()) return fail(activated.status().message(), 2);
  if (activated->unix_fd >= 0) config.socket_path = activated->unix_path;
  if (activated->any()) config.listen = activated->tcp_fd >= 0 ? "socket-activated" : "";
  std::pair<std::string, uint16_t> tcp;
  if (!config.listen.empty() && activated->tcp_fd < 0) {
    auto addr = infill::parse_listen_address(config.listen);
    if (!addr.ok()) return fail("--listen: " + addr.status().message(), 2);
    tcp = *addr;
  }

  infill::set_compute_threads(config.threads);
  c10::InferenceMode guard;
  infill::ServiceOptions so;
  so.model_path = config.models.front();
  so.extra_model_paths.assign(config.models.begin() + 1, config.models.end());
  so.device = config.device;
  so.workers = config.workers;
  so.threads_per_worker = config.threads;
  so.pool_threads = 1;
  so.sequence_parallel = config.sequence_parallel;
  so.team_timeout_ms = config.device_team_timeout_ms;
  so.team_round_ms = config.device_team_round_ms;
  so.team_link = config.device_team_link;
  so.team_masked_share = config.device_team_masked_share;
  so.step_graph_bytes = config.step_graph_bytes;
  so.float8_weights = config.float8_weights;
  so.fused_norms = config.fused_norm_kernels;
  so.cache_dir = config.cache_dir.empty() ? infill::default_cache_dir() : config.cache_dir;
  so.ram_cache_bytes = config.ram_cache_bytes;
  so.device_cache_bytes = config.device_cache_bytes;
  so.adapter_ram_bytes = static_cast<int64_t>(config.adapter_ram_bytes);
  so.adapter_device_bytes = static_cast<int64_t>(config.adapter_device_bytes);
  so.calibrate = config.calibrate;
  so.calibration_path = so.cache_dir + "/step_cost.json";
  so.journal_path = config.journal == "off" ? std::string() : config.journal;
  so.limits = config.limits;
  if (opts.count("--check")) {
    // The models load on every device as the engine's start loads them (engine_check.h).
    const infill::EngineCheckReport report = infill::check_engine(so);
    nlohmann::json summary = infill::engine_check_json(report);
    summary["config"] = config_path;
    summary["model"] = config.models.front();
    summary["model_id"] = report.models.empty() ? std::string() : report.models.front().id;
    summary["socket"] = config.socket_path;
    summary["listen"] = config.listen;
    summary["device"] = report.devices.empty() ? config.device : report.devices.front().description;
    summary["workers"] = config.workers;
    summary["threads"] = config.threads;
    summary["journal"] = config.journal;
    std::cout << summary.dump(2) << std::endl;
    if (!report.status.ok()) return fail(report.status.message(), 2);
    return 0;
  }

  // Signals are taken by sigwait on this thread only: block them before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  infill::EngineService service(so);

  infill::HttpServerOptions ho;
  ho.socket_path = config.socket_path;
  ho.tcp_host = tcp.first;
  ho.tcp_port = tcp.second;
  ho.allowed_origins = config.allowed_origins;
  ho.limits = config.limits;
  ho.activated_unix_fd = activated->unix_fd;
  ho.activated_tcp_fd = activated->tcp_fd;
  if (activated->any() && activated->unix_fd < 0) ho.socket_path.clear();  // TCP only, as the unit says
  if (!config.listen.empty()) {
    auto token = infill::load_or_create_token(config.token_file);
    if (!token.ok()) return fail(token.status().message(), 2);
    ho.token = *token;
  }
  auto server = infill::HttpServer::start(service, ho);
  if (!server.ok()) return fail(server.status().message(), 5);
  {
    std::string line = "listening on";
    if (!ho.socket_path.empty()) line += " unix:" + ho.socket_path;
    if (!config.listen.empty())
      line += " tcp:" + (activated->tcp_fd >= 0 ? std::string("*") : tcp.first) + ":" + std::to_string((*server)->tcp_port());
    if (activated->any()) line += " (socket-activated)";
    line += "; loading";
    for (const std::string& m : config.models) line += " " + m;
    infill::log_line(infill::LogLevel::kInfo, line);
    infill::log_line(infill::LogLevel::kInfo, "blas: " + infill::describe(infill::blas_kernel_choice()));
    infill::notify_status("loading the model");
  }

  // /health answers 503 while the model loads.
  std::atomic<int> load_failed{0};
  std::thread loader([&] {
    c10::InferenceMode loader_guard;
    infill::Status st = service.load();
    if (!st.ok()) {
      infill::log_line(infill::LogLevel::kError, "error: " + st.message());
      load_failed = 1;
      ::kill(::getpid(), SIGTERM);
      return;
    }
    infill::log_line(infill::LogLevel::kInfo, "ready");
    infill::notify_ready("serving");
  });

  int sig = 0;
  sigwait(&signals, &sig);
  infill::log_line(load_failed ? infill::LogLevel::kError : infill::LogLevel::kNotice,
                   std::string(load_failed ? "model failed to load" : (sig == SIGINT ? "SIGINT" : "SIGTERM")) + ", stopping");
  infill::notify_stopping("draining live edits");
  if (!service.ready() && !load_failed) {
    // Still loading (calibration can take a minute): nothing is in flight, so do not wait
    // for the loader; close the listeners (removing the socket file) and leave at once.
    (*server)->stop();
    infill::log_line(infill::LogLevel::kNotice, "stopped while loading");
    std::_Exit(0);
  }
  loader.join();
  (*server)->stop_accepting();
  const bool drained = service.drain(config.drain_timeout_ms, 2000);
  if (!drained) infill::log_line(infill::LogLevel::kWarning, "some edits did not stop in time");
  (*server)->stop();
  return load_failed ? 5 : 0;
}
