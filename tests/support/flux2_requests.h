#pragma once
// Small FLUX.2 requests for the transformer's tests on every device: a config, random
// requests in klein's editing layout, full and mask-aware segments, and an in-memory K/V cache
// kept on the CPU in fp16 as the activation cache keeps it.
#include <cstdint>
#include <span>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "model/flux2_transformer.h"

namespace infill::test {

using infill::Flux2Config;
using infill::Flux2Segment;
using infill::Flux2Transformer;

/// Records K/V of a full forward as the activation cache does (fp16) and serves them back,
/// through fp16 slabs (the CPU fast path) or float copies (the generic path). K/V computed
/// on a GPU are brought to the host, as the engine's sink does.
class MemoryKv final : public KvSink, public KvSource {
 public:
  explicit MemoryKv(bool slabs) : slabs_(slabs) {}
  void store(int block, const at::Tensor& k, const at::Tensor& v) override {
    if (static_cast<int>(k_.size()) <= block) {
      k_.resize(block + 1);
      v_.resize(block + 1);
    }
    k_[block] = k.to(at::kCPU, at::kHalf).contiguous();
    v_[block] = v.to(at::kCPU, at::kHalf).contiguous();
  }
  void fetch(int block, at::Tensor& k, at::Tensor& v) override {
    k.copy_(k_.at(block));
    v.copy_(v_.at(block));
  }
  bool fp16_slabs(int block, const uint16_t** k, const uint16_t** v) override {
    if (!slabs_) return false;
    *k = reinterpret_cast<const uint16_t*>(k_.at(block).data_ptr<at::Half>());
    *v = reinterpret_cast<const uint16_t*>(v_.at(block).data_ptr<at::Half>());
    return true;
  }
  size_t blocks() const { return k_.size(); }

 private:
  bool slabs_;
  std::vector<at::Tensor> k_, v_;
};

inline Flux2Config small_config() {
  Flux2Config c;
  c.in_channels = 16;
  c.context_dim = 24;
  c.hidden_size = 64;
  c.num_heads = 4;
  c.double_blocks = 2;
  c.single_blocks = 2;
  c.mlp_hidden = 192;
  c.axes_dim = {4, 4, 4, 4};
  return c;
}

/// A request: `txt_len` text tokens, an h x w image grid at t = 0 and, when `reference`,
/// the same grid again as reference tokens at t = 10 (the klein editing layout).
struct Request {
  at::Tensor txt, txt_ids, img, img_ids;
  int64_t length() const { return txt.size(0) + img.size(0); }
};

inline Request make_request(const Flux2Config& c, int txt_len, int h, int w, bool reference, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  Request r;
  r.txt = at::empty({txt_len, c.context_dim}).normal_(0, 1, gen);
  r.txt_ids = at::zeros({txt_len, 4});
  r.txt_ids.select(1, 3).copy_(at::arange(txt_len, at::kFloat));
  const int grids = reference ? 2 : 1;
  r.img = at::empty({grids * h * w, c.in_channels}).normal_(0, 1, gen);
  r.img_ids = at::zeros({grids * h * w, 4});
  for (int g = 0; g < grids; ++g) {
    for (int y = 0; y < h; ++y) {
      for (int x = 0; x < w; ++x) {
        const int64_t row = (static_cast<int64_t>(g) * h + y) * w + x;
        r.img_ids[row][0] = g == 0 ? 0.0 : 10.0;
        r.img_ids[row][1] = static_cast<double>(y);
        r.img_ids[row][2] = static_cast<double>(x);
      }
    }
  }
  return r;
}

inline Flux2Segment full_segment(const Request& r, double t, double guidance = 0.0) {
  Flux2Segment s;
  s.txt = r.txt;
  s.txt_ids = r.txt_ids;
  s.img = r.img;
  s.img_ids = r.img_ids;
  s.timestep = t;
  s.guidance = guidance;
  return s;
}

/// The segment computing text rows `txt_rows` and image rows `img_rows` (indices into the
/// request's text and image rows) with the rest from `kv`.
inline Flux2Segment masked_segment(const Request& r, const at::Tensor& txt_rows, const at::Tensor& img_rows, double t,
                            infill::KvSource* kv, double guidance = 0.0) {
  Flux2Segment s;
  s.txt = r.txt.index_select(0, txt_rows);
  s.txt_ids = r.txt_ids.index_select(0, txt_rows);
  s.img = r.img.index_select(0, img_rows);
  s.img_ids = r.img_ids.index_select(0, img_rows);
  s.positions = at::cat({txt_rows, img_rows + r.txt.size(0)});
  s.sequence_length = r.length();
  s.timestep = t;
  s.guidance = guidance;
  s.kv = kv;
  return s;
}

inline double rel_err(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / b.abs().max().item<double>();
}

inline at::Tensor forward_one(const Flux2Transformer& model, Flux2Segment seg) {
  return model.forward(std::span<Flux2Segment>(&seg, 1));
}

}  // namespace infill::test
