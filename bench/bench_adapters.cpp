// bench_adapters: what LoRAs cost the FLUX.2 transformer at klein 4B sizes (random bf16 weights,
// the file bench_flux2 generates), with random LoRAs of rank 16 and 64 on every attention and
// MLP projection, in one run on one machine:
// - an adapter's load from its file to the compute device (ms, GB/s of the file);
// - a masked step (m = 0.1, prompt-keyed: the masked image rows against cached K/V) without
//   adapter, with one adapter applied per segment (unfused) and with merged weights; on a GPU
//   also through step graphs (as the engine replays masked rounds, the adapter's terms
//   recorded with the round) without and with the adapter;
// - a packed round of 8 masked segments with 4 different sets ({}, A, B, A + B) against the
//   same round without adapters;
// - with --full (default on a GPU), the same for a full step;
// - what reference images cost a masked step: 0, 1 and 4 references of the image's size
//   (their tokens in the cached context the masked rows attend to).
// Cached K/V are random fp16 (a step's time does not depend on their values). Prints one JSON
// document. Each baseline is timed in turns with its variants (medians over the repeats).
// Long on a CPU (seconds per klein step); --size small runs in seconds.
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>

#include "bench_stats.h"
#include "cache/activation_entry.h"
#include "common/blas_kernel.h"
#include "flux2_bench_inputs.h"
#include "machine_info.h"
#include "model/compute_device.h"
#include "model/compute_threads.h"
#include "model/flux2_step_graph.h"
#include "model/flux2_transformer.h"
#include "model/lora_adapter.h"
#include "model/safetensors.h"
#include "model/safetensors_torch.h"
#include "model/work_capture.h"
#include "pipeline/cached_kv.h"
#include "pipeline/device_kv_entry.h"
#include "process_memory.h"

namespace fs = std::filesystem;
using infill::AdapterSet;
using infill::Flux2Config;
using infill::Flux2Segment;
using infill::Flux2Transformer;

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// A LoRA of `rank` on every attention and MLP projection (qkv, proj, mlp.0, mlp.2 of both
// streams of the double blocks; linear1 and linear2 of the single blocks), bf16, in the
// upstream (ai-toolkit) format.
void write_lora(const std::string& path, const Flux2Config& cfg, int64_t rank, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const infill::Flux2LinearLayer& l : infill::flux2_linear_layers(cfg)) {
    if (l.name.find("_blocks.") == std::string::npos) continue;  // embedders, modulation, final layer
    const std::string module = "diffusion_model." + l.name.substr(0, l.name.size() - 7);
    tensors.emplace_back(module + ".lora_A.weight", at::empty({rank, l.in}).normal_(0, 0.02, gen).to(at::kBFloat16));
    tensors.emplace_back(module + ".lora_B.weight", at::empty({l.out, rank}).normal_(0, 0.02, gen).to(at::kBFloat16));
  }
  const infill::Status st = infill::write_safetensors(path, tensors);
  if (!st.ok()) throw std::runtime_error(st.to_string());
}

int usage(const std::string& error) {
  if (!error.empty()) std::cerr << "bench_adapters: " << error << "\n";
  std::cerr << "usage: bench_adapters [--size klein-4b|small] [--weights FILE] [--repeats N] [--grid N]\n"
               "                      [--text-tokens N] [--threads N] [--device cpu|cuda[:N]] [--full 0|1]\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  infill::select_blas_kernel();  // first: before any GEMM (common/blas_kernel.h)
  std::string size = "klein-4b", weights;
  int repeats = 3, text_tokens = 512, grid = 32, threads = 0, full = -1;
  infill::ComputeDevice device;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) return usage("option " + flag + " needs a value");
    const std::string value = argv[++i];
    try {
      if (flag == "--size") size = value;
      else if (flag == "--weights") weights = value;
      else if (flag == "--repeats") repeats = std::stoi(value);
      else if (flag == "--grid") grid = std::stoi(value);
      else if (flag == "--text-tokens") text_tokens = std::stoi(value);
      else if (flag == "--threads") threads = std::stoi(value);
      else if (flag == "--full") full = std::stoi(value);
      else if (flag == "--device") {
        auto parsed = infill::parse_compute_device(value);
        if (!parsed.ok()) return usage(parsed.status().message());
        device = *parsed;
      } else {
        return usage("unknown option " + flag);
      }
    } catch (const std::exception&) {
      return usage(flag + " takes a number, not '" + value + "'");
    }
  }
  if (size != "klein-4b" && size != "small") return usage("--size must be klein-4b or small");
  if (repeats < 1 || grid < 2 || text_tokens < 0) return usage("counts must be positive");
  if (full < 0) full = device.cuda ? 1 : 0;
  threads = infill::set_compute_threads(threads);
  const Flux2Config cfg = size == "small" ? infill::bench::small_flux2_config() : infill::bench::klein_4b_config();
  if (weights.empty()) weights = (fs::temp_directory_path() / ("infill-bench-flux2-" + size + ".safetensors")).string();

  nlohmann::ordered_json out;
  out["benchmark"] = "bench_adapters";
  out["machine"] = infill::bench::machine_info(device.cuda ? infill::describe_compute_device(device) : "none used");
  if (device.cuda) {
    if (infill::Status usable = infill::check_compute_device(device); !usable.ok()) {
      std::cerr << "bench_adapters: " << usable.to_string() << "\n";
      return 1;
    }
  }
  out["device"] = device.cuda ? infill::describe_compute_device(device) + ", bf16 weights, adapters and compute"
                              : "cpu (float32 compute, bf16 weights converted per layer, float32 adapters)";
  out["model"] = {{"size", size}, {"hidden", cfg.hidden_size}, {"double_blocks", cfg.double_blocks},
                  {"single_blocks", cfg.single_blocks}, {"weights", "random bf16 (" + weights + ")"}};

  double generated_ms = 0;
  if (const std::string error = infill::bench::ensure_flux2_weights(weights, cfg, &generated_ms); !error.empty()) {
    std::cerr << "bench_adapters: " << error << "\n";
    return 1;
  }
  if (generated_ms > 0) out["weights_generated_ms"] = generated_ms;
  auto file = infill::SafetensorsFile::open(weights);
  auto loaded = file.ok() ? Flux2Transformer::load(*file, "") : infill::Result<Flux2Transformer>(file.status());
  if (!loaded.ok()) {
    std::cerr << "bench_adapters: " << loaded.status().to_string() << "\n";
    return 1;
  }
  if (device.cuda) {
    if (infill::Status moved = loaded->to_device(device); !moved.ok()) {
      std::cerr << "bench_adapters: " << moved.to_string() << "\n";
      return 1;
    }
  }
  const Flux2Transformer& model = *loaded;
  const auto adapter_options = at::TensorOptions().device(model.device()).dtype(model.compute_dtype());

  c10::InferenceMode guard;
  const infill::bench::Flux2BenchInputs in = infill::bench::make_flux2_bench_inputs(cfg, text_tokens, grid, 7);
  const int64_t image_tokens = int64_t{grid} * grid;
  const int64_t length = text_tokens + 2 * image_tokens;
  // Random fp16 K/V of every position (values in a trained model's range).
  auto entry = std::make_shared<infill::ActivationEntry>(
      infill::ActivationLayout{1, cfg.depth(), static_cast<int>(length), cfg.hidden_size});
  {
    const at::Tensor kv = at::randn({static_cast<int64_t>(entry->layout().total_elements())}).to(at::kHalf);
    std::memcpy(entry->data(), kv.data_ptr(), entry->bytes());
  }
  infill::EntryKvSource host_source(entry, 0);
  std::shared_ptr<const infill::DeviceKvEntry> resident;
  std::unique_ptr<infill::DeviceKvSource> resident_source;
  if (device.cuda) {
    auto uploaded = infill::DeviceKvEntry::upload(*entry, device, model.compute_dtype());
    if (!uploaded.ok()) {
      std::cerr << "bench_adapters: " << uploaded.status().to_string() << "\n";
      return 1;
    }
    resident = *uploaded;
    resident_source = std::make_unique<infill::DeviceKvSource>(resident, 0);
  }
  infill::KvSource* source = resident_source ? static_cast<infill::KvSource*>(resident_source.get()) : &host_source;

  const at::Tensor rows = infill::bench::rectangle_tokens(grid, 0.1);
  auto masked_segment = [&](double t, const AdapterSet& set) {
    Flux2Segment s;
    s.txt = in.txt.narrow(0, 0, 0);
    s.txt_ids = in.txt_ids.narrow(0, 0, 0);
    s.img = in.img.index_select(0, rows);
    s.img_ids = in.img_ids.index_select(0, rows);
    s.positions = rows + text_tokens;
    s.sequence_length = length;
    s.timestep = t;
    s.kv = source;
    s.adapters = set;
    return s;
  };
  auto full_segment = [&](const AdapterSet& set) {
    Flux2Segment s;
    s.txt = in.txt;
    s.txt_ids = in.txt_ids;
    s.img = in.img;
    s.img_ids = in.img_ids;
    s.timestep = 0.7;
    s.adapters = set;
    return s;
  };
  // Every comparison below is timed in turns (bench_stats.h: interleaved_medians_ms), the
  // baseline beside its variants, so that the machine's drift does not enter the ratios.
  auto forward_of = [](const Flux2Transformer& m, std::vector<Flux2Segment> segments) -> std::function<void()> {
    return [&m, segments = std::move(segments)]() mutable { (void)m.forward(segments); };
  };
  out["masked_rows"] = rows.size(0);
  out["repeats"] = repeats;
  out["timing"] = "medians over the repeats; each baseline timed in turns with its variants";
  // A masked step through a step graph (model/flux2_step_graph.h): the segment's state on the
  // device as a session keeps it, recorded once here, then replayed by the returned call.
  struct GraphRun {
    Flux2Segment segment;
    std::unique_ptr<infill::Flux2StepGraph> graph;
  };
  auto graph_of = [&](const AdapterSet& set) -> std::function<void()> {
    auto g = std::make_shared<GraphRun>();
    g->segment = infill::bench::segment_on_device(model, masked_segment(0.7, set));
    std::span<Flux2Segment> round(&g->segment, 1);
    g->graph = std::make_unique<infill::Flux2StepGraph>(model, infill::flux2_graph_key(round),
                                                        infill::make_work_capture(model.device()));
    (void)g->graph->run(round).to(at::kCPU);  // records
    return [g] { (void)g->graph->run(std::span<Flux2Segment>(&g->segment, 1)).to(at::kCPU); };
  };

  nlohmann::ordered_json by_rank = nlohmann::ordered_json::array();
  std::vector<std::shared_ptr<const infill::LoraAdapter>> rank16;  // A and B of the packed round
  for (const int64_t rank : {int64_t{16}, int64_t{64}}) {
    nlohmann::ordered_json r;
    r["rank"] = rank;
    std::vector<std::shared_ptr<const infill::LoraAdapter>> adapters;
    for (uint64_t seed : {uint64_t{1}, uint64_t{2}}) {
      const std::string path =
          (fs::temp_directory_path() / ("infill-bench-lora-" + size + "-r" + std::to_string(rank) + "-" +
                                        std::to_string(seed) + ".safetensors"))
              .string();
      if (!fs::exists(path)) write_lora(path, cfg, rank, seed);
      infill::bench::drop_from_page_cache(path);
      const auto t0 = std::chrono::steady_clock::now();
      auto lora = infill::load_lora(path, cfg, "bench model");
      if (!lora.ok()) {
        std::cerr << "bench_adapters: " << lora.status().to_string() << "\n";
        return 1;
      }
      auto placed = (*lora)->on(adapter_options);
      if (device.cuda) at::empty({1}, adapter_options).cpu();  // wait for the copies
      const double load_ms = ms_since(t0);
      if (seed == 1) {
        const double file_gb = double(fs::file_size(path)) / 1e9;
        r["load"] = {{"file_bytes", fs::file_size(path)}, {"held_bytes", (*lora)->bytes()}, {"layers", (*lora)->layers.size()},
                     {"ms", load_ms}, {"file_gb_per_s", file_gb / (load_ms / 1e3)},
                     {"what", "page cache dropped; read, checked, widened to float32 and placed on the device"}};
      }
      adapters.push_back(placed);
    }
    const AdapterSet one = {{adapters[0], 0.8}};
    {
      const Flux2Transformer merged = model.merged(one);
      // [base, unfused, merged]
      const std::vector<double> masked = infill::bench::interleaved_medians_ms(
          repeats, {forward_of(model, {masked_segment(0.7, {})}), forward_of(model, {masked_segment(0.7, one)}),
                    forward_of(merged, {masked_segment(0.7, {})})});
      r["masked_step"] = {{"base_ms", masked[0]}, {"unfused_ms", masked[1]}, {"merged_ms", masked[2]},
                          {"unfused_overhead", masked[1] / masked[0] - 1.0}, {"merged_overhead", masked[2] / masked[0] - 1.0}};
      if (full) {
        const std::vector<double> whole = infill::bench::interleaved_medians_ms(
            repeats, {forward_of(model, {full_segment({})}), forward_of(model, {full_segment(one)}),
                      forward_of(merged, {full_segment({})})});
        r["full_step"] = {{"base_ms", whole[0]}, {"unfused_ms", whole[1]}, {"merged_ms", whole[2]},
                          {"unfused_overhead", whole[1] / whole[0] - 1.0}, {"merged_overhead", whole[2] / whole[0] - 1.0}};
      }
    }
    if (device.cuda) {
      const std::vector<double> graphs = infill::bench::interleaved_medians_ms(repeats, {graph_of({}), graph_of(one)});
      r["masked_step"]["graph"] = {{"base_ms", graphs[0]}, {"unfused_ms", graphs[1]}, {"unfused_overhead", graphs[1] / graphs[0] - 1.0}};
    }
    by_rank.push_back(r);
    if (rank == 16) rank16 = adapters;
  }
  out["adapters"] = by_rank;

  // 8 masked segments (one round of a busy worker), 4 sets of rank-16 adapters, 2 segments each.
  const std::vector<AdapterSet> sets = {{}, {{rank16[0], 1.0}}, {{rank16[1], 0.7}}, {{rank16[0], 0.5}, {rank16[1], -0.4}}};
  std::vector<Flux2Segment> plain, mixed;
  for (int i = 0; i < 8; ++i) {
    const double t = 0.2 + 0.1 * i;
    plain.push_back(masked_segment(t, {}));
    mixed.push_back(masked_segment(t, sets[i % 4]));
  }
  const std::vector<double> packed =
      infill::bench::interleaved_medians_ms(repeats, {forward_of(model, plain), forward_of(model, mixed)});
  out["packed_round"] = {{"segments", 8}, {"sets", 4}, {"rank", 16}, {"without_adapters_ms", packed[0]},
                         {"with_adapters_ms", packed[1]}, {"overhead", packed[1] / packed[0] - 1.0}};

  // Reference images: each adds its tokens (here one of the image's size) to the cached
  // context a masked step attends to; the masked rows stay the same.
  // The three entries are held at once so that their steps are timed in turns.
  struct ReferenceCase {
    int count = 0;
    int64_t length = 0;
    std::shared_ptr<infill::ActivationEntry> entry;
    std::unique_ptr<infill::EntryKvSource> host;
    std::unique_ptr<infill::DeviceKvSource> on_device;  // holds its device entry
  };
  std::vector<ReferenceCase> cases;
  std::vector<std::function<void()>> steps;
  for (const int count : {0, 1, 4}) {
    ReferenceCase c;
    c.count = count;
    c.length = length + count * image_tokens;
    c.entry = std::make_shared<infill::ActivationEntry>(
        infill::ActivationLayout{1, cfg.depth(), static_cast<int>(c.length), cfg.hidden_size});
    {
      const at::Tensor kv = at::randn({static_cast<int64_t>(c.entry->layout().total_elements())}).to(at::kHalf);
      std::memcpy(c.entry->data(), kv.data_ptr(), c.entry->bytes());
    }
    c.host = std::make_unique<infill::EntryKvSource>(c.entry, 0);
    if (device.cuda) {
      auto uploaded = infill::DeviceKvEntry::upload(*c.entry, device, model.compute_dtype());
      if (!uploaded.ok()) {
        std::cerr << "bench_adapters: " << uploaded.status().to_string() << "\n";
        return 1;
      }
      c.on_device = std::make_unique<infill::DeviceKvSource>(*uploaded, 0);
    }
    Flux2Segment s = masked_segment(0.7, {});
    s.sequence_length = c.length;
    s.kv = c.on_device ? static_cast<infill::KvSource*>(c.on_device.get()) : c.host.get();
    steps.push_back(forward_of(model, {s}));
    cases.push_back(std::move(c));
  }
  const std::vector<double> ref_ms = infill::bench::interleaved_medians_ms(repeats, steps);
  nlohmann::ordered_json refs = nlohmann::ordered_json::array();
  for (size_t i = 0; i < cases.size(); ++i) {
    refs.push_back({{"references", cases[i].count}, {"reference_tokens", cases[i].count * image_tokens},
                    {"sequence", cases[i].length}, {"masked_step_ms", ref_ms[i]}, {"entry_bytes", cases[i].entry->bytes()},
                    {"vs_none", ref_ms[i] / ref_ms[0]}});
  }
  out["reference_tokens"] = refs;
  out["cold_adapter"] = "bench_adapter_loading (the bundled model through the serving runtime)";
  std::cout << out.dump(2) << "\n";
  return 0;
}
