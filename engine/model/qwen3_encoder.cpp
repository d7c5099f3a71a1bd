#include "model/qwen3_encoder.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "model/float8_checkpoint.h"
#include "model/safetensors.h"
#include "model/safetensors_shards.h"
#include "model/safetensors_torch.h"
#include "model/stored_linear.h"

namespace infill {

namespace fs = std::filesystem;

Status Qwen3Config::validate() const {
  const auto positive = [](const char* name, int v) -> Status {
    if (v > 0) return {};
    return invalid_argument(std::string("qwen3 config: ") + name + " is " + std::to_string(v) + " (expected > 0)");
  };
  INFILL_RETURN_IF_ERROR(positive("vocab_size", vocab_size));
  INFILL_RETURN_IF_ERROR(positive("hidden_size", hidden_size));
  INFILL_RETURN_IF_ERROR(positive("num_hidden_layers", num_layers));
  INFILL_RETURN_IF_ERROR(positive("num_attention_heads", num_heads));
  INFILL_RETURN_IF_ERROR(positive("num_key_value_heads", num_kv_heads));
  INFILL_RETURN_IF_ERROR(positive("head_dim", head_dim));
  INFILL_RETURN_IF_ERROR(positive("intermediate_size", intermediate_size));
  if (num_heads % num_kv_heads != 0) {
    return invalid_argument("qwen3 config: num_attention_heads " + std::to_string(num_heads) +
                            " is not a multiple of num_key_value_heads " + std::to_string(num_kv_heads));
  }
  if (head_dim % 2 != 0) return invalid_argument("qwen3 config: head_dim " + std::to_string(head_dim) + " is odd (RoPE needs pairs)");
  if (!(rope_theta > 0) || !(rms_norm_eps > 0)) return invalid_argument("qwen3 config: rope_theta and rms_norm_eps must be > 0");
  return {};
}

std::string Qwen3Config::family_size() const {
  const bool common = vocab_size == 151936 && num_layers == 36 && num_heads == 32 && num_kv_heads == 8 && head_dim == 128;
  if (common && hidden_size == 2560 && intermediate_size == 9728) return "qwen3-4b";
  if (common && hidden_size == 4096 && intermediate_size == 12288) return "qwen3-8b";
  return "custom";
}

Result<Qwen3Config> read_qwen3_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) return not_found(path + " is missing (expected the text encoder's config.json)");
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    return corrupt_data(path + " is not valid JSON: " + e.what());
  }
  const std::string type = doc.value("model_type", "");
  if (type != "qwen3") {
    return invalid_argument(path + ": model_type is \"" + type + "\" (expected \"qwen3\", the FLUX.2 [klein] text encoder)");
  }
  Qwen3Config c;
  const auto get_int = [&](const char* field, int& out) -> Status {
    if (!doc.contains(field) || !doc[field].is_number_integer()) {
      return invalid_argument(path + ": \"" + field + "\" is missing or not an integer");
    }
    out = doc[field].get<int>();
    return {};
  };
  INFILL_RETURN_IF_ERROR(get_int("vocab_size", c.vocab_size));
  INFILL_RETURN_IF_ERROR(get_int("hidden_size", c.hidden_size));
  INFILL_RETURN_IF_ERROR(get_int("num_hidden_layers", c.num_layers));
  INFILL_RETURN_IF_ERROR(get_int("num_attention_heads", c.num_heads));
  INFILL_RETURN_IF_ERROR(get_int("intermediate_size", c.intermediate_size));
  c.num_kv_heads = doc.value("num_key_value_heads", c.num_heads);
  c.head_dim = doc.contains("head_dim") && doc["head_dim"].is_number_integer() ? doc["head_dim"].get<int>()
                                                                                : c.hidden_size / c.num_heads;
  c.rope_theta = doc.value("rope_theta", 10000.0);
  c.rms_norm_eps = doc.value("rms_norm_eps", 1e-6);
  if (doc.contains("rope_scaling") && !doc["rope_scaling"].is_null()) {
    return invalid_argument(path + ": rope_scaling " + doc["rope_scaling"].dump() + " is not supported (expected null)");
  }
  if (doc.value("attention_bias", false)) return invalid_argument(path + ": attention_bias true is not supported (expected false)");
  if (doc.value("use_sliding_window", false)) {
    return invalid_argument(path + ": use_sliding_window true is not supported (expected false)");
  }
  const std::string act = doc.value("hidden_act", "silu");
  if (act != "silu") return invalid_argument(path + ": hidden_act \"" + act + "\" is not supported (expected \"silu\")");
  Status valid = c.validate();
  if (!valid.ok()) return invalid_argument(path + ": " + valid.message());
  return c;
}

// ---------------------------------------------------------------------------------------------

struct Qwen3Encoder::Weights {
  struct Layer {
    at::Tensor input_norm, post_norm;       // [hidden], float32
    at::Tensor q_norm, k_norm;              // [head_dim], float32
    at::Tensor q, k, v, o;                  // stored dtype
    at::Tensor gate, up, down;              // stored dtype
  };
  Qwen3Config cfg;
  at::Tensor embed;  // [vocab, hidden], stored dtype
  std::vector<Layer> layers;
  at::Tensor final_norm;  // [hidden]; unused by encode, kept so a saved model is complete

  struct Slot {
    std::string name;
    std::vector<int64_t> shape;
    at::Tensor* tensor;
    bool norm;
  };
  std::vector<Slot> slots() {
    const int64_t H = cfg.hidden_size, D = cfg.head_dim, I = cfg.intermediate_size;
    const int64_t QD = static_cast<int64_t>(cfg.num_heads) * D, KD = static_cast<int64_t>(cfg.num_kv_heads) * D;
    std::vector<Slot> out;
    out.push_back({"model.embed_tokens.weight", {cfg.vocab_size, H}, &embed, false});
    layers.resize(static_cast<size_t>(cfg.num_layers));
    for (int i = 0; i < cfg.num_layers; ++i) {
      Layer& l = layers[static_cast<size_t>(i)];
      const std::string p = "model.layers." + std::to_string(i) + ".";
      out.push_back({p + "input_layernorm.weight", {H}, &l.input_norm, true});
      out.push_back({p + "self_attn.q_proj.weight", {QD, H}, &l.q, false});
      out.push_back({p + "self_attn.k_proj.weight", {KD, H}, &l.k, false});
      out.push_back({p + "self_attn.v_proj.weight", {KD, H}, &l.v, false});
      out.push_back({p + "self_attn.o_proj.weight", {H, QD}, &l.o, false});
      out.push_back({p + "self_attn.q_norm.weight", {D}, &l.q_norm, true});
      out.push_back({p + "self_attn.k_norm.weight", {D}, &l.k_norm, true});
      out.push_back({p + "post_attention_layernorm.weight", {H}, &l.post_norm, true});
      out.push_back({p + "mlp.gate_proj.weight", {I, H}, &l.gate, false});
      out.push_back({p + "mlp.up_proj.weight", {I, H}, &l.up, false});
      out.push_back({p + "mlp.down_proj.weight", {H, I}, &l.down, false});
    }
    out.push_back({"model.norm.weight", {H}, &final_norm, true});
    return out;
  }
};

Qwen3Encoder::Qwen3Encoder(std::unique_ptr<Weights> weights) : w_(std::move(weights)) {}
Qwen3Encoder::~Qwen3Encoder() = default;

const Qwen3Config& Qwen3Encoder::config() const { return w_->cfg; }

int64_t Qwen3Encoder::weight_bytes() const {
  int64_t bytes = 0;
  for (auto& slot : w_->slots()) bytes += static_cast<int64_t>(slot.tensor->nbytes());
  return bytes;
}

at::Device Qwen3Encoder::device() const { return w_->embed.device(); }

Result<std::shared_ptr<const Qwen3Encoder>> Qwen3Encoder::on_device(const ComputeDevice& target,
                                                                    at::ScalarType dtype) const {
  if (!target.cuda) return invalid_argument(target.name() + ": the Qwen3 encoder moves to CUDA devices only");
  INFILL_RETURN_IF_ERROR(check_compute_device(target));
  auto w = std::make_unique<Weights>();
  w->cfg = w_->cfg;
  auto from = w_->slots();
  auto to = w->slots();
  try {
    c10::InferenceMode guard;
    for (size_t i = 0; i < from.size(); ++i) {
      *to[i].tensor = from[i].tensor->to(target.torch_device(), from[i].norm ? at::kFloat : dtype);
    }
  } catch (const c10::Error& e) {
    return Status(ErrorCode::kResourceExhausted, "Qwen3 encoder to " + target.name() + " (" +
                                                     std::to_string(weight_bytes()) + " bytes of weights): " +
                                                     e.what_without_backtrace());
  }
  return std::shared_ptr<const Qwen3Encoder>(new Qwen3Encoder(std::move(w)));
}

Result<std::shared_ptr<const Qwen3Encoder>> Qwen3Encoder::load(const std::string& dir) {
  INFILL_ASSIGN_OR_RETURN(Qwen3Config cfg, read_qwen3_config((fs::path(dir) / "config.json").string()));
  INFILL_ASSIGN_OR_RETURN(std::vector<std::string> paths, safetensors_shards(dir, "model"));
  std::vector<SafetensorsFile> files;
  std::map<std::string, size_t> owner;  // tensor name -> index into files
  for (const std::string& path : paths) {
    INFILL_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(path));
    for (const TensorInfo& t : file.tensors()) owner.emplace(t.name, files.size());
    files.push_back(std::move(file));
  }
  // FP8 files (ComfyUI's qwen_3_4b_fp8_mixed, say) are read dequantized to bf16.
  INFILL_ASSIGN_OR_RETURN(const Float8Layout float8, read_float8_layout(files));
  // Qwen3ForCausalLM names its decoder "model."; a bare Qwen3Model has no prefix.
  const bool bare = !owner.count("model.embed_tokens.weight") && owner.count("embed_tokens.weight");
  auto w = std::make_unique<Weights>();
  w->cfg = cfg;
  c10::InferenceMode guard;
  for (auto& slot : w->slots()) {
    const std::string stored = bare ? slot.name.substr(std::string("model.").size()) : slot.name;
    const auto it = owner.find(stored);
    if (it == owner.end()) {
      return not_found(dir + ": tensor " + stored + " is missing from the text encoder's weights (expected " +
                       std::to_string(cfg.num_layers) + " Qwen3 layers as config.json says)");
    }
    INFILL_ASSIGN_OR_RETURN(at::Tensor t, load_weight_tensor(files, it->second, stored, slot.shape, float8));
    *slot.tensor = slot.norm ? t.to(at::kFloat) : t;
  }
  return std::shared_ptr<const Qwen3Encoder>(new Qwen3Encoder(std::move(w)));
}

std::shared_ptr<const Qwen3Encoder> Qwen3Encoder::random(const Qwen3Config& config, uint64_t seed, at::ScalarType dtype) {
  TORCH_CHECK(config.validate().ok(), config.validate().message());
  auto w = std::make_unique<Weights>();
  w->cfg = config;
  c10::InferenceMode guard;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (auto& slot : w->slots()) {
    // One tensor at a time in float32, so the peak is the largest tensor, not the model.
    at::Tensor t = at::empty(slot.shape, at::kFloat).normal_(slot.norm ? 1.0 : 0.0, slot.norm ? 0.1 : 0.02, gen);
    // Norm scales are held in float32 but rounded to `dtype`, as a saved and loaded model holds them.
    *slot.tensor = slot.norm ? t.to(dtype).to(at::kFloat) : t.to(dtype);
  }
  return std::shared_ptr<const Qwen3Encoder>(new Qwen3Encoder(std::move(w)));
}

Status Qwen3Encoder::save(const std::string& dir, int shards) const {
  if (shards < 1) return invalid_argument("qwen3 save: shards must be >= 1");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return io_error("cannot create " + dir + ": " + ec.message());
  const Qwen3Config& c = w_->cfg;
  const at::ScalarType dtype = w_->embed.scalar_type();
  nlohmann::ordered_json config = {
      {"architectures", {"Qwen3ForCausalLM"}},
      {"model_type", "qwen3"},
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.hidden_size},
      {"num_hidden_layers", c.num_layers},
      {"num_attention_heads", c.num_heads},
      {"num_key_value_heads", c.num_kv_heads},
      {"head_dim", c.head_dim},
      {"intermediate_size", c.intermediate_size},
      {"rope_theta", c.rope_theta},
      {"rms_norm_eps", c.rms_norm_eps},
      {"hidden_act", "silu"},
      {"attention_bias", false},
      {"rope_scaling", nullptr},
      {"tie_word_embeddings", true},
      {"torch_dtype", dtype == at::kBFloat16 ? "bfloat16" : dtype == at::kHalf ? "float16" : "float32"}};
  std::ofstream((fs::path(dir) / "config.json").string()) << config.dump(2) << "\n";
  // Norm scales are stored in the model's dtype, as Hugging Face checkpoints store them.
  auto slots = const_cast<Weights&>(*w_).slots();
  if (shards == 1) {
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    for (auto& slot : slots) tensors.emplace_back(slot.name, slot.tensor->to(dtype).contiguous());
    return write_safetensors((fs::path(dir) / "model.safetensors").string(), tensors, {{"format", "pt"}});
  }
  // Shards of about equal size, in slot order, named and indexed as Hugging Face names them.
  const int64_t per_shard = weight_bytes() / shards + 1;
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  size_t next = 0;
  for (int s = 1; s <= shards; ++s) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05d-of-%05d.safetensors", s, shards);
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    int64_t bytes = 0;
    while (next < slots.size() && (s == shards || bytes < per_shard)) {
      bytes += static_cast<int64_t>(slots[next].tensor->nbytes());
      tensors.emplace_back(slots[next].name, slots[next].tensor->to(dtype).contiguous());
      weight_map[slots[next].name] = name;
      ++next;
    }
    INFILL_RETURN_IF_ERROR(write_safetensors((fs::path(dir) / name).string(), tensors, {{"format", "pt"}}));
  }
  nlohmann::ordered_json index = {{"metadata", {{"total_size", weight_bytes()}}}, {"weight_map", weight_map}};
  std::ofstream((fs::path(dir) / "model.safetensors.index.json").string()) << index.dump(2) << "\n";
  return {};
}

namespace {

// Hugging Face's Qwen3RMSNorm: x * rsqrt(mean(x^2) + eps) in float32, then back in x's dtype
// times the weight (float32 [last axis]), over the last axis. On the CPU x is float32 already.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  if (x.scalar_type() == at::kFloat) return x * at::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps) * weight;
  const at::Tensor xf = x.to(at::kFloat);
  const at::Tensor normed = (xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps)).to(x.scalar_type());
  return weight.to(x.scalar_type()) * normed;
}

// rotate_half RoPE (the first and second halves of each head pair up), Hugging Face's
// apply_rotary_pos_emb: x [S, heads, d], cos/sin [S, 1, d].
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  const at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

}  // namespace

Result<at::Tensor> Qwen3Encoder::encode(const std::vector<int32_t>& ids, const std::vector<uint8_t>& mask,
                                        const std::vector<int>& layers) const {
  const Qwen3Config& c = w_->cfg;
  const int64_t S = static_cast<int64_t>(ids.size());
  if (S == 0) return invalid_argument("qwen3 encode: no tokens");
  if (mask.size() != ids.size()) {
    return invalid_argument("qwen3 encode: " + std::to_string(mask.size()) + " mask entries for " + std::to_string(S) + " tokens");
  }
  if (mask[0] == 0) return invalid_argument("qwen3 encode: the first token is padding (expected right padding)");
  if (layers.empty()) return invalid_argument("qwen3 encode: no hidden-state layers requested");
  for (const int32_t id : ids) {
    if (id < 0 || id >= c.vocab_size) {
      return invalid_argument("qwen3 encode: token id " + std::to_string(id) + " is outside the embedding's " +
                              std::to_string(c.vocab_size) + " rows (tokenizer and encoder do not match)");
    }
  }
  for (const int k : layers) {
    if (k < 0 || k > c.num_layers) {
      return invalid_argument("qwen3 encode: hidden state " + std::to_string(k) + " does not exist (expected 0.." +
                              std::to_string(c.num_layers) + ")");
    }
  }
  c10::InferenceMode guard;
  const int deepest = *std::max_element(layers.begin(), layers.end());
  const int64_t heads = c.num_heads, kv_heads = c.num_kv_heads, D = c.head_dim;

  // float32 on the CPU (no fast bf16 GEMM there), the weights' dtype on a GPU (on_device).
  const at::Device device = w_->embed.device();
  const at::ScalarType dtype = device.is_cpu() ? at::kFloat : w_->embed.scalar_type();
  const auto on_device = at::TensorOptions().device(device).dtype(dtype);
  const at::Tensor id_tensor = at::tensor(std::vector<int64_t>(ids.begin(), ids.end()), at::kLong).to(device);
  at::Tensor x = w_->embed.index_select(0, id_tensor).to(dtype);

  // Causal mask with padding keys masked for every query (right padding: a padding query
  // still sees every real token before it, so no row is empty).
  std::vector<float> allowed(static_cast<size_t>(S * S));
  for (int64_t i = 0; i < S; ++i) {
    for (int64_t j = 0; j < S; ++j) {
      allowed[static_cast<size_t>(i * S + j)] = (j <= i && mask[static_cast<size_t>(j)] != 0) ? 0.0f : -INFINITY;
    }
  }
  const at::Tensor additive = at::from_blob(allowed.data(), {1, S, S}, at::kFloat).to(on_device);

  // RoPE tables for positions 0..S-1: inv_freq = theta^(-2i/d), duplicated for both halves.
  const at::Tensor inv_freq =
      at::pow(c.rope_theta, at::arange(0, D, 2, at::kDouble) / static_cast<double>(D)).reciprocal();
  const at::Tensor angles = at::outer(at::arange(S, at::kDouble), inv_freq);
  const at::Tensor both = at::cat({angles, angles}, -1);
  const at::Tensor cos = both.cos().to(on_device).unsqueeze(1);  // [S, 1, D]
  const at::Tensor sin = both.sin().to(on_device).unsqueeze(1);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));

  std::map<int, at::Tensor> states;
  if (std::find(layers.begin(), layers.end(), 0) != layers.end()) states[0] = x;
  for (int l = 0; l < deepest; ++l) {
    const Weights::Layer& L = w_->layers[static_cast<size_t>(l)];
    at::Tensor h = rms_norm(x, L.input_norm, c.rms_norm_eps);
    const at::Tensor q = apply_rope(rms_norm(stored_linear(h, L.q).view({S, heads, D}), L.q_norm, c.rms_norm_eps), cos, sin);
    const at::Tensor k = apply_rope(rms_norm(stored_linear(h, L.k).view({S, kv_heads, D}), L.k_norm, c.rms_norm_eps), cos, sin);
    const at::Tensor v = stored_linear(h, L.v).view({S, kv_heads, D});
    // Grouped-query attention: query head n reads key/value head n / (heads / kv_heads).
    const int64_t group = heads / kv_heads;
    const at::Tensor kh = k.permute({1, 0, 2}).repeat_interleave(group, 0);  // [heads, S, D]
    const at::Tensor vh = v.permute({1, 0, 2}).repeat_interleave(group, 0);
    const at::Tensor scores = at::baddbmm(additive.expand({heads, S, S}), q.permute({1, 0, 2}), kh.transpose(1, 2),
                                          /*beta=*/1.0, /*alpha=*/scale);
    // The softmax in float32 whatever the compute dtype, as Hugging Face's eager attention.
    const at::Tensor probs = dtype == at::kFloat ? at::softmax(scores, -1) : at::softmax(scores, -1, at::kFloat).to(dtype);
    const at::Tensor attn = at::bmm(probs, vh).permute({1, 0, 2}).reshape({S, heads * D});
    x = x + stored_linear(attn, L.o);
    h = rms_norm(x, L.post_norm, c.rms_norm_eps);
    x = x + stored_linear(at::silu(stored_linear(h, L.gate)) * stored_linear(h, L.up), L.down);
    if (std::find(layers.begin(), layers.end(), l + 1) != layers.end()) states[l + 1] = x;
  }
  std::vector<at::Tensor> parts;
  for (const int k : layers) parts.push_back(states.at(k));
  return at::cat(parts, 1).to(at::kCPU, at::kFloat);
}

Result<std::vector<int>> flux2_text_layers(const Qwen3Config& config, int context_dim, const std::string& where) {
  if (context_dim % config.hidden_size != 0) {
    return invalid_argument(where + ": the transformer reads text rows of " + std::to_string(context_dim) +
                            " channels, not a multiple of the text encoder's hidden size " + std::to_string(config.hidden_size));
  }
  const int count = context_dim / config.hidden_size;
  if (count == 3 && config.num_layers >= 27) return klein_text_layers();
  if (count > config.num_layers) {
    return invalid_argument(where + ": the transformer reads " + std::to_string(count) + " hidden states, the text encoder has " +
                            std::to_string(config.num_layers) + " layers");
  }
  std::vector<int> layers;
  for (int i = 1; i <= count; ++i) layers.push_back((i * config.num_layers + count - 1) / count);
  return layers;
}

}  // namespace infill
