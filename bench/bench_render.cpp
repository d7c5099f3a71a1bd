// bench_render: infill-render end to end on a job of N edits (default 100) on 2 templates of
// 256x256 with masks of about 10% (resources/jobs/hills_256*, dusk_256*), on the bundled
// infill-tiny model, in one run:
//   - embedded engine, activation cache on, cold (fresh cache folder: both templates prepared)
//   - embedded engine, activation cache on, warm disk tier (a second farm chunk on the node)
//   - remote: this build's infill-engine (a child process, Unix socket, cold cache) through
//     --engine and the client SDK
//   - embedded engine, cache off (--no-cache: every token recomputed at every step)
// Each run is the real command line (render_main: model load or connection, job validation,
// hashing, the runtime, PNG writes) and is timed wall-clock. Also: SSIM of every cached output
// against its full-recompute twin.
// Prints one JSON document on stdout; progress goes to stderr.
//
//   bench_render [--count N] [--steps S] [--threads T]
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/blas_kernel.h"
#include "image_metrics.h"
#include "common/remove_tree.h"
#include "machine_info.h"
#include "model/compute_threads.h"
#include "pipeline/image_io.h"
#include "pipeline/mask.h"
#include "render_cli.h"
#include "tools/render/engine_process.h"

using namespace infill;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

struct Run {
  std::string label;
  double wall_ms = 0;
  int code = 0;
  int saved = 0;
};

Run run_cli(const std::string& label, std::vector<std::string> args) {
  std::vector<char*> argv;
  static std::string name = "infill-render";
  argv.push_back(name.data());
  for (auto& a : args) argv.push_back(a.data());
  std::ostringstream out;
  int sig = 0;
  std::cerr << "bench_render: " << label << " ..." << std::endl;
  const auto t0 = std::chrono::steady_clock::now();
  Run r;
  r.label = label;
  r.code = render::render_main(static_cast<int>(argv.size()), argv.data(), out, std::cerr, sig);
  r.wall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::istringstream lines(out.str());
  for (std::string l; std::getline(lines, l);)
    if (l.rfind("Saved: ", 0) == 0) ++r.saved;
  std::cerr << "bench_render: " << label << ": " << r.wall_ms / 1000 << " s, " << r.saved << " saved, exit " << r.code
            << std::endl;
  return r;
}

bool parse_flag(int argc, char** argv, const char* flag, int& out) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], flag) == 0) {
      out = std::atoi(argv[i + 1]);
      return true;
    }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  infill::select_blas_kernel();  // first: before any GEMM (common/blas_kernel.h)
  int count = 100, steps = 8, threads = static_cast<int>(std::thread::hardware_concurrency());
  parse_flag(argc, argv, "--count", count);
  parse_flag(argc, argv, "--steps", steps);
  parse_flag(argc, argv, "--threads", threads);
  if (count < 2 || steps < 1 || threads < 1) {
    std::cerr << "usage: bench_render [--count N>=2] [--steps S>=1] [--threads T>=1]\n";
    return 2;
  }
  const std::string jobs = std::string(INFILL_SOURCE_DIR) + "/resources/jobs";
  const std::string dir = (fs::temp_directory_path() / ("bench_render-" + std::to_string(::getpid()))).string();
  fs::create_directories(dir);
  for (const char* f : {"hills_256.png", "hills_256_mask.png", "dusk_256.png", "dusk_256_mask.png"})
    fs::copy_file(jobs + "/" + f, dir + "/" + f, fs::copy_options::overwrite_existing);
  const int per_template = count / 2;
  const json job = {
      {"format", "infill-job/1"},
      {"defaults", {{"steps", steps}, {"output", "out/{name}_{seed:03}.png"}}},
      {"edits",
       {{{"name", "hills"}, {"template", "hills_256.png"}, {"mask", "hills_256_mask.png"}, {"prompt", "green"},
         {"seeds", {{"first", 1}, {"count", per_template}}}},
        {{"name", "dusk"}, {"template", "dusk_256.png"}, {"mask", "dusk_256_mask.png"}, {"prompt", "orange"},
         {"seeds", {{"first", 1}, {"count", count - per_template}}}}}}};
  std::ofstream(dir + "/job.json") << job.dump(2);
  const std::string t = std::to_string(threads);

  const Run cold = run_cli("cached, cold cache", {dir + "/job.json", "--cache-dir", dir + "/cache", "--threads", t, "--force"});
  fs::rename(dir + "/out", dir + "/out_cached");
  const Run warm = run_cli("cached, warm disk tier", {dir + "/job.json", "--cache-dir", dir + "/cache", "--threads", t, "--force"});
  // Remote: the engine's start-up (model load) is not part of the run, as on a farm node
  // where the engine is already up; its cache starts cold like the first embedded run.
  Run remote;
  bool remote_ran = false;
  std::string remote_why;
  {
    fs::create_directories(dir + "/engine");
    test::EngineProcess engine(dir + "/engine", threads);
    if (engine.ready()) {
      remote = run_cli("remote engine (unix socket), cold cache",
                       {dir + "/job.json", "--engine", "unix:" + engine.socket(), "--force"});
      remote_ran = true;
      std::error_code ec;
      fs::rename(dir + "/out", dir + "/out_remote", ec);
    } else {
      remote_why = "infill-engine did not start (build the infill-engine target)";
    }
  }
  const Run full = run_cli("full recompute", {dir + "/job.json", "--cache-dir", dir + "/cache", "--threads", t, "--force",
                                              "--no-cache"});

  // Quality: every cached output against its full-recompute twin; mask ratios.
  c10::InferenceMode guard;
  set_compute_threads(threads);
  std::vector<double> ssims;
  for (const auto& e : fs::directory_iterator(dir + "/out_cached")) {
    const std::string twin = dir + "/out/" + e.path().filename().string();
    auto a = load_image(e.path().string(), int64_t{1} << 24);
    auto b = load_image(twin, int64_t{1} << 24);
    if (a.ok() && b.ok()) ssims.push_back(train::ssim(to_rgb_tensor(*a), to_rgb_tensor(*b)));
  }
  json masks = json::object();
  for (const char* m : {"hills_256_mask.png", "dusk_256_mask.png"}) {
    auto mask = load_mask(dir + "/" + m, 256, 256);
    if (!mask.ok()) continue;
    // infill-tiny: latent factor 8, patch 2, halo 1 (the job's default).
    const TokenSet tokens = masked_tokens(latent_mask(*mask, 8), 2, 1);
    masks[m] = {{"pixel_ratio", mask->gt(0).to(at::kFloat).mean().item<double>()}, {"token_ratio_with_halo", tokens.ratio()}};
  }
  infill::remove_tree(dir);

  auto run_json = [&](const Run& r) {
    return json{{"wall_ms", r.wall_ms}, {"ms_per_edit", r.wall_ms / count}, {"exit_code", r.code}, {"saved", r.saved}};
  };
  json out;
  out["benchmark"] = "bench_render";
  out["machine"] = bench::machine_info();
  out["machine"]["torch_threads"] = threads;
  out["job"] = {{"edits", count},
                {"templates", 2},
                {"template_size", "256x256"},
                {"model", "infill-tiny (bundled)"},
                {"steps", steps},
                {"guidance", "model default (3.0): 2 segments per step"},
                {"masks", masks},
                {"max_in_flight", 8}};
  out["embedded"] = {{"cached_cold", run_json(cold)}, {"cached_warm_disk", run_json(warm)}, {"full_recompute", run_json(full)}};
  if (remote_ran) {
    out["remote"] = run_json(remote);
    out["remote"]["transport"] = "unix socket, infill-engine child process, client SDK";
  } else {
    out["remote"] = {{"measured", false}, {"why", remote_why}};
  }
  out["speedup_end_to_end"] = {{"cold_cache_vs_full", full.wall_ms / cold.wall_ms},
                               {"warm_cache_vs_full", full.wall_ms / warm.wall_ms}};
  if (remote_ran && remote.code == 0) out["speedup_end_to_end"]["remote_vs_embedded_full"] = full.wall_ms / remote.wall_ms;
  if (!ssims.empty()) {
    double sum = 0;
    for (double s : ssims) sum += s;
    out["ssim_cached_vs_full"] = {{"pairs", ssims.size()},
                                  {"mean", sum / double(ssims.size())},
                                  {"min", *std::min_element(ssims.begin(), ssims.end())}};
  }
  out["notes"] = "each run is infill-render's command line in process (model load, validation, hashing, serving "
                 "runtime, PNG writes), outputs forced; wall time includes template preparation in the cold run";
  std::cout << out.dump(2) << std::endl;
  return (cold.code || warm.code || full.code || (remote_ran && remote.code)) ? 1 : 0;
}
