#pragma once
// What the FLUX.2 benchmarks (bench_flux2, bench_adapters) share: the model sizes they run at
// and one request's inputs at klein's editing layout (text, an image grid at t = 0 and the
// same grid as reference tokens at t = 10), a segment's state on the device, and a masked
// rectangle of the grid.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "model/flux2_transformer.h"
#include "model/safetensors.h"

namespace infill::bench {

inline Flux2Config klein_4b_config() {
  return Flux2Config{};  // the defaults are klein 4B: hidden 3072, 24 heads, 5 + 20 blocks, context 7680
}

inline Flux2Config small_flux2_config() {
  Flux2Config c;
  c.hidden_size = 256;
  c.num_heads = 4;
  c.double_blocks = 2;
  c.single_blocks = 4;
  c.mlp_hidden = 768;
  c.context_dim = 512;
  c.axes_dim = {16, 16, 16, 16};
  return c;
}

struct Flux2BenchInputs {
  at::Tensor txt, txt_ids, img, img_ids;  // img: image grid then reference grid
};

inline Flux2BenchInputs make_flux2_bench_inputs(const Flux2Config& c, int text_tokens, int grid, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  Flux2BenchInputs in;
  in.txt = at::empty({text_tokens, c.context_dim}).normal_(0, 1, gen);
  in.txt_ids = at::zeros({text_tokens, 4});
  in.txt_ids.select(1, 3).copy_(at::arange(text_tokens, at::kFloat));
  const int64_t n = int64_t{grid} * grid;
  in.img = at::empty({2 * n, c.in_channels}).normal_(0, 1, gen);
  in.img_ids = at::zeros({2 * n, 4});
  const at::Tensor ys = at::arange(grid, at::kFloat).repeat_interleave(grid);
  const at::Tensor xs = at::arange(grid, at::kFloat).repeat({grid});
  for (int g = 0; g < 2; ++g) {
    at::Tensor part = in.img_ids.narrow(0, g * n, n);
    part.select(1, 0).fill_(g == 0 ? 0.0 : 10.0);  // reference tokens at t = 10, as klein edits
    part.select(1, 1).copy_(ys);
    part.select(1, 2).copy_(xs);
  }
  return in;
}

// The image tokens of a centred rectangle covering about `fraction` of the grid (the mask
// and its halo, as one box): ascending ids.
// `s` with its state on the model's device, made once as a session makes it (issue 39): its
// rows, RoPE tables (in the model's rope_table_dtype), timestep embedding and positions there,
// which a step graph needs.
inline Flux2Segment segment_on_device(const Flux2Transformer& model, const Flux2Segment& s) {
  const Flux2Config& cfg = model.config();
  const auto there = at::TensorOptions().device(model.device()).dtype(model.compute_dtype());
  Flux2Segment d = s;
  d.txt = s.txt.to(there);
  d.img = s.img.to(there);
  auto [cos, sin] = flux2_rope_angles(at::cat({d.txt_ids, d.img_ids}), cfg.axes_dim, cfg.theta);
  d.rope_cos = cos.to(there.dtype(model.rope_table_dtype()));
  d.rope_sin = sin.to(there.dtype(model.rope_table_dtype()));
  d.time_embedding = flux2_timestep_embedding(s.timestep, cfg.time_embed_dim).to(model.device());
  d.positions_on_device = d.positions.to(model.device());
  return d;
}

inline at::Tensor rectangle_tokens(int grid, double fraction) {
  const int side_w = std::max(1, static_cast<int>(std::lround(std::sqrt(fraction) * grid)));
  const int side_h = std::max(1, static_cast<int>(std::lround(fraction * grid * grid / side_w)));
  const int x0 = (grid - side_w) / 2, y0 = (grid - side_h) / 2;
  std::vector<int64_t> ids;
  for (int y = y0; y < y0 + side_h; ++y)
    for (int x = x0; x < x0 + side_w; ++x) ids.push_back(int64_t{y} * grid + x);
  return at::tensor(ids, at::kLong);
}

// Random bf16 weights of `cfg` in `path`, generated once (ms in `generated_ms`, else 0) and
// reused while the file holds a transformer of that size; "" on success, else why not.
inline std::string ensure_flux2_weights(const std::string& path, const Flux2Config& cfg, double* generated_ms) {
  *generated_ms = 0;
  if (std::filesystem::exists(path)) {
    auto file = SafetensorsFile::open(path);
    auto prefix = file.ok() ? find_flux2_transformer_prefix(*file) : Result<std::string>(file.status());
    auto found = prefix.ok() ? infer_flux2_config(*file, *prefix) : Result<Flux2Config>(prefix.status());
    if (found.ok() && found->hidden_size == cfg.hidden_size && found->depth() == cfg.depth()) return "";
  }
  const auto t0 = std::chrono::steady_clock::now();
  const Status saved = Flux2Transformer::random(cfg, 42, at::kBFloat16).save(path);
  if (!saved.ok()) return saved.to_string();
  *generated_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return "";
}

}  // namespace infill::bench
