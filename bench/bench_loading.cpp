// Edit latency through the worker when the template's cache entry is in RAM, against the same
// entry only on disk: streamed under the load plan (reads overlapping the blocks before, some
// leading blocks recomputed where reading them would stall), and read whole before computing
// (every block loaded, no overlap). The bundled DiT model (infill-tiny), 512x512, one
// rectangle of about 10% of the tokens. The page cache of the entry's file is dropped before every disk edit
// (fdatasync, then posix_fadvise DONTNEED on every file of the cache folder), so every disk
// edit reads the device. Prints one JSON document.
//
// usage: bench_loading [--repeats N] [--threads N] [--model DIR] [--dir DIR] [--no-calibrate]
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <future>
#include <iostream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>

#include "bench_stats.h"
#include "cache/activation_store.h"
#include "common/remove_tree.h"
#include "machine_info.h"
#include "model/compute_device.h"
#include "model/compute_threads.h"
#include "pipeline/bundled_models.h"
#include "pipeline/edit_pipeline.h"
#include "pipeline/image_io.h"
#include "pipeline/load_edit_model.h"
#include "serving/cost_calibration.h"
#include "serving/serving_runtime.h"

namespace {

double median(std::vector<double> v) { return infill::bench::percentile(std::move(v), 0.5); }

[[noreturn]] void die(const std::string& what) {
  std::cerr << "bench_loading: " << what << "\n";
  std::exit(1);
}

// Writes back and drops the page cache of every file in `dir`: the next read goes to the device.
void drop_page_cache(const std::string& dir) {
  for (const auto& file : std::filesystem::directory_iterator(dir)) {
    if (!file.is_regular_file()) continue;
    const int fd = ::open(file.path().c_str(), O_RDONLY);
    if (fd < 0) die("cannot open " + file.path().string());
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

// A 512x512 picture with texture at every scale (gradients, stripes, noise).
infill::PixelImage picture() {
  infill::PixelImage img = infill::PixelImage::allocate(512, 512, 3, infill::PixelFormat::kU8);
  auto* p = reinterpret_cast<uint8_t*>(img.data.data());
  uint32_t state = 12345;
  for (int y = 0; y < 512; ++y)
    for (int x = 0; x < 512; ++x)
      for (int c = 0; c < 3; ++c) {
        state = state * 1664525u + 1013904223u;
        const int v = (x / 2 + y / 3 + c * 60 + ((x / 32 + y / 32) % 2) * 50 + static_cast<int>(state >> 28)) % 256;
        p[(y * 512 + x) * 3 + c] = static_cast<uint8_t>(v);
      }
  return img;
}

struct Edit {
  double total_ms = 0;
  infill::RequestMetrics metrics;
};

// One edit through `rt`, waited for, then the runtime drained (its pool done too).
Edit run_edit(infill::ServingRuntime& rt, uint64_t id, const std::shared_ptr<const infill::TemplateImage>& tmpl,
              const infill::EditParams& params) {
  std::promise<infill::RequestResult> done;
  infill::ServingRequest r;
  r.id = id;
  r.client_id = 1;
  r.tmpl = tmpl;
  r.params = params;
  r.encode_result = false;
  r.on_complete = [&done](const infill::RequestResult& result) { done.set_value(result); };
  if (infill::Status st = rt.submit(std::move(r)); !st.ok()) die("submit: " + st.to_string());
  const infill::RequestResult result = done.get_future().get();
  if (result.state != infill::RequestState::kDone) die("edit " + std::to_string(id) + ": " + result.status.to_string());
  rt.drain(600000);
  return {result.metrics.total_ms, result.metrics};
}

}  // namespace

int main(int argc, char** argv) {
  int repeats = 9, threads = 0;
  bool calibrate = true;
  std::string model_dir, dir;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) die(flag + " needs a value");
      return argv[++i];
    };
    auto number = [&](int lo) {
      const std::string v = value();
      try {
        size_t used = 0;
        const int n = std::stoi(v, &used);
        if (used == v.size() && n >= lo) return n;
      } catch (const std::exception&) {
      }
      die(flag + " is '" + v + "', expected an integer >= " + std::to_string(lo));
    };
    if (flag == "--repeats") repeats = number(1);
    else if (flag == "--threads") threads = number(1);
    else if (flag == "--model") model_dir = value();
    else if (flag == "--dir") dir = value();
    else if (flag == "--no-calibrate") calibrate = false;
    else die("unknown option '" + flag + "'\nusage: bench_loading [--repeats N] [--threads N] [--model DIR] [--dir DIR] [--no-calibrate]");
  }
  infill::set_compute_threads(threads);
  c10::InferenceMode guard;
  if (model_dir.empty()) {
    // The first bundled model of the DiT family (a manifest.json folder): infill-tiny, since
    // the default infill-tiny-2 is FLUX.2, which loads every block of a streamed entry.
    for (const std::string& dir : infill::bundled_model_dirs(INFILL_SOURCE_DIR)) {
      if (std::filesystem::exists(std::filesystem::path(dir) / "manifest.json")) {
        model_dir = dir;
        break;
      }
    }
    if (model_dir.empty()) die("no bundled model of the DiT family found; give --model DIR");
  }
  auto loaded = infill::load_edit_model(model_dir);
  if (!loaded.ok()) die(loaded.status().to_string());
  if (!loaded->dit) die(model_dir + ": streaming from disk is measured on the DiT family (FLUX.2 reads entries whole)");
  const std::shared_ptr<const infill::EditModel> model = loaded->model;
  // The cache folder must be on a real disk (not a tmpfs /tmp): by default next to the binary.
  if (dir.empty()) dir = std::filesystem::absolute("bench-loading-cache").string();
  infill::remove_tree(dir);
  std::filesystem::create_directories(dir);

  auto png = infill::encode_png(picture());
  auto tmpl_or = model->make_template(*png, "picture.png");
  if (!tmpl_or.ok()) die(tmpl_or.status().to_string());
  const std::shared_ptr<const infill::TemplateImage> tmpl = *tmpl_or;
  // One rectangle: 8x8 tokens plus the one-token halo = 100 of the 1024 tokens.
  const int tp = model->token_pixels();
  infill::EditParams params;
  params.mask = at::zeros({512, 512});
  params.mask.narrow(0, 12 * tp, 8 * tp).narrow(1, 10 * tp, 8 * tp).fill_(1.0);
  params.seed = 7;
  params.guidance_scale = model->info().default_guidance;
  if (!model->info().vocabulary.empty()) {
    if (infill::Status st = model->set_prompt(params, model->info().vocabulary.front()); !st.ok()) die(st.to_string());
  }

  // The step cost on this machine, as the engine measures it (--calibrate), for the plan.
  std::shared_ptr<const infill::StepCostModel> cost;
  if (calibrate) {
    infill::CalibrationOptions co;
    co.threads = at::get_num_threads();
    co.cache_path = dir + "/../bench-loading-calibration.json";
    auto cal = infill::load_or_calibrate(*loaded->dit, co);
    if (!cal.ok()) die(cal.status().to_string());
    cost = std::make_shared<const infill::StepCostModel>(cal->model);
  } else {
    cost = std::make_shared<const infill::StepCostModel>(infill::StepCostModel::plausible());
  }

  // The entry: recorded once, then kept in RAM for the resident runtime and written to disk.
  infill::EditPipeline pipeline(loaded->dit, nullptr);
  auto entry = pipeline.prepare(*tmpl, params.schedule);
  if (!entry.ok()) die(entry.status().to_string());
  const infill::ActivationKey key = model->cache_key(*tmpl, params);
  auto open_store = [&](size_t ram_bytes, const std::string& disk_dir) {
    infill::ActivationStoreOptions o;
    o.ram_budget_bytes = ram_bytes;
    o.disk_dir = disk_dir;
    auto s = infill::ActivationStore::open(o);
    if (!s.ok()) die(s.status().to_string());
    return std::shared_ptr<infill::ActivationStore>(std::move(*s));
  };
  auto resident_store = open_store(size_t{4} << 30, "");
  if (!resident_store->put(key, *entry).ok()) die("resident put");
  // RAM budget 1 byte: the entry goes straight to disk and is never promoted, so every edit
  // of the disk runtimes reads the device.
  auto disk_store = open_store(1, dir);
  if (!disk_store->put(key, *entry).ok()) die("disk put");
  if (disk_store->tier_of(key) != infill::Tier::kDisk) die("the entry is not on disk");
  const infill::ActivationLayout layout = (*entry)->layout();

  infill::RuntimeOptions o;
  o.threads_per_worker = at::get_num_threads();
  auto make_runtime = [&](std::shared_ptr<infill::ActivationStore> store, bool stream) {
    infill::RuntimeOptions ro = o;
    ro.worker.stream_from_disk = stream;
    auto rt = infill::ServingRuntime::create(model, std::move(store), cost, ro);
    if (!rt.ok()) die(rt.status().to_string());
    return std::move(*rt);
  };
  auto resident_rt = make_runtime(resident_store, true);
  auto plan_rt = make_runtime(disk_store, true);
  auto naive_rt = make_runtime(disk_store, false);

  // Warm-up (not counted): one edit each; the plan runtime times its first reads here.
  uint64_t id = 1;
  drop_page_cache(dir);
  run_edit(*resident_rt, id++, tmpl, params);
  drop_page_cache(dir);
  run_edit(*plan_rt, id++, tmpl, params);
  drop_page_cache(dir);
  run_edit(*naive_rt, id++, tmpl, params);

  // Interleaved repeats: machine drift touches the three alike.
  std::vector<double> resident_ms, plan_ms, naive_ms;
  nlohmann::json plans = nlohmann::json::array();
  int64_t masked_tokens = 0, total_tokens = 0;
  for (int r = 0; r < repeats; ++r) {
    const Edit res = run_edit(*resident_rt, id++, tmpl, params);
    resident_ms.push_back(res.total_ms);
    masked_tokens = res.metrics.masked_tokens;
    total_tokens = res.metrics.total_tokens;
    drop_page_cache(dir);
    const Edit plan = run_edit(*plan_rt, id++, tmpl, params);
    if (!plan.metrics.streamed) die("the plan runtime's edit did not stream");
    plan_ms.push_back(plan.total_ms);
    plans.push_back({{"blocks_loaded", plan.metrics.blocks_loaded}, {"blocks_recomputed", plan.metrics.blocks_recomputed}});
    drop_page_cache(dir);
    const Edit naive = run_edit(*naive_rt, id++, tmpl, params);
    if (naive.metrics.streamed) die("the naive runtime's edit streamed");
    naive_ms.push_back(naive.total_ms);
  }
  const double resident = median(resident_ms), plan = median(plan_ms), naive = median(naive_ms);
  // Each repeat's own ratios (its three edits ran back to back), whose median is steadier than
  // the ratio of medians on a machine whose speed drifts.
  std::vector<double> plan_resident, plan_naive;
  for (int r = 0; r < repeats; ++r) {
    plan_resident.push_back(plan_ms[r] / resident_ms[r]);
    plan_naive.push_back(plan_ms[r] / naive_ms[r]);
  }
  const infill::WorkerMetrics plan_worker = plan_rt->worker_metrics().at(0);
  nlohmann::json out = {
      {"benchmark", "bench_loading"},
      {"machine", infill::bench::machine_info()},
      {"device", infill::describe_compute_device(model->device())},
      {"model", {{"name", model->name()}, {"dir", model_dir}}},
      {"image", "512x512"},
      {"mask", {{"masked_tokens", masked_tokens}, {"total_tokens", total_tokens}}},
      {"steps", layout.steps},
      {"entry",
       {{"bytes", layout.total_elements() * sizeof(uint16_t)},
        {"blocks", layout.blocks},
        {"slab_bytes", 2 * layout.slab_elements() * sizeof(uint16_t)}}},
      {"cost_model", calibrate ? "calibrated at start (load_or_calibrate)" : "plausible (fixed)"},
      {"page_cache", "dropped before every disk edit: fdatasync + posix_fadvise(POSIX_FADV_DONTNEED) on the cache files"},
      {"repeats", repeats},
      {"statistic", "median of submit-to-result latency through the worker (ServingRuntime), interleaved"},
      {"resident_ms", resident},
      {"disk_plan_ms", plan},
      {"disk_naive_ms", naive},
      {"plan_over_resident", plan / resident},
      {"plan_over_naive", plan / naive},
      {"paired_plan_over_resident_median", median(plan_resident)},
      {"paired_plan_over_naive_median", median(plan_naive)},
      {"plans", plans},
      {"measured_read_mb_per_s", plan_worker.read_bytes_per_ms / 1000.0},
      {"samples_ms", {{"resident", resident_ms}, {"disk_plan", plan_ms}, {"disk_naive", naive_ms}}},
      {"targets",
       {{"disk_plan_le_1.2x_resident", {{"value", plan / resident}, {"met", plan <= 1.2 * resident}}},
        {"disk_plan_lt_disk_naive", {{"value", plan / naive}, {"met", plan < naive}}}}}};
  std::cout << out.dump(2) << std::endl;
  resident_rt.reset();
  plan_rt.reset();
  naive_rt.reset();
  infill::remove_tree(dir);
  return 0;
}
