// bench_checkpoint_load: a FLUX.2 transformer stored in bf16 against the same model stored as
// FP8 (E4M3 with one scale per weight, the layout of BFL's flux-2-klein-*-fp8 files): the time
// from opening the file to the first forward's result, with the file dropped from the page
// cache before each load, and the peak resident memory. A bf16 file is memory-mapped, so its
// pages are read by the first forward; an FP8 file is read and dequantized to bf16 at load
// (model/float8_checkpoint.h). The FP8 file holds random finite codes: the time does not depend
// on the values (tests check the numbers). Both files are generated on first use, never
// committed. Prints one JSON document.
//
//   bench_checkpoint_load [--size small|klein-4b] [--repeats N]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>

#include "bench_stats.h"
#include "flux2_bench_inputs.h"
#include "machine_info.h"
#include "model/compute_threads.h"
#include "model/flux2_checkpoint.h"
#include "model/flux2_transformer.h"
#include "model/safetensors.h"
#include "process_memory.h"

namespace fs = std::filesystem;
using infill::Flux2Checkpoint;
using infill::Flux2Config;
using infill::Flux2Transformer;
using json = nlohmann::json;

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// The FP8 twin of the bf16 file at `bf16_path`: each 2-D weight as F8_E4M3 codes with a float32
// `weight_scale` (and the `input_scale` and `comfy_quant` record the published files carry),
// the rest copied. Written in one pass, header first.
std::string write_fp8_twin(const std::string& bf16_path, const std::string& fp8_path) {
  auto file = infill::SafetensorsFile::open(bf16_path);
  if (!file.ok()) return file.status().to_string();
  struct Piece {
    std::string name, dtype;
    std::vector<int64_t> shape;
    const infill::TensorInfo* source = nullptr;  // copied when set, else generated
    std::string bytes;                            // small tensors written as they are
    int64_t size = 0;
  };
  std::vector<Piece> pieces;
  const std::string record = R"({"format": "float8_e4m3fn"})";
  for (const infill::TensorInfo& t : file->tensors()) {
    const bool weight = t.shape.size() == 2 && t.name.size() > 7 && t.name.compare(t.name.size() - 7, 7, ".weight") == 0;
    if (!weight) {
      pieces.push_back({t.name, infill::dtype_name(t.dtype), t.shape, &t, "", static_cast<int64_t>(t.end - t.begin)});
      continue;
    }
    const std::string layer = t.name.substr(0, t.name.size() - 7);
    pieces.push_back({t.name, "F8_E4M3", t.shape, nullptr, "", t.numel()});
    const float scale = 0.02f / 448.0f * 4.0f;  // random weights of 0.02 spread over the codes
    pieces.push_back({layer + ".weight_scale", "F32", {}, nullptr, std::string(reinterpret_cast<const char*>(&scale), 4), 4});
    const float input_scale = 0.05f;
    pieces.push_back(
        {layer + ".input_scale", "F32", {}, nullptr, std::string(reinterpret_cast<const char*>(&input_scale), 4), 4});
    pieces.push_back({layer + ".comfy_quant", "U8", {static_cast<int64_t>(record.size())}, nullptr, record,
                      static_cast<int64_t>(record.size())});
  }
  json header = json::object();
  int64_t offset = 0;
  for (const Piece& p : pieces) {
    header[p.name] = {{"dtype", p.dtype}, {"shape", p.shape}, {"data_offsets", {offset, offset + p.size}}};
    offset += p.size;
  }
  const std::string text = header.dump();
  const uint64_t n = text.size();
  const std::string tmp = fp8_path + ".partial";
  std::ofstream out(tmp, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << text;
  std::mt19937_64 rng(5);
  std::vector<char> buffer;
  for (const Piece& p : pieces) {
    if (p.source != nullptr) {
      const auto bytes = file->bytes(*p.source);
      out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    } else if (!p.bytes.empty()) {
      out << p.bytes;
    } else {
      buffer.resize(static_cast<size_t>(p.size));
      for (size_t i = 0; i < buffer.size(); i += 8) {
        uint64_t r = rng();
        for (size_t k = i; k < std::min(buffer.size(), i + 8); ++k, r >>= 8) {
          const uint8_t code = static_cast<uint8_t>(r) & 0x77;  // finite, below 2^7 in magnitude: never NaN
          buffer[k] = static_cast<char>(code | (static_cast<uint8_t>(r) & 0x80));
        }
      }
      out.write(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    }
  }
  out.close();
  if (!out) return "writing " + tmp + " failed";
  fs::rename(tmp, fp8_path);
  return "";
}

struct Run {
  double load_ms = 0, first_forward_ms = 0;
  int64_t peak_rss_bytes = 0, weight_bytes = 0;
};

// Opens `path` with its pages dropped, loads the transformer and runs one small full forward.
Run load_and_step(const std::string& path, const infill::bench::Flux2BenchInputs& in) {
  infill::bench::drop_from_page_cache(path);
  infill::bench::reset_peak();
  Run run;
  const auto t0 = std::chrono::steady_clock::now();
  auto checkpoint = Flux2Checkpoint::open({path});
  if (!checkpoint.ok()) throw std::runtime_error(checkpoint.status().to_string());
  auto model = Flux2Transformer::load(*checkpoint);
  if (!model.ok()) throw std::runtime_error(model.status().to_string());
  run.load_ms = ms_since(t0);
  const auto t1 = std::chrono::steady_clock::now();
  c10::InferenceMode guard;
  infill::Flux2Segment seg;
  seg.txt = in.txt;
  seg.txt_ids = in.txt_ids;
  seg.img = in.img;
  seg.img_ids = in.img_ids;
  seg.timestep = 0.7;
  const at::Tensor out = model->forward(std::span<infill::Flux2Segment>(&seg, 1));
  if (!out.isfinite().all().item<bool>()) throw std::runtime_error(path + ": the forward gave non-finite values");
  run.first_forward_ms = ms_since(t1);
  run.peak_rss_bytes = infill::bench::peak_rss_bytes();
  run.weight_bytes = model->weight_bytes();
  return run;
}

}  // namespace

int main(int argc, char** argv) {
  std::string size = "small";
  int repeats = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if ((flag == "--size" || flag == "--repeats") && i + 1 < argc) {
      const std::string value = argv[++i];
      if (flag == "--size") size = value;
      else repeats = std::max(1, std::stoi(value));
    } else {
      std::cerr << "usage: bench_checkpoint_load [--size small|klein-4b] [--repeats N]\n";
      return 2;
    }
  }
  if (size != "small" && size != "klein-4b") {
    std::cerr << "bench_checkpoint_load: --size is " << size << ", expected small or klein-4b\n";
    return 2;
  }
  const Flux2Config cfg = size == "small" ? infill::bench::small_flux2_config() : infill::bench::klein_4b_config();
  const std::string bf16 = (fs::temp_directory_path() / ("infill-bench-flux2-" + size + ".safetensors")).string();
  const std::string fp8 = (fs::temp_directory_path() / ("infill-bench-flux2-" + size + "-fp8.safetensors")).string();
  const int threads = infill::set_compute_threads(0);  // one per hardware thread, as the engine
  json out;
  out["machine"] = infill::bench::machine_info();
  out["device"] = "cpu (float32 compute, weights held in bf16)";
  out["threads"] = threads;
  double generated_ms = 0;
  if (const std::string error = infill::bench::ensure_flux2_weights(bf16, cfg, &generated_ms); !error.empty()) {
    std::cerr << "bench_checkpoint_load: " << error << "\n";
    return 1;
  }
  if (!fs::exists(fp8) || fs::last_write_time(fp8) < fs::last_write_time(bf16)) {
    if (const std::string error = write_fp8_twin(bf16, fp8); !error.empty()) {
      std::cerr << "bench_checkpoint_load: " << error << "\n";
      return 1;
    }
  }
  out["model"] = {{"size", size}, {"hidden", cfg.hidden_size}, {"double_blocks", cfg.double_blocks},
                  {"single_blocks", cfg.single_blocks}, {"weights", "random, generated (never committed)"}};
  out["files"] = {{"bf16", {{"path", bf16}, {"bytes", fs::file_size(bf16)}}},
                  {"fp8", {{"path", fp8}, {"bytes", fs::file_size(fp8)}}}};
  const infill::bench::Flux2BenchInputs in = infill::bench::make_flux2_bench_inputs(cfg, 8, 4, 7);
  out["first_forward"] = "8 text + 2 x 16 image tokens, one full step";
  std::vector<Run> runs_bf16, runs_fp8;
  try {
    for (int r = 0; r < repeats; ++r) {  // alternated, so that drift hits both alike
      runs_bf16.push_back(load_and_step(bf16, in));
      runs_fp8.push_back(load_and_step(fp8, in));
    }
  } catch (const std::exception& e) {
    std::cerr << "bench_checkpoint_load: " << e.what() << "\n";
    return 1;
  }
  auto summary = [](const std::vector<Run>& runs) {
    std::vector<double> load, forward, total;
    int64_t peak = 0;
    for (const Run& r : runs) {
      load.push_back(r.load_ms);
      forward.push_back(r.first_forward_ms);
      total.push_back(r.load_ms + r.first_forward_ms);
      peak = std::max(peak, r.peak_rss_bytes);
    }
    return json{{"load_ms", infill::bench::percentile(load, 0.5)},
                {"first_forward_ms", infill::bench::percentile(forward, 0.5)},
                {"open_to_first_result_ms", infill::bench::percentile(total, 0.5)},
                {"peak_rss_bytes", peak},
                {"weight_bytes_held", runs.front().weight_bytes},
                {"repeats", runs.size()}};
  };
  const json a = summary(runs_bf16), b = summary(runs_fp8);
  out["bf16"] = a;
  out["fp8"] = b;
  out["fp8_vs_bf16"] = {
      {"open_to_first_result", b["open_to_first_result_ms"].get<double>() / a["open_to_first_result_ms"].get<double>()},
      {"file_bytes", static_cast<double>(fs::file_size(fp8)) / static_cast<double>(fs::file_size(bf16))},
      {"note", "medians over the repeats; the page cache is dropped before every load"}};
  std::cout << out.dump(2) << "\n";
  return 0;
}
