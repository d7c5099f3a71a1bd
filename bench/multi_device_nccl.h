#pragma once
// bench_multi_device's "nccl" section: the Ulysses forward of multi_device_gloo.h at FLUX.2
// [klein] 4B sizes (random bf16 weights, the file bench_flux2 generates) on the GPUs present,
// over NCCL at every degree that divides klein's 24 heads and fits them (1, 2, 3, 4, 6, 8),
// against the plain forward on one GPU: step time, the share in collectives, the difference;
// then the same for a masked step of a large mask (half the image rows, the rest's K/V read
// from the template's fp16 cache in host memory).
// A degree-1 group still runs its collectives through NCCL. Where no GPU is present the
// section says so and measures nothing.
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>

#include "flux2_bench_inputs.h"
#include "model/compute_device.h"
#include "model/device_group.h"
#include "model/flux2_sequence_parallel.h"
#include "model/flux2_transformer.h"
#include "model/safetensors.h"
#include "multi_device_gloo.h"

namespace infill::bench {

struct NcclBenchOptions {
  int repeats = 3;
  std::vector<int64_t> image_tokens{4096, 16384};
  int64_t text_tokens = 512;
  /// bench_flux2's file at klein 4B sizes: generated once, shared.
  std::string weights = (std::filesystem::temp_directory_path() / "infill-bench-flux2-klein-4b.safetensors").string();
};

inline nlohmann::json bench_nccl(const NcclBenchOptions& o) {
  const int gpus = cuda_device_count();
  if (gpus < 1) return {{"devices", 0}, {"note", "no CUDA device here: the section runs where GPUs are (scripts/gpu_check.sh)"}};
  c10::InferenceMode guard;
  const Flux2Config cfg = klein_4b_config();
  double generated_ms = 0;
  if (const std::string error = ensure_flux2_weights(o.weights, cfg, &generated_ms); !error.empty()) return {{"error", error}};
  std::vector<int> degrees;
  for (int d : {1, 2, 3, 4, 6, 8}) {
    if (d <= gpus && cfg.num_heads % d == 0) degrees.push_back(d);
  }
  // The model on every GPU a degree uses.
  std::vector<std::unique_ptr<Flux2Transformer>> models;
  for (int g = 0; g < degrees.back(); ++g) {
    auto file = SafetensorsFile::open(o.weights);
    if (!file.ok()) return {{"error", file.status().to_string()}};
    auto loaded = Flux2Transformer::load(*file, "");
    if (!loaded.ok()) return {{"error", loaded.status().to_string()}};
    const ComputeDevice device{true, g};
    if (Status moved = loaded->to_device(device); !moved.ok()) return {{"error", moved.to_string()}};
    models.push_back(std::make_unique<Flux2Transformer>(std::move(*loaded)));
  }
  // Every degree's step of `segment_for(rank)` (the same segment on every rank, a masked one
  // with that rank's own source) against `reference`, the plain forward on GPU 0.
  auto by_degree_of = [&](const std::function<Flux2Segment(int rank)>& segment_for, const at::Tensor& reference,
                          double plain_ms) {
    nlohmann::json by_degree = nlohmann::json::array();
    for (int d : degrees) {
      std::vector<ComputeDevice> devices;
      for (int g = 0; g < d; ++g) devices.push_back({true, g});
      auto group = DeviceGroup::create(devices);
      if (!group.ok()) {
        by_degree.push_back({{"degree", d}, {"error", group.status().message()}});
        continue;
      }
      at::Tensor parallel;
      std::vector<double> collective;
      const double ms = timed_median_ms(o.repeats, [&] {
        std::vector<double> before(d);
        for (int k = 0; k < d; ++k) before[k] = (*group)[k]->collective_seconds();
        std::vector<at::Tensor> got(d);
        std::vector<std::string> errors(d);
        std::vector<std::thread> threads;
        for (int k = 0; k < d; ++k) {
          threads.emplace_back([&, k] {
            c10::InferenceMode rank_guard;
            try {
              got[k] = flux2_forward_sequence_parallel(*models[k], segment_for(k), *(*group)[k]);
            } catch (const std::exception& e) {
              errors[k] = e.what();
            }
          });
        }
        for (std::thread& t : threads) t.join();
        for (const std::string& e : errors) TORCH_CHECK(e.empty(), e);
        parallel = got[0];
        double spent = 0;
        for (int k = 0; k < d; ++k) spent += (*group)[k]->collective_seconds() - before[k];
        collective.push_back(spent / d * 1000.0);
      });
      by_degree.push_back({{"degree", d},
                           {"backend", (*group)[0]->backend()},
                           {"step_ms", ms},
                           {"speedup_over_plain", plain_ms / ms},
                           {"collective_share", median_of(collective) / ms},
                           {"max_rel_diff", (parallel - reference).abs().max().item<double>() /
                                                reference.abs().max().item<double>()}});
    }
    return by_degree;
  };
  nlohmann::json sizes = nlohmann::json::array();
  for (int64_t image : o.image_tokens) {
    const Flux2Segment whole = gloo_bench_segment(cfg, o.text_tokens, image, 7);
    at::Tensor reference;
    const double plain_ms = timed_median_ms(o.repeats, [&] {
      Flux2Segment s = whole;
      reference = models[0]->forward(std::span<Flux2Segment>(&s, 1));
    });
    const nlohmann::json by_degree = by_degree_of([&](int) { return whole; }, reference, plain_ms);

    // A large mask: the text and the middle half of the image rows computed, every other
    // row's K/V read from the template's fp16 cache in host memory (the RAM tier), each rank
    // through a source of its own, copying its heads' columns to its GPU.
    SlabCache cache;
    {
      Flux2Segment record = whole;
      record.sink = &cache;
      (void)models[0]->forward(std::span<Flux2Segment>(&record, 1));
    }
    const int64_t rows = image / 2, first = image / 4;
    Flux2Segment masked = whole;
    masked.img = whole.img.narrow(0, first, rows);
    masked.img_ids = whole.img_ids.narrow(0, first, rows);
    masked.positions = at::cat({at::arange(o.text_tokens, at::kLong),
                                at::arange(o.text_tokens + first, o.text_tokens + first + rows, at::kLong)});
    masked.sequence_length = o.text_tokens + image;
    masked.kv = &cache;
    at::Tensor masked_reference;
    const double masked_plain_ms = timed_median_ms(o.repeats, [&] {
      Flux2Segment s = masked;
      masked_reference = models[0]->forward(std::span<Flux2Segment>(&s, 1));
    });
    std::vector<SlabCache> sources(static_cast<size_t>(degrees.back()), cache);
    const nlohmann::json masked_by_degree = by_degree_of(
        [&](int k) {
          Flux2Segment s = masked;
          s.kv = &sources[static_cast<size_t>(k)];
          return s;
        },
        masked_reference, masked_plain_ms);
    sizes.push_back({{"sequence_tokens", image + o.text_tokens},
                     {"plain_ms", plain_ms},
                     {"degrees", by_degree},
                     {"large_mask", {{"masked_rows", rows}, {"plain_ms", masked_plain_ms}, {"degrees", masked_by_degree}}}});
  }
  nlohmann::json devices = nlohmann::json::array();
  for (int g = 0; g < gpus; ++g) devices.push_back(describe_compute_device({true, g}));
  return {{"devices", devices},
          {"model", {{"size", "klein-4b"}, {"weights", "random bf16"}, {"heads", cfg.num_heads}}},
          {"repeats", o.repeats},
          {"sizes", sizes}};
}

}  // namespace infill::bench
