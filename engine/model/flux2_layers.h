#pragma once
/// The FLUX.2 transformer's weights and the pieces of its forward, shared by the two files
/// that run it: model/flux2_transformer.cpp (the forward over any segments) and
/// model/flux2_step_graph.cpp (a bucketed masked round, replayed as CUDA graphs). Internal to
/// the model layer: nothing outside engine/model includes it.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "model/float8_linear.h"
#include "model/flux2_transformer.h"
#include "model/stored_linear.h"

namespace infill {

namespace flux2 {

constexpr double kNormEps = 1e-6;  // LayerNorm and QK RMSNorm, as upstream

// A bias-free linear layer whose weight stays in its stored dtype (model/stored_linear.h), or
// in FP8 with a scale per output row (model/float8_linear.h: Flux2Transformer::with_float8_weights).
struct Linear {
  at::Tensor w;      // [out, in]: the weight, or its E4M3 codes when `scale` is defined
  at::Tensor scale;  // [1, out] float32 for FP8 codes; undefined otherwise
  // [out] float32 on the CPU: the scales of the rows as an E4M3 file stored them, from which
  // the FP8 path takes the file's own codes back (Flux2Checkpoint::float8_row_scales);
  // undefined when the file stored the weight otherwise, or once the weight is changed.
  at::Tensor file_scale;
  std::string name;  // the weight's checkpoint name: what LoRAs adapt
  at::Tensor operator()(const at::Tensor& x) const {
    return scale.defined() ? float8_linear(x, Float8Weight{w, scale}) : stored_linear(x, w);
  }
  // The weight in `dtype` (FP8 codes times their scales).
  at::Tensor dense(at::ScalarType dtype) const {
    return scale.defined() ? dequantize_float8_rows(Float8Weight{w, scale}, dtype) : w.to(dtype);
  }
};

// The weights of one stream (image or text) of a double block.
struct Stream {
  Linear qkv, proj, mlp_in, mlp_out;
  at::Tensor q_scale, k_scale;  // QK RMSNorm [head_dim]
};

struct DoubleBlock {
  Stream img, txt;
};

struct SingleBlock {
  Linear linear1, linear2;
  at::Tensor q_scale, k_scale;
};

}  // namespace flux2

struct Flux2Transformer::Weights {
  Flux2Config cfg;
  using Linear = flux2::Linear;
  Linear img_in, txt_in, time_in0, time_in1, guidance_in0, guidance_in1;
  Linear mod_img, mod_txt, mod_single, final_ada, final_linear;
  std::vector<flux2::DoubleBlock> doubles;
  std::vector<flux2::SingleBlock> singles;
  // The row norms as the project's CUDA kernels (Flux2Transformer::with_fused_norms) where the
  // rows are on a CUDA device; libtorch's ops otherwise.
  bool fused_norms = false;

  struct Slot {
    std::string name;
    std::vector<int64_t> shape;
    at::Tensor* tensor;
    Linear* linear = nullptr;  // the layer whose weight this is; null for norm scales
  };
  // Every weight with its checkpoint name and shape: the one list that load, save and random
  // initialisation share.
  std::vector<Slot> slots() {
    const int64_t h = cfg.hidden_size, d = cfg.head_dim(), m = cfg.mlp_hidden;
    std::vector<Slot> s;
    auto lin = [&](const std::string& name, Linear& l, int64_t out, int64_t in) {
      l.name = name + ".weight";
      s.push_back({l.name, {out, in}, &l.w, &l});
    };
    lin("img_in", img_in, h, cfg.input_channels());
    lin("txt_in", txt_in, h, cfg.context_dim);
    lin("time_in.in_layer", time_in0, h, cfg.time_embed_dim);
    lin("time_in.out_layer", time_in1, h, h);
    if (cfg.guidance_embed) {
      lin("guidance_in.in_layer", guidance_in0, h, cfg.time_embed_dim);
      lin("guidance_in.out_layer", guidance_in1, h, h);
    }
    lin("double_stream_modulation_img.lin", mod_img, 6 * h, h);
    lin("double_stream_modulation_txt.lin", mod_txt, 6 * h, h);
    lin("single_stream_modulation.lin", mod_single, 3 * h, h);
    doubles.resize(cfg.double_blocks);
    for (int i = 0; i < cfg.double_blocks; ++i) {
      const std::string b = "double_blocks." + std::to_string(i) + ".";
      for (auto [name, stream] : {std::pair{"img", &doubles[i].img}, std::pair{"txt", &doubles[i].txt}}) {
        const std::string p = b + name;
        lin(p + "_attn.qkv", stream->qkv, 3 * h, h);
        lin(p + "_attn.proj", stream->proj, h, h);
        s.push_back({p + "_attn.norm.query_norm.scale", {d}, &stream->q_scale});
        s.push_back({p + "_attn.norm.key_norm.scale", {d}, &stream->k_scale});
        lin(p + "_mlp.0", stream->mlp_in, 2 * m, h);
        lin(p + "_mlp.2", stream->mlp_out, h, m);
      }
    }
    singles.resize(cfg.single_blocks);
    for (int i = 0; i < cfg.single_blocks; ++i) {
      const std::string b = "single_blocks." + std::to_string(i) + ".";
      lin(b + "linear1", singles[i].linear1, 3 * h + 2 * m, h);
      lin(b + "linear2", singles[i].linear2, h, h + m);
      s.push_back({b + "norm.query_norm.scale", {d}, &singles[i].q_scale});
      s.push_back({b + "norm.key_norm.scale", {d}, &singles[i].k_scale});
    }
    lin("final_layer.adaLN_modulation.1", final_ada, 2 * h, h);
    lin("final_layer.linear", final_linear, cfg.in_channels, h);
    return s;
  }
};

namespace flux2 {

// Per-segment state of one forward.
struct SegmentState {
  Flux2Segment* seg = nullptr;
  int64_t rt = 0, ri = 0;  // text and image rows computed
  int64_t length = 0;      // L: every position of the request's sequence
  bool full = false;       // every position is computed: no cached rows are read
  at::Tensor positions;    // int64 [rt + ri] on the CPU
  at::Tensor positions_device;  // the same on the compute device (made on first use)
  at::Tensor cos, sin;     // [rt + ri, head_dim / 2]
  std::vector<at::Tensor> mod_img, mod_txt, mod_single, mod_final;  // [1, H] each
  at::Tensor k_buf, v_buf;  // [L, H] float, for sources without fp16 slabs
  at::Tensor group_positions_device;  // a masked share's Flux2Segment::group_positions there
  at::Tensor keep;          // int64 on the CPU: the positions kept after a recomputed prefix
  int64_t keep_text = 0;    // how many of them are text rows
};

at::Tensor layer_norm(const at::Tensor& x);
/// x * (1 + scale) + shift, in place.
void modulate_(at::Tensor x, const at::Tensor& shift, const at::Tensor& scale);
/// RMSNorm over each head's channels: x [R, heads * d], scale [d].
at::Tensor rms_norm_heads(const at::Tensor& x, const at::Tensor& scale, int64_t heads);
/// Rotates each adjacent channel pair (2i, 2i+1) of every head by the row's angle i.
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t heads);

// A pre-norm and its modulation, in two calls so that libtorch's path stays one LayerNorm over
// all of a round's rows and an in-place modulation per segment, and the fused path one kernel
// per segment (kernels/fused_norms.h) from x's rows into the result's:
//   h = pre_norm(x, fused); then for each segment modulate_rows(x's rows, h's rows, ...).
at::Tensor pre_norm(const at::Tensor& x, bool fused);
void modulate_rows(const at::Tensor& x_rows, at::Tensor h_rows, const at::Tensor& shift, const at::Tensor& scale,
                   bool fused);
/// The QK norm and RoPE of a double block's computed rows: text rows first (their qkv
/// projections `t`, none when undefined or empty), then image rows (`im`); cos and sin
/// [R_t + R_i, head_dim / 2]. Returns q and k [R_t + R_i, H]: written into q_out and k_out when
/// given (a round's buffers), new tensors otherwise.
std::pair<at::Tensor, at::Tensor> double_block_qk(const DoubleBlock& blk, const at::Tensor& t, const at::Tensor& im,
                                                  const at::Tensor& cos, const at::Tensor& sin, int64_t heads,
                                                  bool fused, at::Tensor q_out = {}, at::Tensor k_out = {});
/// The same for a single block's rows (`y`: their linear1 outputs, q then k first).
std::pair<at::Tensor, at::Tensor> single_block_qk(const SingleBlock& blk, const at::Tensor& y, const at::Tensor& cos,
                                                  const at::Tensor& sin, int64_t heads, bool fused,
                                                  at::Tensor q_out = {}, at::Tensor k_out = {});
/// Attention of one segment's computed rows over all of its positions in block `block`:
/// q, k, v [R, H] are the fresh rows (post norm and RoPE); the segment's source gives the
/// cached rows of the other positions, its sink takes a full forward's.
at::Tensor segment_attention(SegmentState& s, int block, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             int64_t heads, double scale);

}  // namespace flux2

}  // namespace infill
