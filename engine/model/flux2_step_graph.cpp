#include "model/flux2_step_graph.h"

#include <algorithm>
#include <array>
#include <cmath>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "model/flux2_layers.h"
#include "model/lora_round.h"

namespace infill {

using namespace flux2;  // the weights and forward pieces (model/flux2_layers.h)

namespace {

constexpr std::array<int64_t, 8> kRowBuckets{64, 128, 192, 256, 384, 512, 768, 1024};

}  // namespace

std::span<const int64_t> flux2_row_buckets() { return kRowBuckets; }

int64_t flux2_row_bucket(int64_t rows) {
  for (int64_t bucket : kRowBuckets) {
    if (rows <= bucket) return bucket;
  }
  return 0;
}

std::string Flux2GraphKey::text() const {
  std::string out;
  for (const Flux2GraphSegmentShape& s : segments) {
    if (!out.empty()) out += ',';
    // Appended piece by piece: GCC 12 warns (-Wrestrict, falsely) on a chain of + here.
    out += 't';
    out += std::to_string(s.text_rows);
    out += '+';
    out += std::to_string(s.image_rows);
    out += '/';
    out += std::to_string(s.sequence);
    if (!s.adapters.empty()) {
      // The key's terms are "<id>*<strength>" joined by '+' (a strength in -10..10 has no '+').
      out += '@';
      for (size_t begin = 0;;) {
        const size_t star = s.adapters.find('*', begin);
        out += s.adapters.substr(begin, std::min<size_t>(8, star - begin));
        const size_t next = star == std::string::npos ? std::string::npos : s.adapters.find('+', star);
        if (next == std::string::npos) break;
        out += '+';
        begin = next + 1;
      }
    }
  }
  return out;
}

std::string flux2_graph_refusal(std::span<const Flux2Segment> segments, const Flux2Config& config) {
  if (segments.empty()) return "no segments";
  for (size_t i = 0; i < segments.size(); ++i) {
    const Flux2Segment& s = segments[i];
    const std::string which = "segment " + std::to_string(i) + ": ";
    if (s.kv == nullptr || !s.positions.defined() || s.sequence_length <= 0) return which + "computes every position";
    if (s.full_blocks != 0) return which + "recomputes a prefix";
    if (s.sink != nullptr) return which + "records K/V";
    if (s.group != nullptr) return which + "is a sequence-parallel share";
    if (!s.img.defined() || flux2_row_bucket(s.img.size(0)) == 0) {
      return which + std::to_string(s.img.defined() ? s.img.size(0) : 0) + " image rows exceed the largest bucket";
    }
    if (config.guidance_embed && !s.guidance_embedding.defined()) return which + "has no guidance embedding";
    if (!s.time_embedding.defined() || !s.rope_cos.defined()) return which + "has no tables on the device";
  }
  return {};
}

Flux2GraphKey flux2_graph_key(std::span<const Flux2Segment> segments) {
  Flux2GraphKey key;
  for (const Flux2Segment& s : segments) {
    key.segments.push_back({s.txt.defined() ? s.txt.size(0) : 0, flux2_row_bucket(s.img.size(0)), s.sequence_length,
                            adapter_set_key(s.adapters)});
  }
  return key;
}

// Every tensor a piece reads or writes across a piece boundary lives here and keeps its address
// for the graph's life: inputs are copied in, activations written in place.
struct Flux2StepGraph::Round {
  at::TensorOptions opts;
  int64_t heads = 0, hidden = 0, mlp = 0;
  double scale = 0;
  // Row ranges: per segment its text rows in the packed text stream, its (bucket) image rows
  // in the image stream, and its rows [text, image] in the joined stream.
  std::vector<int64_t> text_begin, image_begin, joined_begin;
  int64_t text_total = 0, image_total = 0;
  // Inputs.
  at::Tensor txt_in, img_in;           // [T, context], [I, input channels]: compute dtype
  std::vector<at::Tensor> cos, sin;    // per segment [rt + bucket, head_dim / 2]
  at::Tensor time_emb, guidance_emb;   // [n, time_embed_dim] float
  // Activations.
  at::Tensor x_txt, x_img, x;          // residual streams [T, H], [I, H], [T + I, H]
  std::vector<at::Tensor> q, k, v;     // per segment [rt + bucket, H]: post norm and RoPE
  std::vector<at::Tensor> attn;        // per segment [rt + bucket, H]: a double block's attention
  at::Tensor inner;                    // [T + I, H + M]: a single block's attention, then MLP
  // Per segment, made in piece 0 from the embeddings (assigned there only).
  std::vector<std::vector<at::Tensor>> mod_img, mod_txt, mod_single, mod_final;
  at::Tensor out;                      // [I, in_channels] float: every (bucket) image row
  // The round's adapters, stacked at the first run (Flux2StepGraph::stack_adapters), with the
  // sets they come from (kept alive: the stacked tensors may be views of theirs), each packed
  // row's coefficients in the text, image and joined streams, and each segment's [1, K] for
  // its embedders and modulation. Empty without adapters.
  bool adapters_stacked = false;
  LoraRound lora;
  std::vector<AdapterSet> adapter_sets;
  at::Tensor coef_txt, coef_img, coef_joined;
  std::vector<at::Tensor> coef_segment;
  // Per run: the real image rows of each segment.
  std::vector<int64_t> real_rows;
  std::vector<SegmentState> states;

  at::Tensor text_of(const at::Tensor& packed, size_t i, int64_t rt) const { return packed.narrow(0, text_begin[i], rt); }
  at::Tensor image_of(const at::Tensor& packed, size_t i, int64_t rows) const {
    return packed.narrow(0, image_begin[i], rows);
  }
  at::Tensor joined_of(const at::Tensor& packed, size_t i, int64_t rows) const {
    return packed.narrow(0, joined_begin[i], rows);
  }
};

Flux2StepGraph::Flux2StepGraph(const Flux2Transformer& model, Flux2GraphKey key, std::unique_ptr<WorkCapture> capture)
    : model_(model), key_(std::move(key)), capture_(std::move(capture)), round_(std::make_unique<Round>()) {
  c10::InferenceMode guard;
  const Flux2Config& cfg = model_.config();
  Round& r = *round_;
  r.opts = at::TensorOptions().device(model_.device()).dtype(model_.compute_dtype());
  r.heads = cfg.num_heads;
  r.hidden = cfg.hidden_size;
  r.mlp = cfg.mlp_hidden;
  r.scale = 1.0 / std::sqrt(static_cast<double>(cfg.head_dim()));
  const size_t n = key_.segments.size();
  for (const Flux2GraphSegmentShape& s : key_.segments) {
    r.text_begin.push_back(r.text_total);
    r.image_begin.push_back(r.image_total);
    r.joined_begin.push_back(r.text_total + r.image_total);
    r.text_total += s.text_rows;
    r.image_total += s.image_rows;
    const int64_t rows = s.text_rows + s.image_rows;
    // Padding rows keep zero tables: RoPE turns their q and k into zeros, which no real row
    // reads anyway.
    const auto table = r.opts.dtype(model_.rope_table_dtype());
    r.cos.push_back(at::zeros({rows, cfg.head_dim() / 2}, table));
    r.sin.push_back(at::zeros({rows, cfg.head_dim() / 2}, table));
    for (auto* per_segment : {&r.q, &r.k, &r.v, &r.attn}) per_segment->push_back(at::zeros({rows, r.hidden}, r.opts));
  }
  // The joined stream keeps each segment's rows together ([text, image] per segment), so the
  // begin offsets above are recomputed for it.
  int64_t joined = 0;
  for (size_t i = 0; i < n; ++i) {
    r.joined_begin[i] = joined;
    joined += key_.segments[i].text_rows + key_.segments[i].image_rows;
  }
  r.txt_in = at::zeros({r.text_total, cfg.context_dim}, r.opts);
  r.img_in = at::zeros({r.image_total, cfg.input_channels()}, r.opts);
  const auto floats = at::TensorOptions().device(model_.device()).dtype(at::kFloat);
  r.time_emb = at::zeros({static_cast<int64_t>(n), cfg.time_embed_dim}, floats);
  r.guidance_emb = at::zeros({static_cast<int64_t>(n), cfg.time_embed_dim}, floats);
  r.x_txt = at::zeros({r.text_total, r.hidden}, r.opts);
  r.x_img = at::zeros({r.image_total, r.hidden}, r.opts);
  r.x = at::zeros({r.text_total + r.image_total, r.hidden}, r.opts);
  r.inner = at::zeros({r.text_total + r.image_total, r.hidden + r.mlp}, r.opts);
  r.out = at::zeros({r.image_total, cfg.in_channels}, floats);
}

Flux2StepGraph::~Flux2StepGraph() = default;

int64_t Flux2StepGraph::bytes() const {
  const Round& r = *round_;
  int64_t total = capture_->bytes();
  auto add = [&](const at::Tensor& t) { total += static_cast<int64_t>(t.nbytes()); };
  for (const at::Tensor* t : {&r.txt_in, &r.img_in, &r.time_emb, &r.guidance_emb, &r.x_txt, &r.x_img, &r.x, &r.inner, &r.out}) {
    add(*t);
  }
  for (const auto* per_segment : {&r.cos, &r.sin, &r.q, &r.k, &r.v, &r.attn}) {
    for (const at::Tensor& t : *per_segment) add(t);
  }
  total += r.lora.bytes();
  return total;
}

const std::vector<AdapterSet>& Flux2StepGraph::adapter_sets() const { return round_->adapter_sets; }

void Flux2StepGraph::stack_adapters(std::span<const Flux2Segment> segments) {
  Round& r = *round_;
  r.adapter_sets.clear();
  std::vector<const AdapterSet*> sets;
  std::vector<int64_t> text_rows, image_rows, joined_rows;
  for (size_t i = 0; i < segments.size(); ++i) {
    r.adapter_sets.push_back(segments[i].adapters);
    text_rows.push_back(key_.segments[i].text_rows);
    image_rows.push_back(key_.segments[i].image_rows);
    joined_rows.push_back(key_.segments[i].text_rows + key_.segments[i].image_rows);
  }
  for (const AdapterSet& set : r.adapter_sets) sets.push_back(&set);
  r.lora = LoraRound::build(sets, r.opts);
  r.coef_txt = r.lora.row_coefficients(text_rows);
  r.coef_img = r.lora.row_coefficients(image_rows);
  r.coef_joined = r.lora.row_coefficients(joined_rows);
  r.coef_segment.clear();
  for (size_t i = 0; i < segments.size(); ++i) r.coef_segment.push_back(r.lora.segment_coefficients(i));
  r.adapters_stacked = true;
}

void Flux2StepGraph::stage_inputs(std::span<Flux2Segment> segments) {
  Round& r = *round_;
  const Flux2Config& cfg = model_.config();
  r.real_rows.assign(segments.size(), 0);
  r.states.assign(segments.size(), SegmentState{});
  for (size_t i = 0; i < segments.size(); ++i) {
    Flux2Segment& seg = segments[i];
    const Flux2GraphSegmentShape& shape = key_.segments[i];
    const int64_t rt = shape.text_rows, ri = seg.img.size(0);
    r.real_rows[i] = ri;
    if (rt > 0) r.text_of(r.txt_in, i, rt).copy_(seg.txt);
    at::Tensor img = r.image_of(r.img_in, i, shape.image_rows);
    img.narrow(0, 0, ri).copy_(seg.img);
    // Padding rows are zeros: rows left by a larger round of this shape would do no harm
    // either (a padding row reaches no real row), but zeros keep every run the same.
    if (ri < shape.image_rows) img.narrow(0, ri, shape.image_rows - ri).zero_();
    r.cos[i].narrow(0, 0, rt + ri).copy_(seg.rope_cos);
    r.sin[i].narrow(0, 0, rt + ri).copy_(seg.rope_sin);
    if (ri < shape.image_rows) {
      r.cos[i].narrow(0, rt + ri, shape.image_rows - ri).zero_();
      r.sin[i].narrow(0, rt + ri, shape.image_rows - ri).zero_();
    }
    r.time_emb[static_cast<int64_t>(i)].copy_(seg.time_embedding);
    if (cfg.guidance_embed) r.guidance_emb[static_cast<int64_t>(i)].copy_(seg.guidance_embedding);
    // What the eager attention between the pieces reads: this round's rows and source.
    SegmentState& s = r.states[i];
    s.seg = &seg;
    s.rt = rt;
    s.ri = ri;
    s.length = seg.sequence_length;
    s.full = false;
    s.positions = seg.positions.to(at::kCPU, at::kLong).contiguous();
    if (seg.positions_on_device.defined() && seg.positions_on_device.device() == model_.device()) {
      s.positions_device = seg.positions_on_device;
    }
  }
}

void Flux2StepGraph::piece(int p) {
  const Flux2Transformer::Weights& w = model_.weights();
  const bool fused = w.fused_norms;
  const Flux2Config& cfg = w.cfg;
  Round& r = *round_;
  const size_t n = key_.segments.size();
  const int64_t H = r.hidden, M = r.mlp, heads = r.heads;
  const int depth = cfg.depth();
  auto rt = [&](size_t i) { return key_.segments[i].text_rows; };
  auto bucket = [&](size_t i) { return key_.segments[i].image_rows; };
  // x W^T plus the round's adapter terms of W for x's rows, whose coefficients are `coef` (as
  // the eager forward's).
  auto lin = [&r](const Linear& l, const at::Tensor& x, const at::Tensor& coef) {
    at::Tensor y = l(x);
    if (!r.lora.empty()) r.lora.add(l.name, x, coef, y);
    return y;
  };

  if (p == 0) {
    // The modulation of every segment from its embeddings, and the input projections.
    for (auto* mods : {&r.mod_img, &r.mod_txt, &r.mod_single, &r.mod_final}) mods->assign(n, {});
    for (size_t i = 0; i < n; ++i) {
      const at::Tensor& cs = r.coef_segment[i];  // undefined without adapters
      const at::Tensor t_emb = r.time_emb[static_cast<int64_t>(i)].to(r.opts);
      at::Tensor vec = lin(w.time_in1, at::silu(lin(w.time_in0, t_emb, cs)), cs);
      if (cfg.guidance_embed) {
        const at::Tensor g_emb = r.guidance_emb[static_cast<int64_t>(i)].to(r.opts);
        vec = vec + lin(w.guidance_in1, at::silu(lin(w.guidance_in0, g_emb, cs)), cs);
      }
      const at::Tensor act = at::silu(vec).unsqueeze(0);
      r.mod_img[i] = lin(w.mod_img, act, cs).chunk(6, 1);
      r.mod_txt[i] = lin(w.mod_txt, act, cs).chunk(6, 1);
      r.mod_single[i] = lin(w.mod_single, act, cs).chunk(3, 1);
      r.mod_final[i] = lin(w.final_ada, act, cs).chunk(2, 1);
    }
    if (r.text_total > 0) r.x_txt.copy_(lin(w.txt_in, r.txt_in, r.coef_txt));
    r.x_img.copy_(lin(w.img_in, r.img_in, r.coef_img));
  }

  if (p > 0 && p <= cfg.double_blocks) {  // the rest of double block p - 1
    const DoubleBlock& blk = w.doubles[p - 1];
    at::Tensor attn_t = r.text_total > 0 ? at::empty({r.text_total, H}, r.opts) : at::Tensor();
    at::Tensor attn_i = at::empty({r.image_total, H}, r.opts);
    for (size_t i = 0; i < n; ++i) {
      if (rt(i) > 0) r.text_of(attn_t, i, rt(i)).copy_(r.attn[i].narrow(0, 0, rt(i)));
      r.image_of(attn_i, i, bucket(i)).copy_(r.attn[i].narrow(0, rt(i), bucket(i)));
    }
    if (r.text_total > 0) {
      const at::Tensor proj_t = lin(blk.txt.proj, attn_t, r.coef_txt);
      for (size_t i = 0; i < n; ++i) {
        if (rt(i) > 0) r.text_of(r.x_txt, i, rt(i)).addcmul_(r.text_of(proj_t, i, rt(i)), r.mod_txt[i][2]);
      }
    }
    const at::Tensor proj_i = lin(blk.img.proj, attn_i, r.coef_img);
    for (size_t i = 0; i < n; ++i) r.image_of(r.x_img, i, bucket(i)).addcmul_(r.image_of(proj_i, i, bucket(i)), r.mod_img[i][2]);
    auto mlp = [&](const Stream& st, at::Tensor& x, bool text) {
      if (x.size(0) == 0) return;
      at::Tensor h = pre_norm(x, fused);
      auto slice = [&](const at::Tensor& t, size_t i) { return text ? r.text_of(t, i, rt(i)) : r.image_of(t, i, bucket(i)); };
      for (size_t i = 0; i < n; ++i) {
        if (text && rt(i) == 0) continue;
        const auto& mod = text ? r.mod_txt[i] : r.mod_img[i];
        modulate_rows(slice(x, i), slice(h, i), mod[3], mod[4], fused);
      }
      const at::Tensor& coef = text ? r.coef_txt : r.coef_img;
      at::Tensor up = lin(st.mlp_in, h, coef);
      at::Tensor out = lin(st.mlp_out, at::silu(up.narrow(1, 0, M)).mul_(up.narrow(1, M, M)), coef);
      for (size_t i = 0; i < n; ++i) {
        if (text && rt(i) == 0) continue;
        const auto& mod = text ? r.mod_txt[i] : r.mod_img[i];
        slice(x, i).addcmul_(slice(out, i), mod[5]);
      }
    };
    mlp(blk.txt, r.x_txt, true);
    mlp(blk.img, r.x_img, false);
    if (p == cfg.double_blocks) {
      // Into the joined stream: each segment's text rows, then its image rows.
      for (size_t i = 0; i < n; ++i) {
        if (rt(i) > 0) r.joined_of(r.x, i, rt(i)).copy_(r.text_of(r.x_txt, i, rt(i)));
        r.x.narrow(0, r.joined_begin[i] + rt(i), bucket(i)).copy_(r.image_of(r.x_img, i, bucket(i)));
      }
    }
  } else if (p > cfg.double_blocks) {  // the rest of single block p - 1
    const SingleBlock& blk = w.singles[p - 1 - cfg.double_blocks];
    const at::Tensor out = lin(blk.linear2, r.inner, r.coef_joined);
    for (size_t i = 0; i < n; ++i) {
      const int64_t rows = rt(i) + bucket(i);
      r.joined_of(r.x, i, rows).addcmul_(r.joined_of(out, i, rows), r.mod_single[i][2]);
    }
  }
  if (p == 0 && cfg.double_blocks == 0) {
    for (size_t i = 0; i < n; ++i) {
      if (rt(i) > 0) r.joined_of(r.x, i, rt(i)).copy_(r.text_of(r.x_txt, i, rt(i)));
      r.x.narrow(0, r.joined_begin[i] + rt(i), bucket(i)).copy_(r.image_of(r.x_img, i, bucket(i)));
    }
  }

  if (p < cfg.double_blocks) {  // double block p up to its attention
    const DoubleBlock& blk = w.doubles[p];
    at::Tensor ht = r.text_total > 0 ? pre_norm(r.x_txt, fused) : at::Tensor();
    at::Tensor hi = pre_norm(r.x_img, fused);
    for (size_t i = 0; i < n; ++i) {
      if (rt(i) > 0) {
        modulate_rows(r.text_of(r.x_txt, i, rt(i)), r.text_of(ht, i, rt(i)), r.mod_txt[i][0], r.mod_txt[i][1], fused);
      }
      modulate_rows(r.image_of(r.x_img, i, bucket(i)), r.image_of(hi, i, bucket(i)), r.mod_img[i][0], r.mod_img[i][1],
                    fused);
    }
    const at::Tensor qkv_t = r.text_total > 0 ? lin(blk.txt.qkv, ht, r.coef_txt) : at::Tensor();
    const at::Tensor qkv_i = lin(blk.img.qkv, hi, r.coef_img);
    for (size_t i = 0; i < n; ++i) {
      const at::Tensor im = r.image_of(qkv_i, i, bucket(i));
      const at::Tensor t = rt(i) > 0 ? r.text_of(qkv_t, i, rt(i)) : at::Tensor();
      double_block_qk(blk, t, im, r.cos[i], r.sin[i], heads, fused, r.q[i], r.k[i]);
      if (rt(i) > 0) r.v[i].narrow(0, 0, rt(i)).copy_(t.narrow(1, 2 * H, H));
      r.v[i].narrow(0, rt(i), bucket(i)).copy_(im.narrow(1, 2 * H, H));
    }
  } else if (p < depth) {  // single block up to its attention
    const SingleBlock& blk = w.singles[p - cfg.double_blocks];
    at::Tensor h = pre_norm(r.x, fused);
    for (size_t i = 0; i < n; ++i) {
      const int64_t rows = rt(i) + bucket(i);
      modulate_rows(r.joined_of(r.x, i, rows), r.joined_of(h, i, rows), r.mod_single[i][0], r.mod_single[i][1], fused);
    }
    const at::Tensor y = lin(blk.linear1, h, r.coef_joined);  // [R, 3H + 2M]: q, k, v, then the MLP's gate and up halves
    for (size_t i = 0; i < n; ++i) {
      const at::Tensor ys = r.joined_of(y, i, rt(i) + bucket(i));
      single_block_qk(blk, ys, r.cos[i], r.sin[i], heads, fused, r.q[i], r.k[i]);
      r.v[i].copy_(ys.narrow(1, 2 * H, H));
    }
    r.inner.narrow(1, H, M).copy_(at::silu(y.narrow(1, 3 * H, M)).mul_(y.narrow(1, 3 * H + M, M)));
  } else {  // the final layer on every image row
    std::vector<at::Tensor> rows;
    for (size_t i = 0; i < n; ++i) {
      const at::Tensor image = r.x.narrow(0, r.joined_begin[i] + rt(i), bucket(i));
      at::Tensor h = pre_norm(image, fused);
      modulate_rows(image, h, r.mod_final[i][0], r.mod_final[i][1], fused);
      rows.push_back(h);
    }
    r.out.copy_(lin(w.final_linear, n == 1 ? rows[0] : at::cat(rows, 0), r.coef_img));
  }
}

void Flux2StepGraph::attention(int block, std::span<Flux2Segment> segments) {
  Round& r = *round_;
  const bool double_block = block < model_.config().double_blocks;
  for (size_t i = 0; i < segments.size(); ++i) {
    const int64_t rows = key_.segments[i].text_rows + r.real_rows[i];  // the real rows only
    const at::Tensor out = segment_attention(r.states[i], block, r.q[i].narrow(0, 0, rows), r.k[i].narrow(0, 0, rows),
                                             r.v[i].narrow(0, 0, rows), r.heads, r.scale);
    if (double_block) {
      r.attn[i].narrow(0, 0, rows).copy_(out);
    } else {
      r.inner.narrow(0, r.joined_begin[i], rows).narrow(1, 0, r.hidden).copy_(out);
    }
  }
}

at::Tensor Flux2StepGraph::run(std::span<Flux2Segment> segments) {
  c10::InferenceMode guard;
  TORCH_CHECK(flux2_graph_key(segments) == key_, "FLUX.2 step graph ", key_.text(), ": a round of shape ",
              flux2_graph_key(segments).text());
  stage_inputs(segments);
  const int depth = model_.config().depth();
  const bool record = pieces_.empty();
  if (!round_->adapters_stacked) stack_adapters(segments);
  try {
    for (int p = 0; p <= depth; ++p) {
      if (record) {
        pieces_.push_back(capture_->capture([this, p] { piece(p); }));
      } else {
        pieces_[static_cast<size_t>(p)]->replay();
      }
      if (p < depth) attention(p, segments);
    }
  } catch (...) {
    if (record) pieces_.clear();  // half a recording replays nothing: record again or go eager
    throw;
  }
  Round& r = *round_;
  std::vector<at::Tensor> real;
  for (size_t i = 0; i < segments.size(); ++i) real.push_back(r.image_of(r.out, i, r.real_rows[i]));
  return at::cat(real, 0);  // a tensor of its own: the next run rewrites r.out
}

}  // namespace infill
