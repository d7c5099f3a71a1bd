#include "train_dit.h"

#include <cmath>

#include "model/dit.h"
#include "model/safetensors_torch.h"

namespace infill::train {

namespace {

torch::Tensor timestep_embedding(const torch::Tensor& t, int dim) {
  // As timestep_features in engine/model/dit.cpp, batched: cat(cos, sin) of t * freqs.
  const int half = dim / 2;
  torch::Tensor freqs = torch::exp(-std::log(10000.0) * torch::arange(half, torch::kFloat) / static_cast<float>(half));
  torch::Tensor args = t.to(torch::kFloat).unsqueeze(1) * freqs.unsqueeze(0);
  return torch::cat({torch::cos(args), torch::sin(args)}, 1);
}

torch::Tensor gelu_tanh(const torch::Tensor& x) {
  return 0.5 * x * (1.0 + torch::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x.pow(3))));
}

// Per-token modulation: rows where `prompted` use the prompt's parameters, the rest the null
// prompt's. with/without [B, n], prompted [B, L] -> [B, L, n].
torch::Tensor per_token(const torch::Tensor& with, const torch::Tensor& without, const torch::Tensor& prompted) {
  return torch::where(prompted.unsqueeze(2), with.unsqueeze(1), without.unsqueeze(1));
}

}  // namespace

TrainDitImpl::BlockImpl::BlockImpl(int hidden, int mlp_hidden) {
  // Submodule names are the checkpoint's: attn.qkv, attn.proj, mlp.fc1, mlp.fc2, adaLN_modulation.1.
  auto attn = register_module("attn", std::make_shared<torch::nn::Module>());
  qkv = attn->register_module("qkv", torch::nn::Linear(hidden, 3 * hidden));
  proj = attn->register_module("proj", torch::nn::Linear(hidden, hidden));
  auto mlp = register_module("mlp", std::make_shared<torch::nn::Module>());
  fc1 = mlp->register_module("fc1", torch::nn::Linear(hidden, mlp_hidden));
  fc2 = mlp->register_module("fc2", torch::nn::Linear(mlp_hidden, hidden));
  auto ada_seq = register_module("adaLN_modulation", std::make_shared<torch::nn::Module>());
  ada = ada_seq->register_module("1", torch::nn::Linear(hidden, 6 * hidden));
}

TrainDitImpl::TrainDitImpl(const DitConfig& config) : cfg(config) {
  const int h = cfg.hidden_size, p = cfg.patch_size;
  auto x_emb = register_module("x_embedder", std::make_shared<torch::nn::Module>());
  x_proj = x_emb->register_module("proj", torch::nn::Conv2d(torch::nn::Conv2dOptions(cfg.in_channels(), h, p).stride(p)));
  auto t_emb = register_module("t_embedder", std::make_shared<torch::nn::Module>());
  auto t_mlp = t_emb->register_module("mlp", std::make_shared<torch::nn::Module>());
  t_mlp0 = t_mlp->register_module("0", torch::nn::Linear(cfg.frequency_embedding_size, h));
  t_mlp2 = t_mlp->register_module("2", torch::nn::Linear(h, h));
  auto y_emb = register_module("y_embedder", std::make_shared<torch::nn::Module>());
  auto y_mlp = y_emb->register_module("mlp", std::make_shared<torch::nn::Module>());
  y_mlp0 = y_mlp->register_module("0", torch::nn::Linear(cfg.conditioning_dim, h));
  y_mlp2 = y_mlp->register_module("2", torch::nn::Linear(h, h));
  auto list = register_module("blocks", std::make_shared<torch::nn::Module>());
  for (int i = 0; i < cfg.depth; ++i) {
    blocks.push_back(list->register_module(std::to_string(i), std::make_shared<BlockImpl>(h, cfg.mlp_hidden())));
  }
  auto fin = register_module("final_layer", std::make_shared<torch::nn::Module>());
  auto fin_ada = fin->register_module("adaLN_modulation", std::make_shared<torch::nn::Module>());
  final_ada = fin_ada->register_module("1", torch::nn::Linear(h, 2 * h));
  final_linear = fin->register_module("linear", torch::nn::Linear(h, p * p * cfg.out_channels()));
  initialise();
}

void TrainDitImpl::initialise() {
  torch::NoGradGuard no_grad;
  for (auto& module : modules(/*include_self=*/false)) {
    if (auto* lin = module->as<torch::nn::Linear>()) {
      torch::nn::init::xavier_uniform_(lin->weight);
      torch::nn::init::zeros_(lin->bias);
    }
  }
  // Patch embedding like a linear layer (xavier over the flattened kernel).
  torch::nn::init::xavier_uniform_(x_proj->weight.view({x_proj->weight.size(0), -1}));
  torch::nn::init::zeros_(x_proj->bias);
  torch::nn::init::normal_(t_mlp0->weight, 0.0, 0.02);
  torch::nn::init::normal_(t_mlp2->weight, 0.0, 0.02);
  torch::nn::init::normal_(y_mlp0->weight, 0.0, 0.02);
  torch::nn::init::normal_(y_mlp2->weight, 0.0, 0.02);
  for (auto& b : blocks) {
    torch::nn::init::zeros_(b->ada->weight);
    torch::nn::init::zeros_(b->ada->bias);
  }
  torch::nn::init::zeros_(final_ada->weight);
  torch::nn::init::zeros_(final_ada->bias);
  torch::nn::init::zeros_(final_linear->weight);
  torch::nn::init::zeros_(final_linear->bias);
}

torch::Tensor TrainDitImpl::forward(const torch::Tensor& x, const torch::Tensor& t, const torch::Tensor& y,
                                    const torch::Tensor& prompted) {
  const int64_t B = x.size(0), H = cfg.hidden_size, p = cfg.patch_size, heads = cfg.num_heads;
  const int64_t gh = x.size(2) / p, gw = x.size(3) / p, L = gh * gw, d = H / heads;
  if (!positions.defined() || positions.size(0) != L) {
    positions = sincos_position_embedding(static_cast<int>(H), static_cast<int>(gh), static_cast<int>(gw)).clone();
  }
  torch::Tensor h = x_proj->forward(x).flatten(2).transpose(1, 2) + positions.unsqueeze(0);  // [B, L, H]
  torch::Tensor te = t_mlp2->forward(torch::silu(t_mlp0->forward(timestep_embedding(t, cfg.frequency_embedding_size))));
  torch::Tensor c_prompt = te + y_mlp2->forward(torch::silu(y_mlp0->forward(y)));
  torch::Tensor c_null = te + y_mlp2->forward(torch::silu(y_mlp0->forward(torch::zeros_like(y))));
  torch::Tensor sp = torch::silu(c_prompt), sn = torch::silu(c_null);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  for (auto& blk : blocks) {
    auto mod = per_token(blk->ada->forward(sp), blk->ada->forward(sn), prompted).chunk(6, 2);
    torch::Tensor a = torch::layer_norm(h, {H}, {}, {}, 1e-6) * (1 + mod[1]) + mod[0];
    torch::Tensor qkv = blk->qkv->forward(a).view({B, L, 3, heads, d}).permute({2, 0, 3, 1, 4});  // [3, B, heads, L, d]
    torch::Tensor att = torch::softmax(torch::matmul(qkv[0], qkv[1].transpose(-2, -1)) * scale, -1);
    torch::Tensor o = torch::matmul(att, qkv[2]).transpose(1, 2).reshape({B, L, H});
    h = h + mod[2] * blk->proj->forward(o);
    torch::Tensor m = torch::layer_norm(h, {H}, {}, {}, 1e-6) * (1 + mod[4]) + mod[3];
    h = h + mod[5] * blk->fc2->forward(gelu_tanh(blk->fc1->forward(m)));
  }
  auto fmod = per_token(final_ada->forward(sp), final_ada->forward(sn), prompted).chunk(2, 2);
  torch::Tensor out = final_linear->forward(torch::layer_norm(h, {H}, {}, {}, 1e-6) * (1 + fmod[1]) + fmod[0]);
  // [B, L, p*p*C] in (py, px, c) order -> [B, C, h, w]
  const int64_t C = cfg.out_channels();
  out = out.view({B, gh, gw, p, p, C}).permute({0, 5, 1, 3, 2, 4}).reshape({B, C, gh * p, gw * p});
  return cfg.learn_sigma ? out.narrow(1, 0, cfg.latent_channels) : out;
}

Status export_dit(const TrainDit& model, const std::string& path) {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& item : model->named_parameters()) {
    tensors.emplace_back(item.key(), item.value().detach().to(torch::kHalf).contiguous());
  }
  return write_safetensors(path, tensors, {{"format", "pt"}});
}

}  // namespace infill::train
