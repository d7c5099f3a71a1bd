#include "train_flux2.h"

#include <cmath>

#include "model/safetensors_torch.h"

namespace infill::train {

namespace {

constexpr double kEps = 1e-6;  // LayerNorm and QK RMSNorm, as upstream

// Upstream timestep_embedding: t * 1000, cat(cos, sin) over dim / 2 frequencies. t [B] -> [B, dim].
torch::Tensor timestep_embedding(const torch::Tensor& t, int dim) {
  const int half = dim / 2;
  torch::Tensor freqs = torch::exp(-std::log(10000.0) * torch::arange(half, torch::kFloat) / static_cast<float>(half));
  torch::Tensor args = (t.to(torch::kFloat) * 1000.0).unsqueeze(1) * freqs.unsqueeze(0);
  return torch::cat({torch::cos(args), torch::sin(args)}, 1);
}

// Upstream rope(): per axis, angles pos * theta^(-2i/d); returns cos, sin [L, head_dim / 2].
std::pair<torch::Tensor, torch::Tensor> rope(const torch::Tensor& ids, const std::vector<int>& axes, double theta) {
  std::vector<torch::Tensor> parts;
  for (size_t a = 0; a < axes.size(); ++a) {
    const int d = axes[a];
    torch::Tensor scale = torch::arange(0, d, 2, torch::kDouble) / d;
    torch::Tensor omega = 1.0 / torch::pow(theta, scale);
    parts.push_back(ids.select(1, static_cast<int64_t>(a)).to(torch::kDouble).unsqueeze(1) * omega.unsqueeze(0));
  }
  torch::Tensor angles = torch::cat(parts, 1);
  return {torch::cos(angles).to(torch::kFloat), torch::sin(angles).to(torch::kFloat)};
}

// x [B, L, heads, d]: rotates channel pairs (2i, 2i+1) by angle i.
torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const auto s = x.sizes();
  torch::Tensor pairs = x.reshape({s[0], s[1], s[2], s[3] / 2, 2});
  torch::Tensor a = pairs.select(4, 0), b = pairs.select(4, 1);
  torch::Tensor c = cos.unsqueeze(0).unsqueeze(2), n = sin.unsqueeze(0).unsqueeze(2);  // [1, L, 1, d/2]
  return torch::stack({c * a - n * b, n * a + c * b}, 4).reshape(s);
}

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& scale) {
  return x * torch::rsqrt(x.pow(2).mean(-1, true) + kEps) * scale;
}

torch::Tensor layer_norm(const torch::Tensor& x) {
  return torch::layer_norm(x, {x.size(-1)}, {}, {}, kEps);
}

// x * (1 + scale) + shift with per-sample [B, 1, H] modulation.
torch::Tensor modulate(const torch::Tensor& x, const torch::Tensor& shift, const torch::Tensor& scale) {
  return x * (1 + scale) + shift;
}

// Softmax attention, q, k, v [B, L, heads, d] -> [B, L, heads * d].
torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  torch::Tensor qh = q.transpose(1, 2), kh = k.transpose(1, 2), vh = v.transpose(1, 2);  // [B, heads, L, d]
  torch::Tensor p = torch::softmax(torch::matmul(qh, kh.transpose(2, 3)) * scale, -1);
  torch::Tensor out = torch::matmul(p, vh).transpose(1, 2);  // [B, L, heads, d]
  return out.reshape({out.size(0), out.size(1), -1});
}

torch::nn::Linear linear(int64_t in, int64_t out) { return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false)); }

// A submodule holding one parameter "scale" (upstream's RMSNorm).
torch::Tensor norm_scale(torch::nn::Module& parent, const std::string& name, int64_t dim) {
  auto m = parent.register_module(name, std::make_shared<torch::nn::Module>());
  return m->register_parameter("scale", torch::ones({dim}));
}

// Upstream's Sequential(SiLU, Linear) / Sequential(Linear, SiLU, Linear) layouts: the linear
// layers at indices 0 and 2 (or 1) of a module list.
std::shared_ptr<torch::nn::Module> sequential(torch::nn::Module& parent, const std::string& name) {
  return parent.register_module(name, std::make_shared<torch::nn::Module>());
}

}  // namespace

TrainFlux2Impl::TrainFlux2Impl(const Flux2Config& config) : cfg(config) {
  TORCH_CHECK(cfg.validate().ok(), cfg.validate().message());
  TORCH_CHECK(!cfg.guidance_embed, "training a guidance-embedded FLUX.2 transformer is not supported");
  const int64_t h = cfg.hidden_size, d = cfg.head_dim(), m = cfg.mlp_hidden;
  img_in = register_module("img_in", linear(cfg.input_channels(), h));
  txt_in = register_module("txt_in", linear(cfg.context_dim, h));
  auto time_in = sequential(*this, "time_in");
  time_in0 = time_in->register_module("in_layer", linear(cfg.time_embed_dim, h));
  time_in1 = time_in->register_module("out_layer", linear(h, h));
  mod_img = sequential(*this, "double_stream_modulation_img")->register_module("lin", linear(h, 6 * h));
  mod_txt = sequential(*this, "double_stream_modulation_txt")->register_module("lin", linear(h, 6 * h));
  mod_single = sequential(*this, "single_stream_modulation")->register_module("lin", linear(h, 3 * h));
  auto double_list = sequential(*this, "double_blocks");
  for (int i = 0; i < cfg.double_blocks; ++i) {
    auto block = sequential(*double_list, std::to_string(i));
    auto stream = [&](const std::string& name) {
      auto s = std::make_shared<StreamImpl>();
      auto attn = sequential(*block, name + "_attn");
      s->qkv = attn->register_module("qkv", linear(h, 3 * h));
      s->proj = attn->register_module("proj", linear(h, h));
      auto norm = sequential(*attn, "norm");
      s->q_scale = norm_scale(*norm, "query_norm", d);
      s->k_scale = norm_scale(*norm, "key_norm", d);
      auto mlp = sequential(*block, name + "_mlp");
      s->mlp_in = mlp->register_module("0", linear(h, 2 * m));
      s->mlp_out = mlp->register_module("2", linear(m, h));
      return s;
    };
    auto img = stream("img");
    auto txt = stream("txt");
    doubles.emplace_back(img, txt);
  }
  auto single_list = sequential(*this, "single_blocks");
  for (int i = 0; i < cfg.single_blocks; ++i) {
    auto block = sequential(*single_list, std::to_string(i));
    auto s = std::make_shared<SingleImpl>();
    s->linear1 = block->register_module("linear1", linear(h, 3 * h + 2 * m));
    s->linear2 = block->register_module("linear2", linear(h + m, h));
    auto norm = sequential(*block, "norm");
    s->q_scale = norm_scale(*norm, "query_norm", d);
    s->k_scale = norm_scale(*norm, "key_norm", d);
    singles.push_back(s);
  }
  auto final_layer = sequential(*this, "final_layer");
  final_ada = sequential(*final_layer, "adaLN_modulation")->register_module("1", linear(h, 2 * h));
  final_linear = final_layer->register_module("linear", linear(h, cfg.in_channels));
  initialise();
}

void TrainFlux2Impl::initialise() {
  torch::NoGradGuard no_grad;
  for (auto* l : {&mod_img, &mod_txt, &mod_single, &final_ada, &final_linear}) (*l)->weight.zero_();
}

torch::Tensor TrainFlux2Impl::forward(const torch::Tensor& txt, const torch::Tensor& txt_ids, const torch::Tensor& img,
                                      const torch::Tensor& img_ids, const torch::Tensor& t, int64_t predicted_rows) {
  const int64_t heads = cfg.num_heads, d = cfg.head_dim(), h = cfg.hidden_size, m = cfg.mlp_hidden;
  const int64_t B = img.size(0), T = txt.size(1), N = img.size(1);
  auto [cos, sin] = rope(torch::cat({txt_ids, img_ids}), cfg.axes_dim, cfg.theta);
  torch::Tensor vec = time_in1(torch::silu(time_in0(timestep_embedding(t, cfg.time_embed_dim))));
  torch::Tensor act = torch::silu(vec).unsqueeze(1);  // [B, 1, H]
  auto mi = mod_img(act).chunk(6, 2), mt = mod_txt(act).chunk(6, 2), ms = mod_single(act).chunk(3, 2);
  auto mf = final_ada(act).chunk(2, 2);

  torch::Tensor x_img = img_in(img), x_txt = txt_in(txt);
  auto split_heads = [&](const torch::Tensor& x) { return x.reshape({B, x.size(1), heads, d}); };
  for (auto& [si, st] : doubles) {
    torch::Tensor qkv_i = si->qkv(modulate(layer_norm(x_img), mi[0], mi[1]));
    torch::Tensor qkv_t = st->qkv(modulate(layer_norm(x_txt), mt[0], mt[1]));
    auto ci = qkv_i.chunk(3, 2), ct = qkv_t.chunk(3, 2);
    torch::Tensor q = torch::cat({rms_norm(split_heads(ct[0]), st->q_scale), rms_norm(split_heads(ci[0]), si->q_scale)}, 1);
    torch::Tensor k = torch::cat({rms_norm(split_heads(ct[1]), st->k_scale), rms_norm(split_heads(ci[1]), si->k_scale)}, 1);
    torch::Tensor v = torch::cat({split_heads(ct[2]), split_heads(ci[2])}, 1);
    torch::Tensor a = attention(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v);
    x_txt = x_txt + mt[2] * st->proj(a.narrow(1, 0, T));
    x_img = x_img + mi[2] * si->proj(a.narrow(1, T, N));
    auto mlp = [&](StreamImpl& s, const torch::Tensor& x, const std::vector<torch::Tensor>& mod) {
      torch::Tensor up = s.mlp_in(modulate(layer_norm(x), mod[3], mod[4]));
      auto gu = up.chunk(2, 2);
      return x + mod[5] * s.mlp_out(torch::silu(gu[0]) * gu[1]);
    };
    x_txt = mlp(*st, x_txt, mt);
    x_img = mlp(*si, x_img, mi);
  }
  torch::Tensor x = torch::cat({x_txt, x_img}, 1);
  for (auto& s : singles) {
    torch::Tensor y = s->linear1(modulate(layer_norm(x), ms[0], ms[1]));
    torch::Tensor q = rms_norm(split_heads(y.narrow(2, 0, h)), s->q_scale);
    torch::Tensor k = rms_norm(split_heads(y.narrow(2, h, h)), s->k_scale);
    torch::Tensor v = split_heads(y.narrow(2, 2 * h, h));
    torch::Tensor a = attention(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v);
    torch::Tensor mlp = torch::silu(y.narrow(2, 3 * h, m)) * y.narrow(2, 3 * h + m, m);
    x = x + ms[2] * s->linear2(torch::cat({a, mlp}, 2));
  }
  torch::Tensor out = modulate(layer_norm(x.narrow(1, T, predicted_rows)), mf[0], mf[1]);
  return final_linear(out);
}

Status export_flux2(const TrainFlux2& model, const std::string& path) {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& item : model->named_parameters()) {
    tensors.emplace_back(item.key(), item.value().detach().to(torch::kHalf).contiguous());
  }
  return write_safetensors(path, tensors, {{"format", "pt"}});
}

}  // namespace infill::train
