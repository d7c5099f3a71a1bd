#pragma once
// bench_multi_device's "gloo" section: a whole-sequence FLUX.2 step (random weights, a
// mid-size transformer with klein's 24 heads) at the token counts of 1024^2 and 2048^2
// templates, on one CPU device and in Ulysses sequence parallel over a Gloo group of 2 CPU
// ranks (threads of this process), the cores split between the ranks. Per degree: the median
// step time over repeats, and the share of it the ranks spent in collectives; the two
// predictions are compared (max |diff| / max |reference|); the simulator's cost model, fitted
// on these runs, predicts the two-rank steps. Then the same for a masked step of a large mask
// (half the image rows computed, every other row's K/V read from the template's fp16 cache),
// each rank reading the cache through a source of its own. On a 2-core machine this shows correctness and
// overhead, not speedup: both degrees share the same two cores.
#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>

#include "model/device_group.h"
#include "model/flux2_sequence_parallel.h"
#include "model/flux2_transformer.h"
#include "model/kv_io.h"
#include "serving/sequence_parallel_cost_model.h"

namespace infill::bench {

struct GlooBenchOptions {
  int repeats = 3;
  std::vector<int64_t> image_tokens{4096, 16384};  ///< 1024^2 and 2048^2 at 16 pixels a token
  int64_t text_tokens = 128;
  int threads = 2;  ///< cores to use: one device gets them all, each of P ranks threads / P
};

inline Flux2Config gloo_bench_config() {
  Flux2Config c;
  c.in_channels = 128;
  c.context_dim = 256;
  c.hidden_size = 384;  // klein's 24 heads of 16 channels
  c.num_heads = 24;
  c.double_blocks = 1;
  c.single_blocks = 2;
  c.mlp_hidden = 1152;
  c.axes_dim = {4, 4, 4, 4};
  return c;
}

inline Flux2Segment gloo_bench_segment(const Flux2Config& cfg, int64_t text, int64_t image, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const int64_t side = static_cast<int64_t>(std::sqrt(static_cast<double>(image)));
  Flux2Segment s;
  s.txt = at::randn({text, cfg.context_dim}, gen);
  s.txt_ids = at::zeros({text, 4});
  s.txt_ids.select(1, 3).copy_(at::arange(text, at::kFloat));
  s.img = at::randn({image, cfg.input_channels()}, gen);
  s.img_ids = at::zeros({image, 4});
  s.img_ids.select(1, 1).copy_(at::arange(image, at::kFloat).div(side, "floor"));
  s.img_ids.select(1, 2).copy_(at::arange(image, at::kFloat).remainder(side));
  s.timestep = 0.5;
  return s;
}

// A template's K/V as the activation cache keeps them (fp16, on the host), recorded by a full
// forward and read back as slabs. Copies share the tensors: one per rank.
class SlabCache final : public KvSink, public KvSource {
 public:
  void store(int block, const at::Tensor& k, const at::Tensor& v) override {
    if (static_cast<int>(k_.size()) <= block) {
      k_.resize(static_cast<size_t>(block) + 1);
      v_.resize(static_cast<size_t>(block) + 1);
    }
    k_[static_cast<size_t>(block)] = k.to(at::kCPU, at::kHalf).contiguous();
    v_[static_cast<size_t>(block)] = v.to(at::kCPU, at::kHalf).contiguous();
  }
  void fetch(int block, at::Tensor& k, at::Tensor& v) override {
    k.copy_(k_.at(static_cast<size_t>(block)));
    v.copy_(v_.at(static_cast<size_t>(block)));
  }
  bool fp16_slabs(int block, const uint16_t** k, const uint16_t** v) override {
    *k = reinterpret_cast<const uint16_t*>(k_.at(static_cast<size_t>(block)).data_ptr<at::Half>());
    *v = reinterpret_cast<const uint16_t*>(v_.at(static_cast<size_t>(block)).data_ptr<at::Half>());
    return true;
  }

 private:
  std::vector<at::Tensor> k_, v_;
};

inline double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Median ms of `repeats` timed runs of `run` (after one untimed run that warms up).
template <typename Run>
double timed_median_ms(int repeats, Run run) {
  std::vector<double> ms;
  for (int r = 0; r <= repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    if (r > 0) ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return median_of(ms);
}

/// The section's JSON, or {"error": ...} when this build has no Gloo.
inline nlohmann::json bench_gloo(const GlooBenchOptions& o) {
  c10::InferenceMode guard;
  const Flux2Config cfg = gloo_bench_config();
  const Flux2Transformer model = Flux2Transformer::random(cfg, 1, at::kFloat);
  const int ranks = 2;
  auto group = DeviceGroup::create(std::vector<ComputeDevice>(ranks));
  if (!group.ok()) return {{"error", group.status().message()}};
  const int per_rank = std::max(1, o.threads / ranks);
  struct Measured {
    int64_t sequence = 0;
    double one_device_per_rank_threads_ms = 0, one_device_all_threads_ms = 0, two_ranks_ms = 0;
    double collective_ms = 0, max_rel_diff = 0;
    // A masked step of a large mask: half the image rows.
    int64_t masked_rows = 0;
    double masked_one_device_ms = 0, masked_two_ranks_ms = 0, masked_collective_ms = 0, masked_max_rel_diff = 0;
  };
  // Every rank's run of `share(rank)` at once, a thread each with its share of the cores; the
  // mean time the ranks spent in collectives is added to `collective`.
  auto on_ranks = [&](const std::function<at::Tensor(int rank)>& share, std::vector<double>& collective) {
    std::vector<double> before(ranks);
    for (int k = 0; k < ranks; ++k) before[k] = (*group)[k]->collective_seconds();
    std::vector<at::Tensor> got(ranks);
    std::vector<std::thread> threads;
    for (int k = 0; k < ranks; ++k) {
      threads.emplace_back([&, k] {
        c10::InferenceMode rank_guard;
        at::set_num_threads(per_rank);
        got[k] = share(k);
      });
    }
    for (std::thread& t : threads) t.join();
    double spent = 0;
    for (int k = 0; k < ranks; ++k) spent += (*group)[k]->collective_seconds() - before[k];
    collective.push_back(spent / ranks * 1000.0);
    return got[0];
  };
  std::vector<Measured> measured;
  for (int64_t image : o.image_tokens) {
    Measured m;
    m.sequence = image + o.text_tokens;
    const Flux2Segment whole = gloo_bench_segment(cfg, o.text_tokens, image, 7);
    at::Tensor reference, parallel;
    auto one_device = [&] {
      Flux2Segment s = whole;
      reference = model.forward(std::span<Flux2Segment>(&s, 1));
    };
    // One CPU device of the simulator's kind (a rank's share of the cores), then the machine.
    at::set_num_threads(per_rank);
    m.one_device_per_rank_threads_ms = timed_median_ms(o.repeats, one_device);
    at::set_num_threads(o.threads);
    m.one_device_all_threads_ms = timed_median_ms(o.repeats, one_device);
    std::vector<double> collective;
    m.two_ranks_ms = timed_median_ms(o.repeats, [&] {
      parallel = on_ranks([&](int k) { return flux2_forward_sequence_parallel(model, whole, *(*group)[k]); }, collective);
    });
    m.collective_ms = median_of(collective);
    m.max_rel_diff = (parallel - reference).abs().max().item<double>() / reference.abs().max().item<double>();

    // The large mask: the template's K/V recorded (untimed), then the masked step computing
    // the text and the middle half of the image rows, as a template-keyed edit does.
    SlabCache cache;
    {
      Flux2Segment record = whole;
      record.sink = &cache;
      (void)model.forward(std::span<Flux2Segment>(&record, 1));
    }
    m.masked_rows = image / 2;
    const int64_t first = image / 4;
    Flux2Segment masked = whole;
    masked.img = whole.img.narrow(0, first, m.masked_rows);
    masked.img_ids = whole.img_ids.narrow(0, first, m.masked_rows);
    masked.positions = at::cat({at::arange(o.text_tokens, at::kLong),
                                at::arange(o.text_tokens + first, o.text_tokens + first + m.masked_rows, at::kLong)});
    masked.sequence_length = o.text_tokens + image;
    masked.kv = &cache;
    m.masked_one_device_ms = timed_median_ms(o.repeats, [&] {
      Flux2Segment s = masked;
      reference = model.forward(std::span<Flux2Segment>(&s, 1));
    });
    std::vector<SlabCache> sources(static_cast<size_t>(ranks), cache);  // each rank's own reader
    std::vector<double> masked_collective;
    m.masked_two_ranks_ms = timed_median_ms(o.repeats, [&] {
      parallel = on_ranks(
          [&](int k) {
            Flux2Segment s = masked;
            s.kv = &sources[static_cast<size_t>(k)];
            return flux2_forward_sequence_parallel(model, s, *(*group)[k]);
          },
          masked_collective);
    });
    m.masked_collective_ms = median_of(masked_collective);
    m.masked_max_rel_diff = (parallel - reference).abs().max().item<double>() / reference.abs().max().item<double>();
    measured.push_back(m);
  }

  // The simulator's cost model (serving/sequence_parallel_cost_model.h) fitted on these runs:
  // a device's compute from the one-device runs at both sizes (ms = a L + b L^2), its link
  // from the smaller size's collectives; then its prediction of each two-rank step.
  nlohmann::json check;
  if (measured.size() >= 2) {
    const Measured &s = measured.front(), &l = measured.back();
    const double L1 = double(s.sequence), L2 = double(l.sequence);
    const double t1 = s.one_device_per_rank_threads_ms, t2 = l.one_device_per_rank_threads_ms;
    const double b = (t2 / L2 - t1 / L1) / (L2 - L1), a = t1 / L1 - b * L1;
    SequenceParallelCoefficients c;
    c.ms_per_token = std::max(0.0, a);
    c.ms_per_token_squared = std::max(0.0, b);
    c.hidden = cfg.hidden_size;
    c.heads = cfg.num_heads;
    // Ulysses here moves q, k and v in one exchange and the output in another: the volume of
    // the model's four all-to-alls per attention layer.
    c.all_to_alls_per_step = 4 * cfg.depth();
    c.bytes_per_element = 4;  // float32 on the CPU
    const double volume_bytes = c.all_to_alls_per_step * c.bytes_per_element * (L1 / 2) * double(c.hidden) * 0.5;
    c.link_bytes_per_ms = volume_bytes / std::max(1e-3, s.collective_ms);
    auto fitted = SequenceParallelCostModel::create(c);
    if (fitted.ok()) {
      nlohmann::json rows = nlohmann::json::array();
      double worst = 0;
      for (const Measured& m : measured) {
        const double predicted = fitted->step_ms(m.sequence, 2);
        const double error = (predicted - m.two_ranks_ms) / m.two_ranks_ms;
        worst = std::max(worst, std::abs(error));
        rows.push_back({{"sequence_tokens", m.sequence}, {"predicted_degree_2_ms", predicted},
                        {"measured_degree_2_ms", m.two_ranks_ms}, {"relative_error", error}});
      }
      check = {{"fitted", {{"ms_per_token", c.ms_per_token},
                           {"ms_per_token_squared", c.ms_per_token_squared},
                           {"link_bytes_per_ms", c.link_bytes_per_ms}}},
               {"fitted_on", "one-device steps at both sizes (compute), the smaller size's collectives (link)"},
               {"predictions", rows},
               {"max_abs_relative_error", worst}};
    } else {
      check = {{"error", fitted.status().message()}};
    }
  }

  nlohmann::json sizes = nlohmann::json::array();
  for (const Measured& m : measured) {
    sizes.push_back({{"sequence_tokens", m.sequence},
                     {"degree_1_ms", {{"threads_" + std::to_string(per_rank), m.one_device_per_rank_threads_ms},
                                      {"threads_" + std::to_string(o.threads), m.one_device_all_threads_ms}}},
                     {"degree_2_ms", m.two_ranks_ms},
                     {"degree_2_over_degree_1_same_cores", m.two_ranks_ms / m.one_device_all_threads_ms},
                     {"degree_2_collective_ms", m.collective_ms},
                     {"degree_2_collective_share", m.collective_ms / m.two_ranks_ms},
                     {"degree_2_max_rel_diff", m.max_rel_diff},
                     {"large_mask",
                      {{"masked_rows", m.masked_rows},
                       {"degree_1_ms", m.masked_one_device_ms},
                       {"degree_2_ms", m.masked_two_ranks_ms},
                       {"degree_2_over_degree_1_same_cores", m.masked_two_ranks_ms / m.masked_one_device_ms},
                       {"degree_2_collective_ms", m.masked_collective_ms},
                       {"degree_2_collective_share", m.masked_collective_ms / m.masked_two_ranks_ms},
                       {"degree_2_max_rel_diff", m.masked_max_rel_diff}}}});
  }
  return {{"backend", (*group)[0]->backend()},
          {"model", {{"hidden", cfg.hidden_size}, {"heads", cfg.num_heads}, {"double_blocks", cfg.double_blocks},
                     {"single_blocks", cfg.single_blocks}, {"weights", "random float32"}}},
          {"threads", o.threads},
          {"repeats", o.repeats},
          {"note", "degree 2 = Ulysses over 2 Gloo ranks (threads of one process, " + std::to_string(per_rank) +
                       " compute thread(s) each); degree 1 on one rank's threads and on all of them. This machine's ranks "
                       "share its cores: it shows correctness and the collectives' cost, not a speedup. large_mask: a "
                       "masked step computing the text and half the image rows, every other row's K/V read from the "
                       "template's fp16 cache (each rank reads its heads' columns), degree 1 on all threads"},
          {"sizes", sizes},
          {"cost_model_check", check}};
}

}  // namespace infill::bench
