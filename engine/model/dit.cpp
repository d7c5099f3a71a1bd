#include "model/dit.h"

#include <cmath>
#include <map>
#include <mutex>
#include <tuple>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "common/shape_text.h"
#include "kernels/masked_attention.h"
#include "kernels/token_rows.h"
#include "model/safetensors.h"
#include "model/safetensors_torch.h"

namespace infill {

namespace {

struct Linear {
  at::Tensor w;  // [out, in]; after finish() a transposed view of `wt`
  at::Tensor b;  // [out]
  at::Tensor wt;  // [in, out] contiguous: OpenBLAS runs the small-M GEMMs of masked tokens faster
  void finish() {
    wt = w.t().contiguous();
    w = wt.t();
  }
  at::Tensor operator()(const at::Tensor& x) const {
    return x.dim() == 1 ? at::addmv(b, w, x) : at::addmm(b, x, wt);
  }
};

// GELU with the tanh approximation, as 0.5 x (1 + tanh(u)) = x sigmoid(2u): the same function,
// and ATen's vectorised sigmoid is about 3x faster here than its tanh-GELU kernel.
at::Tensor gelu_tanh(const at::Tensor& x) {
  constexpr double kTwoSqrtTwoOverPi = 1.5957691216057308;  // 2 * sqrt(2 / pi)
  at::Tensor u = x * x;
  u.mul_(0.044715).add_(1.0).mul_(x).mul_(kTwoSqrtTwoOverPi);
  return u.sigmoid_().mul_(x);
}

}  // namespace

struct Dit::Weights {
  DitConfig cfg;
  at::Tensor x_proj_w;  // [H, C_in, p, p] as stored; x_proj_flat views it as [H, C_in*p*p]
  at::Tensor x_proj_b;
  at::Tensor x_proj_flat;
  Linear t_mlp0, t_mlp2;
  at::Tensor y_table;  // class conditioning [num_classes + 1, H]
  Linear y_mlp0, y_mlp2;
  struct Block {
    Linear qkv, proj, fc1, fc2, ada;
  };
  std::vector<Block> blocks;
  Linear final_ada, final_linear;
  // adaLN weights of all blocks side by side, [H, depth * 6H] (each block's ada.wt is a view
  // into it): one GEMV per segment and forward instead of one per block.
  at::Tensor ada_all_wt, ada_all_b;

  // Position embeddings per grid size, computed once: they are on every forward's path.
  mutable std::mutex pos_mutex;
  mutable std::map<std::pair<int, int>, at::Tensor> pos_cache;

  struct Slot {
    std::string name;
    std::vector<int64_t> shape;
    at::Tensor* tensor;
  };
  // Every weight with its checkpoint name and expected shape: the single list that load,
  // save and random initialisation share.
  std::vector<Slot> slots() {
    const int64_t h = cfg.hidden_size, p = cfg.patch_size, f = cfg.frequency_embedding_size;
    const int64_t mlp = cfg.mlp_hidden();
    std::vector<Slot> s;
    auto lin = [&](const std::string& name, Linear& l, int64_t out, int64_t in) {
      s.push_back({name + ".weight", {out, in}, &l.w});
      s.push_back({name + ".bias", {out}, &l.b});
    };
    s.push_back({"x_embedder.proj.weight", {h, cfg.in_channels(), p, p}, &x_proj_w});
    s.push_back({"x_embedder.proj.bias", {h}, &x_proj_b});
    lin("t_embedder.mlp.0", t_mlp0, h, f);
    lin("t_embedder.mlp.2", t_mlp2, h, h);
    if (cfg.conditioning == ConditioningType::kClass) {
      s.push_back({"y_embedder.embedding_table.weight", {cfg.num_classes + 1, h}, &y_table});
    } else if (cfg.conditioning == ConditioningType::kVector) {
      lin("y_embedder.mlp.0", y_mlp0, h, cfg.conditioning_dim);
      lin("y_embedder.mlp.2", y_mlp2, h, h);
    }
    blocks.resize(cfg.depth);
    for (int i = 0; i < cfg.depth; ++i) {
      const std::string b = "blocks." + std::to_string(i);
      lin(b + ".attn.qkv", blocks[i].qkv, 3 * h, h);
      lin(b + ".attn.proj", blocks[i].proj, h, h);
      lin(b + ".mlp.fc1", blocks[i].fc1, mlp, h);
      lin(b + ".mlp.fc2", blocks[i].fc2, h, mlp);
      lin(b + ".adaLN_modulation.1", blocks[i].ada, 6 * h, h);
    }
    lin("final_layer.adaLN_modulation.1", final_ada, 2 * h, h);
    lin("final_layer.linear", final_linear, p * p * cfg.out_channels(), h);
    return s;
  }

  void finish() {
    x_proj_flat = x_proj_w.reshape({x_proj_w.size(0), -1});
    for (Linear* l : {&t_mlp0, &t_mlp2, &y_mlp0, &y_mlp2, &final_ada, &final_linear}) {
      if (l->w.defined()) l->finish();
    }
    for (Block& b : blocks) {
      for (Linear* l : {&b.qkv, &b.proj, &b.fc1, &b.fc2, &b.ada}) l->finish();
    }
    std::vector<at::Tensor> wts, bs;
    for (Block& b : blocks) {
      wts.push_back(b.ada.wt);
      bs.push_back(b.ada.b);
    }
    ada_all_wt = at::cat(wts, 1).contiguous();
    ada_all_b = at::cat(bs, 0).contiguous();
    const int64_t width = 6 * static_cast<int64_t>(cfg.hidden_size);
    for (size_t i = 0; i < blocks.size(); ++i) {
      blocks[i].ada.wt = ada_all_wt.narrow(1, static_cast<int64_t>(i) * width, width);
      blocks[i].ada.w = blocks[i].ada.wt.t();
      blocks[i].ada.b = ada_all_b.narrow(0, static_cast<int64_t>(i) * width, width);
    }
  }

  at::Tensor positions(int grid_h, int grid_w) const {
    std::lock_guard<std::mutex> lock(pos_mutex);
    auto& entry = pos_cache[{grid_h, grid_w}];
    if (!entry.defined()) entry = sincos_position_embedding(cfg.hidden_size, grid_h, grid_w);
    return entry;
  }
};

Dit::Dit(std::unique_ptr<Weights> weights) : w_(std::move(weights)) {}
Dit::Dit(Dit&&) noexcept = default;
Dit& Dit::operator=(Dit&&) noexcept = default;
Dit::~Dit() = default;

const DitConfig& Dit::config() const { return w_->cfg; }

Result<Dit> Dit::load(const DitConfig& config, const std::string& weights_path) {
  INFILL_RETURN_IF_ERROR(config.validate());
  INFILL_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(weights_path));
  auto w = std::make_unique<Weights>();
  w->cfg = config;
  c10::InferenceMode guard;
  for (auto& slot : w->slots()) {
    const std::string name = config.key_prefix + slot.name;
    if (file.find(name) == nullptr) {
      return not_found(weights_path + ": weight " + name + " is missing (expected shape " +
                       shape_text(slot.shape) + ")");
    }
    INFILL_ASSIGN_OR_RETURN(*slot.tensor, load_float_tensor(file, name, slot.shape));
  }
  w->finish();
  return Dit(std::move(w));
}

Dit Dit::random(const DitConfig& config, uint64_t seed) {
  auto w = std::make_unique<Weights>();
  w->cfg = config;
  c10::InferenceMode guard;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (auto& slot : w->slots()) {
    *slot.tensor = at::empty(slot.shape, at::kFloat).normal_(0.0, 0.02, gen);
  }
  w->finish();
  return Dit(std::move(w));
}

Status Dit::save(const std::string& path, bool fp16) const {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (auto& slot : w_->slots()) {
    at::Tensor t = slot.tensor->contiguous();
    tensors.emplace_back(w_->cfg.key_prefix + slot.name, fp16 ? t.to(at::kHalf) : t);
  }
  return write_safetensors(path, tensors, {{"format", "pt"}});
}

at::Tensor sincos_position_embedding(int dim, int grid_h, int grid_w) {
  // As get_2d_sincos_pos_embed of the DiT reference: the first half encodes the column (x),
  // the second half the row (y); each half is cat(sin, cos) over dim/4 frequencies.
  const int quarter = dim / 4;
  at::Tensor omega = at::arange(quarter, at::kDouble) / static_cast<double>(quarter);
  omega = 1.0 / at::pow(10000.0, omega);
  at::Tensor ys = at::arange(grid_h, at::kDouble).repeat_interleave(grid_w);
  at::Tensor xs = at::arange(grid_w, at::kDouble).repeat({grid_h});
  auto half = [&](const at::Tensor& pos) {
    at::Tensor out = at::outer(pos, omega);
    return at::cat({at::sin(out), at::cos(out)}, 1);
  };
  return at::cat({half(xs), half(ys)}, 1).to(at::kFloat).contiguous();
}

at::Tensor timestep_features(double timestep, int dim) {
  const int half = dim / 2;
  at::Tensor freqs = at::exp(-std::log(10000.0) * at::arange(half, at::kFloat) / static_cast<float>(half));
  at::Tensor args = freqs * static_cast<float>(timestep);
  return at::cat({at::cos(args), at::sin(args)});
}

at::Tensor Dit::conditioning(double timestep, const at::Tensor& prompt) const {
  c10::InferenceMode guard;
  const auto& cfg = w_->cfg;
  at::Tensor c = w_->t_mlp2(at::silu(w_->t_mlp0(timestep_features(timestep, cfg.frequency_embedding_size))));
  switch (cfg.conditioning) {
    case ConditioningType::kNone: break;
    case ConditioningType::kClass: {
      const int64_t id = prompt.defined() ? prompt.item<int64_t>() : cfg.num_classes;
      TORCH_CHECK(id >= 0 && id <= cfg.num_classes, "class id ", id, " outside [0, ", cfg.num_classes, "]");
      c = c + w_->y_table[id];
      break;
    }
    case ConditioningType::kVector: {
      at::Tensor v = prompt.defined() ? prompt.to(at::kFloat).reshape({-1})
                                      : at::zeros({cfg.conditioning_dim}, at::kFloat);
      TORCH_CHECK(v.size(0) == cfg.conditioning_dim, "conditioning vector has ", v.size(0),
                  " values, the model expects ", cfg.conditioning_dim);
      c = c + w_->y_mlp2(at::silu(w_->y_mlp0(v)));
      break;
    }
  }
  return c;
}

at::Tensor Dit::patchify(const at::Tensor& input) const {
  const int64_t p = w_->cfg.patch_size;
  const int64_t c = input.size(0), h = input.size(1), w = input.size(2);
  TORCH_CHECK(h % p == 0 && w % p == 0, "model input ", h, "x", w, " is not a multiple of the patch size ", p);
  TORCH_CHECK(c == w_->cfg.in_channels(), "model input has ", c, " channels, expected ", w_->cfg.in_channels());
  // [c, gh, p, gw, p] -> [gh, gw, c, p, p]
  return input.reshape({c, h / p, p, w / p, p}).permute({1, 3, 0, 2, 4}).reshape({(h / p) * (w / p), c * p * p});
}

void Dit::unpatchify_into(at::Tensor& latent, const at::Tensor& rows, const at::Tensor& token_ids) const {
  const int64_t p = w_->cfg.patch_size, c = w_->cfg.latent_channels;
  const int64_t h = latent.size(1), w = latent.size(2), gw = w / p;
  const int64_t n = token_ids.size(0);
  TORCH_CHECK(latent.is_contiguous(), "unpatchify_into needs a contiguous latent");
  // rows [n, p, p, C_out] -> keep the first C channels -> [n, c, p, p]
  at::Tensor patches = rows.reshape({n, p, p, -1}).narrow(3, 0, c).permute({0, 3, 1, 2});
  // view5[:, gy, :, gx, :] has shape [n, c, p, p]: advanced indices separated by slices put
  // their dimension first, as in NumPy.
  at::Tensor view5 = latent.view({c, h / p, p, w / p, p});
  at::Tensor gy = at::div(token_ids, gw, "floor"), gx = token_ids.remainder(gw);
  view5.index_put_({at::indexing::Slice(), gy, at::indexing::Slice(), gx, at::indexing::Slice()}, patches);
}

namespace {

// Per-segment working state of one packed forward.
struct SegmentState {
  DitSegment* seg = nullptr;
  at::Tensor x;         // [R, H] current rows
  at::Tensor ids;       // int64 [R]
  at::Tensor prompted;  // bool [R] or undefined
  bool full = false;    // rows are the whole grid and K/V are fresh
  at::Tensor k_buf, v_buf;
  at::Tensor ada_prompt, ada_null;  // [depth * 6H] modulation of every block
};

// adaLN parameters of one segment for block `b`: [1, 6H] when every row shares the prompt,
// [R, 6H] when rows differ (prompt only on masked tokens in a full forward).
at::Tensor block_modulation(const SegmentState& s, int b, int64_t hidden) {
  const int64_t width = 6 * hidden;
  at::Tensor with_prompt = s.ada_prompt.narrow(0, b * width, width).unsqueeze(0);
  if (!s.prompted.defined()) return with_prompt;
  at::Tensor without = s.ada_null.narrow(0, b * width, width).unsqueeze(0);
  return at::where(s.prompted.unsqueeze(1), with_prompt, without);
}

// adaLN parameters of one segment for one layer: [1, n*H] when every row shares the prompt,
// [R, n*H] when rows differ (prompt only on masked tokens in a full forward).
at::Tensor segment_modulation(const Linear& ada, const SegmentState& s) {
  at::Tensor with_prompt = ada(at::silu(s.seg->cond)).unsqueeze(0);
  if (!s.prompted.defined()) return with_prompt;
  at::Tensor without = ada(at::silu(s.seg->null_cond)).unsqueeze(0);
  return at::where(s.prompted.unsqueeze(1), with_prompt, without);
}

// x * (1 + scale) + shift, in place, without temporaries.
void modulate_(at::Tensor x, const at::Tensor& shift, const at::Tensor& scale) {
  x.addcmul_(x, scale).add_(shift);
}

}  // namespace

at::Tensor Dit::forward(std::span<DitSegment> segments) const {
  c10::InferenceMode guard;
  const auto& cfg = w_->cfg;
  const int64_t H = cfg.hidden_size;
  const double scale = 1.0 / std::sqrt(static_cast<double>(cfg.head_dim()));

  std::vector<SegmentState> states(segments.size());
  for (size_t i = 0; i < segments.size(); ++i) {
    DitSegment& seg = segments[i];
    SegmentState& s = states[i];
    s.seg = &seg;
    const int64_t L = static_cast<int64_t>(seg.grid_h) * seg.grid_w;
    TORCH_CHECK(seg.tokens.dim() == 2 && seg.tokens.size(0) == seg.token_ids.size(0),
                "segment ", i, ": tokens and token_ids disagree");
    TORCH_CHECK(seg.full_blocks >= 0 && seg.full_blocks <= cfg.depth, "segment ", i, ": full_blocks out of range");
    if (seg.full_blocks > 0) {
      TORCH_CHECK(seg.tokens.size(0) == L, "segment ", i, ": full blocks need all ", L, " tokens");
    }
    const int64_t carried = seg.full_blocks > 0 && seg.carry_rows.defined() ? seg.carry_rows.size(0) : seg.tokens.size(0);
    if (seg.full_blocks < cfg.depth && carried < L) {
      TORCH_CHECK(seg.kv != nullptr, "segment ", i, ": a masked forward needs a KvSource");
    }
    s.ids = seg.token_ids;
    s.prompted = seg.prompted;
    s.ada_prompt = at::addmv(w_->ada_all_b, w_->ada_all_wt.t(), at::silu(seg.cond));
    if (s.prompted.defined()) s.ada_null = at::addmv(w_->ada_all_b, w_->ada_all_wt.t(), at::silu(seg.null_cond));
    s.x = at::linear(seg.tokens, w_->x_proj_flat, w_->x_proj_b);
    s.x.add_(w_->positions(seg.grid_h, seg.grid_w).index_select(0, seg.token_ids));
  }

  auto reduce_rows = [](SegmentState& s) {
    const at::Tensor& rows = s.seg->carry_rows;
    if (!rows.defined()) return;
    s.x = s.x.index_select(0, rows);
    s.ids = s.ids.index_select(0, rows);
    if (s.prompted.defined()) s.prompted = s.prompted.index_select(0, rows);
  };

  for (int b = 0; b < cfg.depth; ++b) {
    const Weights::Block& blk = w_->blocks[b];
    for (auto& s : states) {
      if (s.seg->full_blocks > 0 && b == s.seg->full_blocks) reduce_rows(s);
      s.full = b < s.seg->full_blocks;
    }
    // Row ranges of the segments in the packed matrix; a single segment needs no slicing.
    const bool single = states.size() == 1;
    std::vector<int64_t> begin(states.size());
    int64_t rows_total = 0;
    for (size_t i = 0; i < states.size(); ++i) {
      begin[i] = rows_total;
      rows_total += states[i].x.size(0);
    }
    auto slice = [&](const at::Tensor& t, size_t i) {
      return single ? t : t.narrow(0, begin[i], states[i].x.size(0));
    };
    at::Tensor x;
    if (single) {
      x = states[0].x;
    } else {
      std::vector<at::Tensor> parts;
      for (auto& s : states) parts.push_back(s.x);
      x = at::cat(parts, 0);
    }
    // shift/scale/gate of attention and MLP per segment: [1 or R, H] each.
    std::vector<std::vector<at::Tensor>> mod(states.size());
    for (size_t i = 0; i < states.size(); ++i) mod[i] = block_modulation(states[i], b, H).chunk(6, 1);

    // Attention half.
    at::Tensor h = at::layer_norm(x, {H}, {}, {}, 1e-6);
    for (size_t i = 0; i < states.size(); ++i) modulate_(slice(h, i), mod[i][0], mod[i][1]);
    at::Tensor qkv = blk.qkv(h);
    at::Tensor attn = single ? at::Tensor() : at::empty({rows_total, H}, x.options());
    for (size_t i = 0; i < states.size(); ++i) {
      SegmentState& s = states[i];
      const int64_t r = s.x.size(0);
      const int64_t L = static_cast<int64_t>(s.seg->grid_h) * s.seg->grid_w;
      at::Tensor rows = slice(qkv, i);
      at::Tensor q = rows.narrow(1, 0, H), k = rows.narrow(1, H, H), v = rows.narrow(1, 2 * H, H);
      at::Tensor out;
      if (s.full || r == L) {
        // Every token is fresh: no cached rows to read.
        if (s.full && s.seg->sink != nullptr) s.seg->sink->store(b, k, v);
        out = kernels::masked_attention(q, k, v, cfg.num_heads, scale);
      } else if (const uint16_t *k_half = nullptr, *v_half = nullptr;
                 q.device().is_cpu() && s.seg->kv->fp16_slabs(b, &k_half, &v_half)) {
        out = kernels::masked_attention_over_cache(q, k_half, v_half, L, s.ids, k, v, cfg.num_heads, scale);
      } else {
        if (!s.k_buf.defined()) {
          s.k_buf = at::empty({L, H}, at::kFloat);
          s.v_buf = at::empty({L, H}, at::kFloat);
        }
        s.seg->kv->fetch(b, s.k_buf, s.v_buf);
        kernels::scatter_rows(s.k_buf, s.ids, k);
        kernels::scatter_rows(s.v_buf, s.ids, v);
        out = kernels::masked_attention(q, s.k_buf, s.v_buf, cfg.num_heads, scale);
      }
      if (single) {
        attn = out;
      } else {
        attn.narrow(0, begin[i], r).copy_(out);
      }
    }
    at::Tensor proj = blk.proj(attn);
    for (size_t i = 0; i < states.size(); ++i) slice(x, i).addcmul_(slice(proj, i), mod[i][2]);

    // MLP half.
    h = at::layer_norm(x, {H}, {}, {}, 1e-6);
    for (size_t i = 0; i < states.size(); ++i) modulate_(slice(h, i), mod[i][3], mod[i][4]);
    at::Tensor m = blk.fc2(gelu_tanh(blk.fc1(h)));
    for (size_t i = 0; i < states.size(); ++i) {
      slice(x, i).addcmul_(slice(m, i), mod[i][5]);
      states[i].x = slice(x, i);
    }
  }

  // Final layer on the carried rows.
  std::vector<at::Tensor> outs;
  for (auto& s : states) {
    if (s.seg->full_blocks == cfg.depth) reduce_rows(s);
    at::Tensor h = at::layer_norm(s.x, {H}, {}, {}, 1e-6);
    auto chunks = segment_modulation(w_->final_ada, s).chunk(2, 1);
    modulate_(h, chunks[0], chunks[1]);
    outs.push_back(w_->final_linear(h));
  }
  return outs.size() == 1 ? outs[0] : at::cat(outs, 0);
}

}  // namespace infill
