// Edit latency through the worker when the template's cache entry is in RAM, against the same
// entry only on disk: streamed under the load plan (reads overlapping the blocks before, some
// leading blocks recomputed where reading them would stall), and read whole before computing
// (every block loaded, no overlap). The default bundled model (infill-tiny 2, FLUX.2; or any
// model folder, infill-tiny's DiT too), on the CPU or a CUDA GPU (--device), 512x512, one
// rectangle of about 10% of the image tokens. The page cache of the entry's file is dropped
// before every disk edit (fdatasync, then posix_fadvise DONTNEED on every file of the cache
// folder), so every disk edit reads the device. Prints one JSON document.
//
// usage: bench_loading [--repeats N] [--threads N] [--model DIR] [--device cpu|cuda[:N]] [--dir DIR] [--no-calibrate]
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <future>
#include <iostream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>

#include "common/blas_kernel.h"
#include "bench_stats.h"
#include "cache/activation_store.h"
#include "common/remove_tree.h"
#include "machine_info.h"
#include "model/compute_device.h"
#include "model/compute_threads.h"
#include "pipeline/bundled_models.h"
#include "pipeline/flux2_edit_model.h"
#include "pipeline/image_io.h"
#include "pipeline/load_edit_model.h"
#include "serving/cost_calibration.h"
#include "serving/live_cost_model.h"
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
  infill::select_blas_kernel();  // first: before any GEMM (common/blas_kernel.h)
  int repeats = 9, threads = 0;
  bool calibrate = true;
  std::string model_dir, dir;
  infill::ComputeDevice device;
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
    else if (flag == "--device") {
      auto parsed = infill::parse_compute_device(value());
      if (!parsed.ok()) die(parsed.status().to_string());
      device = *parsed;
    } else if (flag == "--dir") dir = value();
    else if (flag == "--no-calibrate") calibrate = false;
    else die("unknown option '" + flag + "'\nusage: bench_loading [--repeats N] [--threads N] [--model DIR] [--device cpu|cuda[:N]] [--dir DIR] [--no-calibrate]");
  }
  infill::set_compute_threads(threads);
  c10::InferenceMode guard;
  if (model_dir.empty()) {
    const std::vector<std::string> bundled = infill::bundled_model_dirs(INFILL_SOURCE_DIR);
    if (bundled.empty()) die("no bundled model found; give --model DIR");
    model_dir = bundled.front();
  }
  if (infill::Status usable = infill::check_compute_device(device); !usable.ok()) die(usable.to_string());
  auto loaded = infill::load_edit_model(model_dir, device);
  if (!loaded.ok()) die(loaded.status().to_string());
  const std::shared_ptr<const infill::EditModel> model = loaded->model;
  if (model->streamable_blocks() <= 0) die(model_dir + ": this model's edits do not stream entries from disk");
  // The cache folder must be on a real disk (not a tmpfs /tmp): by default next to the binary.
  if (dir.empty()) dir = std::filesystem::absolute("bench-loading-cache").string();
  infill::remove_tree(dir);
  std::filesystem::create_directories(dir);

  // FLUX.2 from pixels (a build without OpenImageIO, as on a GPU machine, reads no image file).
  auto tmpl_or = [&]() -> infill::Result<std::shared_ptr<const infill::TemplateImage>> {
    if (auto flux2 = std::dynamic_pointer_cast<const infill::Flux2EditModel>(model)) {
      const infill::LatentCodec& codec = *flux2->parts().codec;
      return infill::template_from_pixels(codec, codec.factor(), 0.0, 1.0, picture(), "bench-loading-picture");
    }
    auto png = infill::encode_png(picture());
    if (!png.ok()) return png.status();
    return model->make_template(*png, "picture.png");
  }();
  if (!tmpl_or.ok()) die(tmpl_or.status().to_string());
  const std::shared_ptr<const infill::TemplateImage> tmpl = *tmpl_or;
  // One rectangle: 8x8 tokens plus the one-token halo = 100 of the 1024 tokens.
  const int tp = model->token_pixels();
  infill::EditParams params;
  params.mask = at::zeros({512, 512});
  params.mask.narrow(0, 12 * tp, 8 * tp).narrow(1, 10 * tp, 8 * tp).fill_(1.0);
  params.seed = 7;
  params.guidance_scale = model->info().default_guidance;
  const std::string prompt = model->info().vocabulary.empty() ? "make it dark blue" : model->info().vocabulary.front();
  if (infill::Status st = model->set_prompt(params, prompt); !st.ok()) die(st.to_string());

  // The step cost on this machine, as the engine measures it (--calibrate, the DiT family),
  // for the plan; FLUX.2 starts from the plausible coefficients, which the worker refits on its
  // own timed steps (serving/live_cost_model.h): the warm-up edits feed it.
  std::shared_ptr<const infill::StepCostModel> cost;
  if (calibrate && loaded->dit) {
    infill::CalibrationOptions co;
    co.threads = at::get_num_threads();
    co.cache_path = dir + "/../bench-loading-calibration.json";
    auto cal = infill::load_or_calibrate(*loaded->dit, co);
    if (!cal.ok()) die(cal.status().to_string());
    cost = std::make_shared<const infill::StepCostModel>(cal->model);
  } else {
    cost = std::make_shared<const infill::StepCostModel>(infill::StepCostModel::plausible());
  }

  // The entry: recorded once by the model's own prepare run, then kept in RAM for the resident
  // runtime and written to disk.
  auto prepare = model->create_prepare(tmpl, params);
  if (!prepare.ok()) die(prepare.status().to_string());
  while (!(*prepare)->done()) (*prepare)->run_step();
  const std::shared_ptr<const infill::ActivationEntry> entry = (*prepare)->entry();
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
  if (!resident_store->put(key, entry).ok()) die("resident put");
  // RAM budget 1 byte: the entry goes straight to disk and is never promoted, so every edit
  // of the disk runtimes reads the device.
  auto disk_store = open_store(1, dir);
  if (!disk_store->put(key, entry).ok()) die("disk put");
  if (disk_store->tier_of(key) != infill::Tier::kDisk) die("the entry is not on disk");
  const infill::ActivationLayout layout = entry->layout();

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

  // Warm-up (not counted): the plan runtime times its first reads here, and its cost model
  // refits on the steps it timed (every LiveCostModel::kRefitEvery steps).
  uint64_t id = 1;
  const int warmups = std::max(1, static_cast<int>(infill::LiveCostModel::kRefitEvery) / std::max(1, layout.steps));
  for (int w = 0; w < warmups; ++w) {
    drop_page_cache(dir);
    run_edit(*resident_rt, id++, tmpl, params);
    drop_page_cache(dir);
    run_edit(*plan_rt, id++, tmpl, params);
    drop_page_cache(dir);
    run_edit(*naive_rt, id++, tmpl, params);
  }

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
      {"machine", infill::bench::machine_info(device.cuda ? infill::describe_compute_device(device) : "none used")},
      {"device", infill::describe_compute_device(model->device())},
      {"model", {{"name", model->name()}, {"dir", model_dir}, {"family", model->info().family}}},
      {"prompt", prompt},
      {"guidance", params.guidance_scale},
      {"warmup_edits_each", warmups},
      {"image", "512x512"},
      {"mask", {{"masked_tokens", masked_tokens}, {"total_tokens", total_tokens}}},
      {"steps", layout.steps},
      {"entry",
       {{"bytes", layout.total_elements() * sizeof(uint16_t)},
        {"blocks", layout.blocks},
        {"slab_bytes", layout.block_bytes()}}},
      {"cost_model", calibrate && loaded->dit ? "calibrated at start (load_or_calibrate)"
                     : loaded->dit          ? "plausible (fixed)"
                                            : "plausible at start, refitted by the worker on its timed steps"},
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
