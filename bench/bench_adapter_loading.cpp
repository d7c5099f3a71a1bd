// bench_adapter_loading: Katz's bounded asynchronous adapter loading (pipeline/adapter_load.h)
// on the bundled 16-step model (infill-tiny 2, guidance 3), in one run on one machine:
// - what K costs: SSIM over the mask's box between an edit whose LoRA applies from step K
//   (K = 2, 4, 8) and the same edit with it from step 0 (synchronous loading), on the sample
//   template and mask with 3 prompts x 2 seeds, through the engine's template-keyed path; and,
//   for scale, SSIM between the edit with the LoRA and without it. The bundled model has no
//   trained LoRAs: the LoRA is random (rank 16 on every projection, each update about 30 % of
//   the weight's scale), so the figures say how much of an adapter's effect K steps without it
//   lose, not how a given style fares;
// - a cold adapter in the serving runtime: a running edit A (16 steps) and an edit B whose
//   LoRA (rank 256, page cache dropped) is not in memory, submitted after A's second step:
//   B's submission -> first step and -> result, and A's step intervals (median, P95) against A
//   alone, with the adapter already in memory (the baseline: B's packed steps cost A the
//   same whatever the loading), read before B is admitted (synchronous: the engine before this
//   loading) and read on another thread while B is set up and runs (K = 0 and K = 2).
// Prints one JSON document. --only k|cold runs one part.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iterator>
#include <filesystem>
#include <future>
#include <iostream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>

#include "bench_stats.h"
#include "common/blas_kernel.h"
#include "common/hash.h"
#include "flux2_bench_inputs.h"
#include "machine_info.h"
#include "model/compute_threads.h"
#include "model/lora_adapter.h"
#include "model/safetensors_torch.h"
#include "pipeline/adapter_load.h"
#include "pipeline/flux2_edit_model.h"
#include "pipeline/image_io.h"
#include "pipeline/load_edit_model.h"
#include "pipeline/mask.h"
#include "process_memory.h"
#include "serving/cost_model.h"
#include "serving/serving_runtime.h"
#include "tools/train/image_metrics.h"

namespace fs = std::filesystem;
using namespace infill;

namespace {

using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }

[[noreturn]] void fail(const std::string& what) {
  std::cerr << "bench_adapter_loading: " << what << "\n";
  std::exit(1);
}

template <class T>
T must(Result<T> r, const std::string& what) {
  if (!r.ok()) fail(what + ": " + r.status().to_string());
  return std::move(*r);
}

// A random LoRA of `rank` on every attention and MLP projection of the blocks, upstream names.
// Each update B A has about `relative` of the scale of a weight initialised at 1 / sqrt(in).
void write_lora(const std::string& path, const Flux2Config& cfg, int64_t rank, double relative, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const Flux2LinearLayer& l : flux2_linear_layers(cfg)) {
    if (l.name.find("_blocks.") == std::string::npos) continue;
    const std::string module = "diffusion_model." + l.name.substr(0, l.name.size() - 7);
    tensors.emplace_back(module + ".lora_A.weight", at::empty({rank, l.in}).normal_(0, 1.0 / std::sqrt(double(l.in)), gen));
    tensors.emplace_back(module + ".lora_B.weight", at::empty({l.out, rank}).normal_(0, relative / std::sqrt(double(rank)), gen));
  }
  if (Status st = write_safetensors(path, tensors); !st.ok()) fail(st.to_string());
}

std::string file_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// An adapter's id: the SHA-256 of its file (as the adapter store names it).
std::string lora_id_of(const std::string& path) {
  const std::string bytes = file_text(path);
  return sha256_hex(std::as_bytes(std::span<const char>(bytes.data(), bytes.size())));
}

at::Tensor box_of(const PixelImage& image, const PixelRect& box) {
  return to_rgb_tensor(image).narrow(1, box.y, box.height).narrow(2, box.x, box.width);
}

// One edit through the engine's own pieces (as the worker runs it): the template-keyed entry
// its prepare run records under the edit's adapters and K, then the masked steps.
PixelImage edit_alone(const EditModel& model, const std::shared_ptr<const TemplateImage>& tmpl, const EditParams& p) {
  auto prepare = must(model.create_prepare(tmpl, p), "prepare");
  while (!prepare->done()) prepare->run_step();
  auto session = must(model.create_session(tmpl, p, prepare->entry(), nullptr), "session");
  while (!session->done()) {
    StepSession* one = session.get();
    const at::Tensor rows = model.forward(std::span<StepSession* const>(&one, 1));
    if (Status st = session->apply(rows, session->step() + 1); !st.ok()) fail(st.to_string());
  }
  return must(session->finish(), "finish").image;
}

struct ServedEdit {
  std::vector<Clock::time_point> steps;  // when each step was reported
  Clock::time_point submitted, completed;
  RequestResult result;
};

}  // namespace

int main(int argc, char** argv) {
  select_blas_kernel();
  std::string source = INFILL_SOURCE_DIR;
  std::string only;
  int threads = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--source") source = value;
    else if (flag == "--threads") threads = std::stoi(value);
    else if (flag == "--only" && (value == "k" || value == "cold")) only = value;
    else fail("unknown option " + flag + " " + value + " (options: --source DIR, --threads N, --only k|cold)");
  }
  threads = set_compute_threads(threads);
  c10::InferenceMode guard;
  const std::string model_dir = source + "/resources/models/infill-tiny-2";
  LoadedEditModel loaded = must(load_edit_model(model_dir), "model " + model_dir);
  const auto flux2 = std::dynamic_pointer_cast<const Flux2EditModel>(loaded.model);
  if (!flux2) fail(model_dir + " is not a FLUX.2 model");
  const EditModel& model = *flux2;
  const Flux2Config& cfg = flux2->parts().transformer->config();

  nlohmann::ordered_json out;
  out["benchmark"] = "bench_adapter_loading";
  out["machine"] = bench::machine_info();
  out["device"] = "cpu, float32";
  out["model"] = {{"name", model.name()}, {"steps", model.info().default_steps}, {"guidance", model.info().default_guidance},
                  {"hidden", cfg.hidden_size}};

  const std::string picture = source + "/resources/templates/sample.png";
  const std::string bytes = file_text(picture);
  const auto tmpl = must(model.make_template(std::as_bytes(std::span<const char>(bytes.data(), bytes.size())), picture), "template");
  const at::Tensor mask = must(load_mask(source + "/resources/templates/sample_mask.png", tmpl->width, tmpl->height), "mask");
  const PixelRect box = bounding_box(mask, 0, 1);

  const fs::path dir = fs::temp_directory_path() / "infill-bench-adapter-loading";
  fs::create_directories(dir);
  const std::string style = (dir / "style-r16.safetensors").string();
  write_lora(style, cfg, 16, 0.3, 1);
  const auto lora = must(model.read_adapter(style), "LoRA");

  // ---- what K costs ----
  if (only != "cold") {
  const std::vector<std::string> prompts = {"make it dark blue", "a bright red patch", "green"};
  const std::vector<int> ks = {2, 4, 8};
  std::vector<std::vector<double>> ssim_k(ks.size());
  std::vector<double> ssim_lora;
  for (const std::string& prompt : prompts) {
    for (uint64_t seed : {uint64_t{1}, uint64_t{2}}) {
      EditParams p;
      p.mask = mask;
      p.seed = seed;
      p.guidance_scale = model.info().default_guidance;
      if (Status st = model.set_prompt(p, prompt); !st.ok()) fail(st.to_string());
      const PixelImage without = edit_alone(model, tmpl, p);
      p.adapters = {{lora, 1.0}};
      const PixelImage sync = edit_alone(model, tmpl, p);
      ssim_lora.push_back(train::ssim(box_of(sync, box), box_of(without, box)));
      for (size_t i = 0; i < ks.size(); ++i) {
        p.adapters_from_step = ks[i];
        ssim_k[i].push_back(train::ssim(box_of(edit_alone(model, tmpl, p), box), box_of(sync, box)));
      }
    }
  }
  const auto mean = [](const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return s / double(v.size());
  };
  nlohmann::ordered_json quality;
  quality["edits"] = prompts.size() * 2;
  quality["mask_box"] = {box.width, box.height};
  quality["lora"] = "random, rank 16, every block projection, updates ~30 % of the weights' scale, strength 1";
  quality["ssim_with_vs_without_lora"] = {{"mean", mean(ssim_lora)}, {"min", *std::min_element(ssim_lora.begin(), ssim_lora.end())}};
  nlohmann::ordered_json by_k = nlohmann::ordered_json::array();
  by_k.push_back({{"k", 0}, {"ssim_vs_synchronous", 1.0}});
  for (size_t i = 0; i < ks.size(); ++i)
    by_k.push_back({{"k", ks[i]},
                    {"ssim_vs_synchronous", mean(ssim_k[i])},
                    {"min", *std::min_element(ssim_k[i].begin(), ssim_k[i].end())}});
  quality["by_k"] = by_k;
  out["k_quality"] = quality;
  }
  if (only == "k") {
    std::cout << out.dump(2) << "\n";
    return 0;
  }

  // ---- a cold adapter in the serving runtime ----
  const std::string cold = (dir / "cold-r256.safetensors").string();
  write_lora(cold, cfg, 256, 0.3, 2);
  auto store_or = ActivationStore::open(ActivationStoreOptions{});
  auto store = std::shared_ptr<ActivationStore>(must(std::move(store_or), "store"));
  RuntimeOptions options;
  options.worker.compute_threads = threads;
  auto rt = must(ServingRuntime::create(flux2, store, std::make_shared<const StepCostModel>(StepCostModel::plausible()),
                                        std::move(options)),
                 "runtime");
  uint64_t next_id = 1;
  const auto submit = [&](EditParams p, ServedEdit& e, std::promise<void>* second_step) {
    auto done = std::make_shared<std::promise<void>>();
    auto finished = done->get_future();
    ServingRequest r;
    r.id = next_id++;
    r.tmpl = tmpl;
    r.params = std::move(p);
    r.encode_result = false;
    auto mu = std::make_shared<std::mutex>();
    r.on_progress = [&e, mu, second_step](const RequestProgress& pr) {
      std::lock_guard lock(*mu);
      e.steps.push_back(Clock::now());
      if (second_step != nullptr && pr.steps_done == 2) second_step->set_value();
    };
    r.on_complete = [&e, done](const RequestResult& res) {
      e.completed = Clock::now();
      e.result = res;
      done->set_value();
    };
    e.submitted = Clock::now();
    if (Status st = rt->submit(std::move(r)); !st.ok()) fail(st.to_string());
    return finished;
  };
  const auto base_params = [&](const std::string& prompt, uint64_t seed) {
    EditParams p;
    p.mask = mask;
    p.seed = seed;
    p.guidance_scale = model.info().default_guidance;
    if (Status st = model.set_prompt(p, prompt); !st.ok()) fail(st.to_string());
    return p;
  };
  const auto intervals = [](const ServedEdit& e) {
    std::vector<double> v;
    for (size_t i = 1; i < e.steps.size(); ++i) v.push_back(ms_between(e.steps[i - 1], e.steps[i]));
    return v;
  };
  // Warm: the template-keyed entries of both prompts (with and without the LoRA's key) exist
  // before timing, so that the timed edits step rather than prepare.
  {
    ServedEdit w1, w2;
    submit(base_params("make it dark blue", 3), w1, nullptr).wait();
    EditParams pb = base_params("a bright red patch", 4);
    pb.adapters = {{must(model.read_adapter(cold), "cold LoRA"), 1.0}};
    submit(pb, w2, nullptr).wait();
    EditParams pk = pb;
    pk.adapters_from_step = 2;
    ServedEdit w3;
    submit(pk, w3, nullptr).wait();
  }
  ServedEdit alone;
  submit(base_params("make it dark blue", 3), alone, nullptr).wait();
  const std::vector<double> alone_steps = intervals(alone);
  nlohmann::ordered_json cold_json;
  cold_json["file_bytes"] = fs::file_size(cold);
  cold_json["a_alone_step_ms"] = {{"median", bench::percentile(alone_steps, 0.5)}, {"p95", bench::percentile(alone_steps, 0.95)}};
  nlohmann::ordered_json modes = nlohmann::ordered_json::array();
  const auto held = must(model.read_adapter(cold), "cold LoRA");
  const int repeats = 3;
  cold_json["repeats"] = repeats;
  for (const std::string mode : {"in_memory", "synchronous", "asynchronous_k0", "asynchronous_k2"}) {
  std::vector<double> first_step, result, a_median, a_p95;
  for (int repeat = 0; repeat < repeats; ++repeat) {
    ServedEdit a, b;
    std::promise<void> second;
    auto a_done = submit(base_params("make it dark blue", 3), a, &second);
    second.get_future().wait();
    bench::drop_from_page_cache(cold);
    EditParams pb = base_params("a bright red patch", 4);
    std::thread reader;
    const Clock::time_point b_start = Clock::now();
    std::future<void> b_done;
    if (mode == "in_memory") {
      pb.adapters = {{held, 1.0}};
      b_done = submit(pb, b, nullptr);
    } else if (mode == "synchronous") {
      pb.adapters = {{must(model.read_adapter(cold), "cold LoRA"), 1.0}};
      b_done = submit(pb, b, nullptr);
    } else {
      pb.adapters_from_step = mode == "asynchronous_k2" ? 2 : 0;
      pb.adapter_load = std::make_shared<AdapterLoad>(std::vector<std::pair<std::string, double>>{{lora_id_of(cold), 1.0}});
      auto load = pb.adapter_load;
      b_done = submit(pb, b, nullptr);
      reader = std::thread([&model, load, &cold] {
        c10::InferenceMode g;
        auto read = model.read_adapter(cold);
        if (!read.ok()) load->finish(read.status());
        else load->finish(AdapterSet{{*read, 1.0}});
      });
    }
    b_done.wait();
    if (reader.joinable()) reader.join();
    a_done.wait();
    if (b.result.state != RequestState::kDone || a.result.state != RequestState::kDone)
      fail("a timed edit failed: " + b.result.status.to_string() + " / " + a.result.status.to_string());
    // A's steps while B was in the engine.
    std::vector<double> during;
    for (size_t i = 1; i < a.steps.size(); ++i)
      if (a.steps[i] >= b_start && a.steps[i - 1] <= b.completed) during.push_back(ms_between(a.steps[i - 1], a.steps[i]));
    first_step.push_back(b.steps.empty() ? -1.0 : ms_between(b_start, b.steps.front()));
    result.push_back(ms_between(b_start, b.completed));
    if (!during.empty()) {
      a_median.push_back(bench::percentile(during, 0.5));
      a_p95.push_back(bench::percentile(during, 0.95));
    }
  }
    nlohmann::ordered_json m;
    m["mode"] = mode;
    m["b_submit_to_first_step_ms"] = bench::percentile(first_step, 0.5);  // medians over the repeats
    m["b_submit_to_result_ms"] = bench::percentile(result, 0.5);
    if (!a_p95.empty())
      m["a_step_ms_during_b"] = {{"median", bench::percentile(a_median, 0.5)}, {"p95", bench::percentile(a_p95, 0.5)}};
    modes.push_back(m);
  }
  cold_json["modes"] = modes;
  out["cold_adapter"] = cold_json;
  std::cout << out.dump(2) << "\n";
  return 0;
}
