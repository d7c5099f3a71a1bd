// The DiT against an independent plain-libtorch implementation of the reference maths
// (written from the checkpoint's tensors, batch-style as in the public DiT code), and the
// mask-aware forward against the full forward.

#include "support/catch.h"
#include <cmath>
#include <map>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "model/dit.h"
#include "model/safetensors.h"
#include "model/safetensors_torch.h"
#include "support/temp_dir.h"

using namespace infill;

namespace {

DitConfig small_config() {
  DitConfig cfg;
  cfg.weights = "dit.safetensors";
  cfg.hidden_size = 64;
  cfg.depth = 3;
  cfg.num_heads = 4;
  cfg.patch_size = 2;
  cfg.latent_channels = 4;
  cfg.inputs = {DitInput::kNoisyLatent, DitInput::kMaskedLatent, DitInput::kMask};
  cfg.conditioning = ConditioningType::kVector;
  cfg.conditioning_dim = 8;
  return cfg;
}

// Plain libtorch DiT forward on a whole image, from the checkpoint's named tensors.
struct ReferenceDit {
  std::map<std::string, at::Tensor> w;
  DitConfig cfg;

  ReferenceDit(const std::string& path, const DitConfig& c) : cfg(c) {
    auto file = SafetensorsFile::open(path);
    REQUIRE(file.ok());
    for (const auto& info : file->tensors()) w[info.name] = load_float_tensor(*file, info.name).value();
  }
  at::Tensor lin(const at::Tensor& x, const std::string& name) { return at::linear(x, w[name + ".weight"], w[name + ".bias"]); }

  // input [C_in, h, w] -> output [C_out, h, w]; per-token prompted flags [T] (true = prompt)
  at::Tensor forward(const at::Tensor& input, double t, const at::Tensor& prompt, const at::Tensor& prompted) {
    const int64_t H = cfg.hidden_size, p = cfg.patch_size, heads = cfg.num_heads, d = H / heads;
    const int64_t gh = input.size(1) / p, gw = input.size(2) / p, T = gh * gw;
    at::Tensor x = at::conv2d(input.unsqueeze(0), w["x_embedder.proj.weight"], w["x_embedder.proj.bias"], p);
    x = x.flatten(2).transpose(1, 2)[0];  // [T, H]
    // Positions computed independently with the numpy recipe of the reference code.
    at::Tensor pos = at::empty({T, H});
    for (int64_t i = 0; i < gh; ++i)
      for (int64_t j = 0; j < gw; ++j)
        for (int64_t k = 0; k < H / 4; ++k) {
          const double omega = 1.0 / std::pow(10000.0, double(k) / (H / 4));
          pos[i * gw + j][k] = std::sin(j * omega);
          pos[i * gw + j][k + H / 4] = std::cos(j * omega);
          pos[i * gw + j][k + H / 2] = std::sin(i * omega);
          pos[i * gw + j][k + 3 * H / 4] = std::cos(i * omega);
        }
    x = x + pos;
    const int half = cfg.frequency_embedding_size / 2;
    at::Tensor freqs = at::exp(-std::log(10000.0) * at::arange(half, at::kFloat) / half) * t;
    at::Tensor temb = lin(at::silu(lin(at::cat({at::cos(freqs), at::sin(freqs)}), "t_embedder.mlp.0")), "t_embedder.mlp.2");
    at::Tensor c_prompt = temb + lin(at::silu(lin(prompt, "y_embedder.mlp.0")), "y_embedder.mlp.2");
    at::Tensor c_null = temb + lin(at::silu(lin(at::zeros_like(prompt), "y_embedder.mlp.0")), "y_embedder.mlp.2");
    at::Tensor c = at::where(prompted.unsqueeze(1), c_prompt.unsqueeze(0), c_null.unsqueeze(0));  // [T, H]
    auto modulate = [](const at::Tensor& v, const at::Tensor& shift, const at::Tensor& scale) { return v * (1 + scale) + shift; };
    for (int b = 0; b < cfg.depth; ++b) {
      const std::string n = "blocks." + std::to_string(b);
      auto m = lin(at::silu(c), n + ".adaLN_modulation.1").chunk(6, 1);
      at::Tensor h = modulate(at::layer_norm(x, {H}, {}, {}, 1e-6), m[0], m[1]);
      at::Tensor qkv = lin(h, n + ".attn.qkv").reshape({T, 3, heads, d}).permute({1, 2, 0, 3});
      at::Tensor a = at::softmax(at::matmul(qkv[0], qkv[1].transpose(-2, -1)) / std::sqrt(double(d)), -1);
      at::Tensor o = at::matmul(a, qkv[2]).permute({1, 0, 2}).reshape({T, H});
      x = x + m[2] * lin(o, n + ".attn.proj");
      h = modulate(at::layer_norm(x, {H}, {}, {}, 1e-6), m[3], m[4]);
      x = x + m[5] * lin(at::gelu(lin(h, n + ".mlp.fc1"), "tanh"), n + ".mlp.fc2");
    }
    auto f = lin(at::silu(c), "final_layer.adaLN_modulation.1").chunk(2, 1);
    at::Tensor out = lin(modulate(at::layer_norm(x, {H}, {}, {}, 1e-6), f[0], f[1]), "final_layer.linear");
    // unpatchify: [T, p*p*C] (p, q, c) -> [C, h, w]
    const int64_t C = cfg.out_channels();
    return out.reshape({gh, gw, p, p, C}).permute({4, 0, 2, 1, 3}).reshape({C, gh * p, gw * p});
  }
};

struct Fixture {
  c10::InferenceMode guard;
  test::TempDir dir{"infill-dit"};
  DitConfig cfg = small_config();
  Dit dit = Dit::random(cfg, 3);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(11);
  at::Tensor input = at::randn({cfg.in_channels(), 16, 12}, gen);  // grid 8 x 6, not square
  at::Tensor prompt = at::randn({cfg.conditioning_dim}, gen);
  int gh = 8, gw = 6;
  int64_t T = 48;
};

class CaptureKv : public KvSink, public KvSource {
 public:
  std::map<int, std::pair<at::Tensor, at::Tensor>> kv;
  void store(int block, const at::Tensor& k, const at::Tensor& v) override { kv[block] = {k.clone(), v.clone()}; }
  void fetch(int block, at::Tensor& k, at::Tensor& v) override {
    k.copy_(kv.at(block).first);
    v.copy_(kv.at(block).second);
  }
};

// The cache as the activation store holds it: fp16 slabs. Offers them to the attention
// directly unless `expose_slabs` is false, in which case the DiT takes the float-copy path.
class HalfKv : public KvSink, public KvSource {
 public:
  bool expose_slabs = true;
  std::map<int, std::pair<at::Tensor, at::Tensor>> kv;
  void store(int block, const at::Tensor& k, const at::Tensor& v) override {
    kv[block] = {k.to(at::kHalf).contiguous(), v.to(at::kHalf).contiguous()};
  }
  void fetch(int block, at::Tensor& k, at::Tensor& v) override {
    k.copy_(kv.at(block).first);
    v.copy_(kv.at(block).second);
  }
  bool fp16_slabs(int block, const uint16_t** k, const uint16_t** v) override {
    if (!expose_slabs) return false;
    *k = reinterpret_cast<const uint16_t*>(kv.at(block).first.data_ptr<at::Half>());
    *v = reinterpret_cast<const uint16_t*>(kv.at(block).second.data_ptr<at::Half>());
    return true;
  }
};

}  // namespace

TEST_CASE("full DiT forward equals a plain-libtorch reference of the DiT maths", "[model][dit]") {
  Fixture f;
  REQUIRE(f.dit.save(f.dir.file("dit.safetensors"), /*fp16=*/false).ok());
  ReferenceDit ref(f.dir.file("dit.safetensors"), f.cfg);
  at::Tensor prompted = at::rand({f.T}, f.gen) > 0.5;
  const double t = 437.0;

  DitSegment seg;
  seg.tokens = f.dit.patchify(f.input);
  seg.token_ids = at::arange(f.T, at::kLong);
  seg.grid_h = f.gh;
  seg.grid_w = f.gw;
  seg.cond = f.dit.conditioning(t, f.prompt);
  seg.null_cond = f.dit.conditioning(t, at::Tensor());
  seg.prompted = prompted;
  seg.full_blocks = f.cfg.depth;
  DitSegment segs[] = {seg};
  at::Tensor rows = f.dit.forward(segs);
  at::Tensor ours = at::zeros({f.cfg.latent_channels, 16, 12});
  f.dit.unpatchify_into(ours, rows, seg.token_ids);

  at::Tensor expected = ref.forward(f.input, t, f.prompt, prompted);
  const double err = (ours - expected).abs().max().item<double>();
  INFO("max abs error " << err << ", output scale " << expected.abs().max().item<double>());
  CHECK(err < 1e-4);
}

TEST_CASE("mask-aware forward with the cache of the same input equals the full forward on masked rows",
          "[model][dit]") {
  Fixture f;
  const double t = 250.0;
  CaptureKv cache;
  DitSegment full;
  full.tokens = f.dit.patchify(f.input);
  full.token_ids = at::arange(f.T, at::kLong);
  full.grid_h = f.gh;
  full.grid_w = f.gw;
  full.cond = full.null_cond = f.dit.conditioning(t, f.prompt);
  full.full_blocks = f.cfg.depth;
  full.sink = &cache;
  DitSegment full_segs[] = {full};
  at::Tensor full_rows = f.dit.forward(full_segs);
  REQUIRE(cache.kv.size() == static_cast<size_t>(f.cfg.depth));

  for (int64_t m : {int64_t{1}, int64_t{7}, f.T - 1, f.T}) {
    at::Tensor ids = std::get<0>(at::sort(at::randperm(f.T, f.gen).narrow(0, 0, m)));
    DitSegment masked;
    masked.tokens = full.tokens.index_select(0, ids);
    masked.token_ids = ids;
    masked.grid_h = f.gh;
    masked.grid_w = f.gw;
    masked.cond = masked.null_cond = full.cond;
    masked.kv = &cache;
    DitSegment segs[] = {masked};
    at::Tensor rows = f.dit.forward(segs);
    const double err = (rows - full_rows.index_select(0, ids)).abs().max().item<double>();
    INFO("masked tokens " << m << ", max abs error " << err);
    CHECK(err < 1e-4);
  }
}

TEST_CASE("mask-aware forward reading fp16 slabs directly equals reading float copies of them", "[model][dit]") {
  Fixture f;
  const double t = 610.0;
  HalfKv cache;
  DitSegment full;
  full.tokens = f.dit.patchify(f.input);
  full.token_ids = at::arange(f.T, at::kLong);
  full.grid_h = f.gh;
  full.grid_w = f.gw;
  full.cond = full.null_cond = f.dit.conditioning(t, at::Tensor());
  full.full_blocks = f.cfg.depth;
  full.sink = &cache;
  DitSegment full_segs[] = {full};
  f.dit.forward(full_segs);

  for (int64_t m : {int64_t{1}, int64_t{7}, int64_t{12}, f.T - 1}) {
    at::Tensor ids = std::get<0>(at::sort(at::randperm(f.T, f.gen).narrow(0, 0, m)));
    DitSegment masked;
    masked.tokens = at::randn({m, full.tokens.size(1)}, f.gen);  // an edit: new content on the masked rows
    masked.token_ids = ids;
    masked.grid_h = f.gh;
    masked.grid_w = f.gw;
    masked.cond = f.dit.conditioning(t, f.prompt);
    masked.null_cond = full.null_cond;
    masked.kv = &cache;
    DitSegment segs[] = {masked};
    cache.expose_slabs = true;
    const at::Tensor direct = f.dit.forward(segs);
    cache.expose_slabs = false;
    const at::Tensor copied = f.dit.forward(segs);
    const double err = (direct - copied).abs().max().item<double>();
    INFO("masked tokens " << m << ", max abs difference " << err);
    CHECK(err < 1e-5);
  }
}

TEST_CASE("one packed forward over several requests equals each request run alone", "[model][dit]") {
  Fixture f;
  CaptureKv cache_a, cache_b;
  at::Tensor input_b = at::randn_like(f.input);
  auto full_segment = [&](const at::Tensor& input, double t, CaptureKv& sink) {
    DitSegment s;
    s.tokens = f.dit.patchify(input);
    s.token_ids = at::arange(f.T, at::kLong);
    s.grid_h = f.gh;
    s.grid_w = f.gw;
    s.cond = s.null_cond = f.dit.conditioning(t, at::Tensor());
    s.full_blocks = f.cfg.depth;
    s.sink = &sink;
    return s;
  };
  DitSegment prep[] = {full_segment(f.input, 900.0, cache_a), full_segment(input_b, 100.0, cache_b)};
  f.dit.forward(prep);  // batched prepare of two templates at different timesteps

  auto masked_segment = [&](const at::Tensor& input, double t, const at::Tensor& prompt, CaptureKv& kv, int64_t m) {
    DitSegment s;
    at::Tensor ids = at::arange(m, at::kLong) * 2;
    s.tokens = f.dit.patchify(input).index_select(0, ids);
    s.token_ids = ids;
    s.grid_h = f.gh;
    s.grid_w = f.gw;
    s.cond = f.dit.conditioning(t, prompt);
    s.null_cond = f.dit.conditioning(t, at::Tensor());
    s.kv = &kv;
    return s;
  };
  DitSegment a = masked_segment(f.input, 900.0, f.prompt, cache_a, 5);
  DitSegment b = masked_segment(input_b, 100.0, at::Tensor(), cache_b, 11);
  DitSegment both[] = {a, b};
  at::Tensor packed = f.dit.forward(both);
  DitSegment only_a[] = {a};
  DitSegment only_b[] = {b};
  at::Tensor alone = at::cat({f.dit.forward(only_a), f.dit.forward(only_b)});
  REQUIRE(packed.sizes() == alone.sizes());
  CHECK((packed - alone).abs().max().item<double>() < 1e-5);
}

TEST_CASE("DiT weights load by checkpoint names and report what is missing or mis-shaped", "[model][dit]") {
  Fixture f;
  const std::string path = f.dir.file("dit.safetensors");
  REQUIRE(f.dit.save(path, /*fp16=*/false).ok());
  auto loaded = Dit::load(f.cfg, path);
  REQUIRE(loaded.ok());
  DitSegment seg;
  seg.tokens = f.dit.patchify(f.input);
  seg.token_ids = at::arange(f.T, at::kLong);
  seg.grid_h = f.gh;
  seg.grid_w = f.gw;
  seg.cond = seg.null_cond = f.dit.conditioning(3.0, f.prompt);
  seg.full_blocks = f.cfg.depth;
  DitSegment segs[] = {seg};
  at::Tensor a = f.dit.forward(segs);
  seg.cond = seg.null_cond = loaded->conditioning(3.0, f.prompt);
  DitSegment segs2[] = {seg};
  CHECK(at::equal(a, loaded->forward(segs2)));

  SECTION("a deeper config names the first missing block weight") {
    DitConfig deeper = f.cfg;
    deeper.depth = 4;
    auto r = Dit::load(deeper, path);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == ErrorCode::kNotFound);
    CHECK_THAT(r.status().message(), Catch::Contains("blocks.3.attn.qkv.weight"));
  }
  SECTION("a wider config reports the shape") {
    DitConfig wider = f.cfg;
    wider.hidden_size = 128;
    auto r = Dit::load(wider, path);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(), Catch::Contains("x_embedder.proj.weight"));
  }
  SECTION("a key prefix is honoured") {
    DitConfig prefixed = f.cfg;
    prefixed.key_prefix = "model.";
    REQUIRE(f.dit.save(f.dir.file("plain.safetensors"), true).ok());
    auto r = Dit::load(prefixed, f.dir.file("plain.safetensors"));
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(), Catch::Contains("model.x_embedder.proj.weight"));
  }
}

TEST_CASE("class-conditioned DiT checkpoints (the public DiT layout) load by configuration", "[model][dit]") {
  c10::InferenceMode guard;
  test::TempDir dir("infill-dit-class");
  DitConfig cfg;
  cfg.weights = "dit.safetensors";
  cfg.hidden_size = 32;
  cfg.depth = 2;
  cfg.num_heads = 2;
  cfg.patch_size = 2;
  cfg.latent_channels = 4;
  cfg.learn_sigma = true;
  cfg.conditioning = ConditioningType::kClass;
  cfg.num_classes = 10;
  cfg.prediction = PredictionType::kEpsilon;
  Dit dit = Dit::random(cfg, 5);
  REQUIRE(dit.save(dir.file("dit.safetensors"), true).ok());
  auto file = SafetensorsFile::open(dir.file("dit.safetensors"));
  REQUIRE(file.ok());
  const TensorInfo* table = file->find("y_embedder.embedding_table.weight");
  REQUIRE(table != nullptr);
  CHECK(table->shape == std::vector<int64_t>({11, 32}));  // 10 classes + the null class
  const TensorInfo* final_linear = file->find("final_layer.linear.weight");
  REQUIRE(final_linear != nullptr);
  CHECK(final_linear->shape == std::vector<int64_t>({2 * 2 * 8, 32}));  // learn_sigma doubles channels
  REQUIRE(Dit::load(cfg, dir.file("dit.safetensors")).ok());
  CHECK_FALSE(at::equal(dit.conditioning(10, at::scalar_tensor(3, at::kLong)), dit.conditioning(10, at::Tensor())));
}
