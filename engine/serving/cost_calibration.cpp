#include "serving/cost_calibration.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>

#include "cache/activation_store.h"
#include "pipeline/cached_kv.h"

namespace infill {
namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

template <class F>
double time_ms(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

Status write_file_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return io_error("cannot write cost model file " + tmp);
    out << text;
    if (!out.flush()) return io_error("cannot write cost model file " + tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return io_error("cannot rename " + tmp + " to " + path + ": " + ec.message());
  return {};
}

std::string to_json(const Calibration& c) {
  nlohmann::json j;
  j["format"] = "infill-serving-calibration";
  j["version"] = 1;
  j["step_cost"] = nlohmann::json::parse(c.model.to_json());
  j["held_out"] = {{"r2", c.held_out.r2}, {"mape", c.held_out.mape}, {"train", c.held_out.train}, {"test", c.held_out.test}};
  j["tiers"] = {{"ram_ms_per_block", c.tiers.ram_ms_per_block}, {"disk_ms_per_block", c.tiers.disk_ms_per_block}};
  j["full_step_ms"] = c.full_step_ms;
  return j.dump(2);
}

Result<Calibration> from_json(const std::string& text, const std::string& path) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || j.value("format", "") != "infill-serving-calibration" ||
      !j.contains("step_cost") || !j.contains("held_out") || !j.contains("tiers") || !j.contains("full_step_ms")) {
    return corrupt_data("calibration file " + path + " is not an infill-serving-calibration document");
  }
  INFILL_ASSIGN_OR_RETURN(StepCostModel model, StepCostModel::from_json(j["step_cost"].dump()));
  Calibration c;
  c.model = std::move(model);
  try {
    c.held_out.r2 = j["held_out"].at("r2").get<double>();
    c.held_out.mape = j["held_out"].at("mape").get<double>();
    c.held_out.train = j["held_out"].at("train").get<size_t>();
    c.held_out.test = j["held_out"].at("test").get<size_t>();
    c.tiers.ram_ms_per_block = j["tiers"].at("ram_ms_per_block").get<double>();
    c.tiers.disk_ms_per_block = j["tiers"].at("disk_ms_per_block").get<double>();
    c.full_step_ms = j["full_step_ms"].get<double>();
  } catch (const std::exception&) {
    return corrupt_data("calibration file " + path + " has a malformed held_out, tiers or full_step_ms field");
  }
  c.loaded = true;
  return c;
}

// Restores the calling thread's libtorch thread count on scope exit.
class ThreadCount {
 public:
  explicit ThreadCount(int n) : saved_(at::get_num_threads()) { at::set_num_threads(std::max(1, n)); }
  ~ThreadCount() { at::set_num_threads(saved_); }

 private:
  int saved_;
};

}  // namespace

std::string calibration_fingerprint(const Model& model, const CalibrationOptions& o) {
  return StepCostModel::make_fingerprint(
      model.id + "/grid=" + std::to_string(o.latent_width) + "x" + std::to_string(o.latent_height), o.threads);
}

Result<Calibration> calibrate_step_cost(const Model& model, const CalibrationOptions& o) {
  const DitConfig& cfg = model.manifest.dit;
  if (o.latent_width <= 0 || o.latent_height <= 0 || o.latent_width % cfg.patch_size || o.latent_height % cfg.patch_size) {
    return invalid_argument("calibration latent grid " + std::to_string(o.latent_width) + "x" +
                            std::to_string(o.latent_height) + " must be positive multiples of the patch size " +
                            std::to_string(cfg.patch_size));
  }
  if (o.points < 8 || o.repeats < 1 || o.max_batch < 1 || o.mask_ratios.empty() ||
      !(o.held_out_fraction > 0 && o.held_out_fraction < 1)) {
    return invalid_argument("calibration options: points >= 8, repeats >= 1, max_batch >= 1, mask_ratios non-empty "
                            "and held_out_fraction in (0, 1) expected");
  }
  ThreadCount threads(o.threads);
  c10::InferenceMode guard;
  const Dit& dit = model.dit;
  const int gh = o.latent_height / cfg.patch_size, gw = o.latent_width / cfg.patch_size;
  const int64_t total = int64_t{gh} * gw;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  const at::Tensor rows = dit.patchify(at::randn({cfg.in_channels(), o.latent_height, o.latent_width}, gen));
  const at::Tensor cond = dit.conditioning(500.0, at::Tensor());
  // Cached K/V of one step: the content does not change the cost, only the conversion does.
  auto entry = std::make_shared<ActivationEntry>(ActivationLayout{1, cfg.depth, static_cast<int>(total), cfg.hidden_size});
  std::fill(entry->data(), entry->data() + entry->layout().total_elements(), uint16_t{0x3c00});  // 1.0

  std::mt19937_64 rng(o.seed);
  // Every point's batch first, then `repeats` timing passes over all of them, the median per
  // point: a burst of noise on a shared machine (a neighbour, a daemon) then spoils one timing
  // of many points, which the median drops, rather than every timing of a few points.
  struct Point {
    std::vector<DitSegment> segments;
    std::vector<std::unique_ptr<EntryKvSource>> sources;
    StepSample sample;
    std::vector<double> ms;
  };
  std::vector<Point> points(static_cast<size_t>(o.points));
  for (Point& pt : points) {
    const int batch = 1 + static_cast<int>(rng() % static_cast<uint64_t>(o.max_batch));
    pt.sample = StepSample{0, double(batch), 0, 0};
    for (int b = 0; b < batch; ++b) {
      const double ratio = o.mask_ratios[rng() % o.mask_ratios.size()];
      const int64_t m = std::clamp<int64_t>(static_cast<int64_t>(ratio * double(total)), 1, total);
      const at::Tensor ids = std::get<0>(at::randperm(total, gen).narrow(0, 0, m).sort());
      pt.sources.push_back(std::make_unique<EntryKvSource>(entry, 0));
      DitSegment seg;
      seg.tokens = rows.index_select(0, ids);
      seg.token_ids = ids;
      seg.grid_h = gh;
      seg.grid_w = gw;
      seg.cond = cond;
      seg.null_cond = cond;
      seg.kv = pt.sources.back().get();
      pt.segments.push_back(seg);
      pt.sample.tokens += double(m);
      pt.sample.attention_work += double(m) * double(total);
    }
  }
  for (Point& pt : points) (void)dit.forward(pt.segments);  // warm-up
  for (int r = 0; r < o.repeats; ++r) {
    for (Point& pt : points) pt.ms.push_back(time_ms([&] { (void)dit.forward(pt.segments); }));
  }
  std::vector<StepSample> samples;
  for (Point& pt : points) {
    pt.sample.ms = median(pt.ms);
    samples.push_back(pt.sample);
  }
  std::shuffle(samples.begin(), samples.end(), rng);
  const size_t n_test = std::max<size_t>(2, static_cast<size_t>(o.held_out_fraction * double(samples.size())));
  Calibration c;
  c.test.assign(samples.begin(), samples.begin() + static_cast<std::ptrdiff_t>(n_test));
  c.train.assign(samples.begin() + static_cast<std::ptrdiff_t>(n_test), samples.end());
  INFILL_ASSIGN_OR_RETURN(c.model, StepCostModel::fit(c.train));
  c.model.set_fingerprint(calibration_fingerprint(model, o));
  INFILL_ASSIGN_OR_RETURN(c.held_out, c.model.evaluate(c.test));

  // A prepare slice: the full grid through every block.
  {
    DitSegment seg;
    seg.tokens = rows;
    seg.token_ids = at::arange(total, at::kLong);
    seg.grid_h = gh;
    seg.grid_w = gw;
    seg.cond = cond;
    seg.null_cond = cond;
    seg.full_blocks = cfg.depth;
    seg.carry_rows = seg.token_ids.narrow(0, 0, 1);
    DitSegment segs[] = {seg};
    (void)dit.forward(segs);
    std::vector<double> ms;
    for (int r = 0; r < o.repeats; ++r) ms.push_back(time_ms([&] { (void)dit.forward(segs); }));
    c.full_step_ms = median(ms);
  }
  // Tier costs per block: RAM = fp16 -> fp32 of K and V; disk = a verified slab read + that.
  {
    EntryKvSource source(entry, 0);
    at::Tensor k = at::empty({total, cfg.hidden_size}), v = at::empty({total, cfg.hidden_size});
    std::vector<double> ms;
    for (int r = 0; r < 5; ++r) ms.push_back(time_ms([&] { source.fetch(r % cfg.depth, k, v); }));
    c.tiers.ram_ms_per_block = median(ms);
    if (!o.disk_dir.empty()) {
      ActivationStoreOptions so;
      so.ram_budget_bytes = 0;  // straight to disk
      so.disk_dir = o.disk_dir;
      auto store = ActivationStore::open(so);
      if (!store.ok()) return store.status();
      ActivationKey key;
      key.model_id = model.id;
      key.template_hash = "calibration";
      key.width = o.latent_width;
      key.height = o.latent_height;
      key.steps = 1;
      key.sampler = "calibration";
      INFILL_RETURN_IF_ERROR((*store)->put(key, entry));
      std::vector<uint16_t> kb(entry->layout().slab_elements()), vb(kb.size());
      std::vector<double> disk;
      for (int r = 0; r < 5; ++r) {
        Status st;
        disk.push_back(time_ms([&] { st = (*store)->read_slab(key, 0, r % cfg.depth, kb.data(), vb.data()); }));
        INFILL_RETURN_IF_ERROR(st);
      }
      (*store)->erase(key);
      c.tiers.disk_ms_per_block = median(disk) + c.tiers.ram_ms_per_block;
    }
  }
  if (!o.cache_path.empty()) INFILL_RETURN_IF_ERROR(write_file_atomic(o.cache_path, to_json(c)));
  return c;
}

Result<Calibration> load_or_calibrate(const Model& model, const CalibrationOptions& o) {
  if (!o.cache_path.empty()) {
    std::ifstream in(o.cache_path, std::ios::binary);
    if (in) {
      std::stringstream text;
      text << in.rdbuf();
      auto loaded = from_json(text.str(), o.cache_path);
      if (loaded.ok() && loaded->model.fingerprint() == calibration_fingerprint(model, o)) return loaded;
    }
  }
  return calibrate_step_cost(model, o);
}

}  // namespace infill
