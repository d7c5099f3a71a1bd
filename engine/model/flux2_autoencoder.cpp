#include "model/flux2_autoencoder.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <tuple>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/InferenceMode.h>

#include "common/shape_text.h"
#include "model/safetensors_torch.h"

namespace infill {
namespace {

constexpr int kGroups = 32;  // every GroupNorm of the upstream model
constexpr double kGroupNormEps = 1e-6;
constexpr double kBatchNormEps = 1e-4;  // upstream `bn_eps`
constexpr int64_t kPatch = 2;           // upstream `ps = [2, 2]`
constexpr int kMaxLevels = 16;          // keeps factor() far from int overflow
constexpr int kMaxResBlocks = 64;       // bounds the search for a file's block count
// Attention scores are computed for at most this many (query, key) pairs of the whole batch at
// a time, so that the score matrix stays near 256 MB for large images (the published model's
// mid attention runs at 1/8 of the pixels: 16384 positions at 1024x1024, a full score matrix of
// 1 GiB per image, 16 GiB at 2048x2048). Rows of a softmax are independent, so chunking the
// queries changes nothing.
constexpr int64_t kMaxScoreElements = int64_t{1} << 26;

struct Conv {
  at::Tensor weight;  // [out, in, k, k]
  at::Tensor bias;    // [out]
};

struct Norm {
  at::Tensor weight;  // [C]
  at::Tensor bias;    // [C]
};

struct ResBlock {
  Norm norm1;
  Conv conv1;
  Norm norm2;
  Conv conv2;
  Conv nin_shortcut;  // undefined weight when the block keeps its channel count
};

struct AttnBlock {
  Norm norm;
  Conv q, k, v, proj_out;
};

struct Mid {
  ResBlock block_1;
  AttnBlock attn_1;
  ResBlock block_2;
};

struct Level {
  std::vector<ResBlock> blocks;
  // The encoder's `downsample.conv` or the decoder's `upsample.conv`; undefined weight on the
  // level that has none (the encoder's last, the decoder's first).
  Conv resample;
};

struct Encoder {
  Conv conv_in;
  std::vector<Level> down;
  Mid mid;
  Norm norm_out;
  Conv conv_out;
  Conv quant_conv;
};

struct Decoder {
  Conv post_quant_conv;
  Conv conv_in;
  Mid mid;
  std::vector<Level> up;  // indexed by level, as upstream: up[0] is the full-resolution level
  Norm norm_out;
  Conv conv_out;
};

struct Slot {
  std::string name;
  std::vector<int64_t> shape;
  at::Tensor* tensor;
};

/// Collects every weight's upstream name and expected shape: the one place that knows them.
class SlotList {
 public:
  void tensor(const std::string& name, at::Tensor& t, std::vector<int64_t> shape) {
    slots_.push_back({name, std::move(shape), &t});
  }
  void conv(const std::string& name, Conv& c, int64_t out, int64_t in, int64_t kernel) {
    tensor(name + ".weight", c.weight, {out, in, kernel, kernel});
    tensor(name + ".bias", c.bias, {out});
  }
  void norm(const std::string& name, Norm& n, int64_t channels) {
    tensor(name + ".weight", n.weight, {channels});
    tensor(name + ".bias", n.bias, {channels});
  }
  void res_block(const std::string& name, ResBlock& b, int64_t in, int64_t out) {
    norm(name + ".norm1", b.norm1, in);
    conv(name + ".conv1", b.conv1, out, in, 3);
    norm(name + ".norm2", b.norm2, out);
    conv(name + ".conv2", b.conv2, out, out, 3);
    if (in != out) conv(name + ".nin_shortcut", b.nin_shortcut, out, in, 1);
  }
  void attn_block(const std::string& name, AttnBlock& a, int64_t channels) {
    norm(name + ".norm", a.norm, channels);
    conv(name + ".q", a.q, channels, channels, 1);
    conv(name + ".k", a.k, channels, channels, 1);
    conv(name + ".v", a.v, channels, channels, 1);
    conv(name + ".proj_out", a.proj_out, channels, channels, 1);
  }
  void mid(const std::string& name, Mid& m, int64_t channels) {
    res_block(name + ".block_1", m.block_1, channels, channels);
    attn_block(name + ".attn_1", m.attn_1, channels);
    res_block(name + ".block_2", m.block_2, channels, channels);
  }
  std::vector<Slot> take() { return std::move(slots_); }

 private:
  std::vector<Slot> slots_;
};

// ---- forward pass (inside InferenceMode) ----

at::Tensor conv(const at::Tensor& x, const Conv& c, int64_t stride = 1) {
  const int64_t pad = stride == 1 ? c.weight.size(2) / 2 : 0;
  return at::conv2d(x, c.weight, c.bias, {stride, stride}, {pad, pad});
}

at::Tensor norm(const at::Tensor& x, const Norm& n) {
  return at::group_norm(x, kGroups, n.weight, n.bias, kGroupNormEps);
}

at::Tensor res_block(const at::Tensor& x, const ResBlock& b) {
  at::Tensor h = conv(at::silu(norm(x, b.norm1)), b.conv1);
  h = conv(at::silu(norm(h, b.norm2)), b.conv2);
  return (b.nin_shortcut.weight.defined() ? conv(x, b.nin_shortcut) : x) + h;
}

at::Tensor attn_block(const at::Tensor& x, const AttnBlock& a) {
  const int64_t batch = x.size(0), channels = x.size(1), height = x.size(2), width = x.size(3);
  const int64_t positions = height * width;
  const at::Tensor h = norm(x, a.norm);
  // q and v [B, L, C], k [B, C, L] with L = h*w positions.
  const at::Tensor q = conv(h, a.q).reshape({batch, channels, positions}).transpose(1, 2);
  const at::Tensor k = conv(h, a.k).reshape({batch, channels, positions});
  const at::Tensor v = conv(h, a.v).reshape({batch, channels, positions}).transpose(1, 2);
  const double scale = 1.0 / std::sqrt(static_cast<double>(channels));
  const int64_t rows =
      std::max<int64_t>(1, kMaxScoreElements / std::max<int64_t>(1, batch * positions));
  at::Tensor out = at::empty({batch, positions, channels}, x.options());  // [B, L, C]
  for (int64_t r0 = 0; r0 < positions; r0 += rows) {
    const int64_t r1 = std::min(positions, r0 + rows);
    at::Tensor scores = at::bmm(q.slice(1, r0, r1), k).mul_(scale);  // [B, rows, L]
    out.slice(1, r0, r1).copy_(at::bmm(at::softmax(scores, -1), v));
  }
  out = out.transpose(1, 2).reshape({batch, channels, height, width});
  return x + conv(out, a.proj_out);
}

at::Tensor mid(at::Tensor h, const Mid& m) {
  h = res_block(h, m.block_1);
  h = attn_block(h, m.attn_1);
  return res_block(h, m.block_2);
}

// image [B, C_in, H, W] -> moments [B, 2z, H/2^(L-1), W/2^(L-1)]
at::Tensor run_encoder(const Encoder& e, const at::Tensor& image) {
  at::Tensor h = conv(image, e.conv_in);
  for (const Level& level : e.down) {
    for (const ResBlock& b : level.blocks) h = res_block(h, b);
    if (level.resample.weight.defined()) {
      // Upstream pads right and bottom only, then convolves without padding.
      h = conv(at::constant_pad_nd(h, {0, 1, 0, 1}, 0.0), level.resample, 2);
    }
  }
  h = mid(h, e.mid);
  h = conv(at::silu(norm(h, e.norm_out)), e.conv_out);
  return conv(h, e.quant_conv);
}

// z [B, z, h, w] -> image [B, C_out, h*2^(L-1), w*2^(L-1)]
at::Tensor run_decoder(const Decoder& d, const at::Tensor& z) {
  at::Tensor h = conv(conv(z, d.post_quant_conv), d.conv_in);
  h = mid(h, d.mid);
  for (auto level = d.up.rbegin(); level != d.up.rend(); ++level) {
    for (const ResBlock& b : level->blocks) h = res_block(h, b);
    if (level->resample.weight.defined()) {
      h = conv(at::upsample_nearest2d(h, {2 * h.size(2), 2 * h.size(3)}), level->resample);
    }
  }
  return conv(at::silu(norm(h, d.norm_out)), d.conv_out);
}

void check_input(const at::Tensor& x, int64_t channels, const char* what, const char* expected) {
  TORCH_CHECK(x.defined() && x.dim() == 4 && x.size(1) == channels, "flux2 autoencoder: ", what,
              " is ", x.defined() ? x.sizes() : at::IntArrayRef{}, ", expected ", expected,
              " with ", channels, " channels");
  TORCH_CHECK(x.scalar_type() == at::kFloat, "flux2 autoencoder: ", what, " is ", x.scalar_type(), ", expected float32");
}

// ---- naming: upstream or diffusers ----

// The upstream name of a weight of diffusers' AutoencoderKLFlux2 (`name` without the key prefix),
// or nullopt when diffusers has no such weight: the exact inverse of
// convert_flux2_vae_checkpoint_to_diffusers in scripts/convert_flux2_to_diffusers.py
// (huggingface/diffusers, commit 207bae7). `levels` is the encoder's number of down blocks,
// which upstream's decoder shares (the script's num_up_blocks).
struct UpstreamName {
  std::string name;
  // The script stores the attention's 1x1 conv weights [C, C, 1, 1] as linear weights [C, C]
  // (`[:, :, 0, 0]`).
  bool linear = false;
};

std::optional<UpstreamName> upstream_name(const std::string& name, int levels) {
  // DIFFUSERS_VAE_TO_FLUX2_MAPPING, as the script states it.
  static const std::map<std::string, std::string> kFixed = {
      {"encoder.conv_in.weight", "encoder.conv_in.weight"},
      {"encoder.conv_in.bias", "encoder.conv_in.bias"},
      {"encoder.conv_out.weight", "encoder.conv_out.weight"},
      {"encoder.conv_out.bias", "encoder.conv_out.bias"},
      {"encoder.conv_norm_out.weight", "encoder.norm_out.weight"},
      {"encoder.conv_norm_out.bias", "encoder.norm_out.bias"},
      {"decoder.conv_in.weight", "decoder.conv_in.weight"},
      {"decoder.conv_in.bias", "decoder.conv_in.bias"},
      {"decoder.conv_out.weight", "decoder.conv_out.weight"},
      {"decoder.conv_out.bias", "decoder.conv_out.bias"},
      {"decoder.conv_norm_out.weight", "decoder.norm_out.weight"},
      {"decoder.conv_norm_out.bias", "decoder.norm_out.bias"},
      {"quant_conv.weight", "encoder.quant_conv.weight"},
      {"quant_conv.bias", "encoder.quant_conv.bias"},
      {"post_quant_conv.weight", "decoder.post_quant_conv.weight"},
      {"post_quant_conv.bias", "decoder.post_quant_conv.bias"},
      {"bn.running_mean", "bn.running_mean"},
      {"bn.running_var", "bn.running_var"},
  };
  if (const auto it = kFixed.find(name); it != kFixed.end()) return UpstreamName{it->second};

  // The script writes upstream's decoder.up.{block_id} as up_blocks.{i} with
  // block_id = num_up_blocks - 1 - i: diffusers counts from the lowest resolution. A leading
  // zero or an index past the levels has no upstream counterpart.
  static const std::regex kUpBlock(R"(decoder\.up_blocks\.(0|[1-9]\d{0,5})\.(.+))");
  std::smatch m;
  std::string key = name;
  if (std::regex_match(name, m, kUpBlock)) {
    const int i = std::stoi(m[1].str());
    if (i >= levels) return std::nullopt;
    key = "decoder.up_blocks." + std::to_string(levels - 1 - i) + "." + m[2].str();
  }

  struct Rule {
    std::regex diffusers;
    const char* upstream;
    bool linear;
  };
  static const std::vector<Rule> kRules = [] {
    const std::vector<std::tuple<const char*, const char*, bool>> table = {
        // update_vae_resnet_ldm_to_diffusers: down.{i}.block -> down_blocks.{i}.resnets,
        // up.{block_id}.block -> up_blocks.{i}.resnets, mid.block_{i} -> mid_block.resnets.{i-1}.
        {R"(encoder\.down_blocks\.(\d+)\.resnets\.(\d+)\.(norm1|conv1|norm2|conv2|conv_shortcut)\.(weight|bias))",
         "encoder.down.$1.block.$2.$3.$4", false},
        {R"(decoder\.up_blocks\.(\d+)\.resnets\.(\d+)\.(norm1|conv1|norm2|conv2|conv_shortcut)\.(weight|bias))",
         "decoder.up.$1.block.$2.$3.$4", false},
        {R"((encoder|decoder)\.mid_block\.resnets\.0\.(norm1|conv1|norm2|conv2|conv_shortcut)\.(weight|bias))",
         "$1.mid.block_1.$2.$3", false},
        {R"((encoder|decoder)\.mid_block\.resnets\.1\.(norm1|conv1|norm2|conv2|conv_shortcut)\.(weight|bias))",
         "$1.mid.block_2.$2.$3", false},
        {R"(encoder\.down_blocks\.(\d+)\.downsamplers\.0\.conv\.(weight|bias))",
         "encoder.down.$1.downsample.conv.$2", false},
        {R"(decoder\.up_blocks\.(\d+)\.upsamplers\.0\.conv\.(weight|bias))",
         "decoder.up.$1.upsample.conv.$2", false},
        // update_vae_attentions_ldm_to_diffusers: mid.attn_1 -> mid_block.attentions.0.
        {R"((encoder|decoder)\.mid_block\.attentions\.0\.group_norm\.(weight|bias))",
         "$1.mid.attn_1.norm.$2", false},
        {R"((encoder|decoder)\.mid_block\.attentions\.0\.to_([qkv])\.weight)",
         "$1.mid.attn_1.$2.weight", true},
        {R"((encoder|decoder)\.mid_block\.attentions\.0\.to_([qkv])\.bias)",
         "$1.mid.attn_1.$2.bias", false},
        {R"((encoder|decoder)\.mid_block\.attentions\.0\.to_out\.0\.weight)",
         "$1.mid.attn_1.proj_out.weight", true},
        {R"((encoder|decoder)\.mid_block\.attentions\.0\.to_out\.0\.bias)",
         "$1.mid.attn_1.proj_out.bias", false},
    };
    std::vector<Rule> rules;
    for (const auto& [from, to, linear] : table) rules.push_back({std::regex(from), to, linear});
    return rules;
  }();
  for (const Rule& rule : kRules) {
    if (!std::regex_match(key, m, rule.diffusers)) continue;
    std::string upstream = m.format(rule.upstream);
    // The script's `.replace("nin_shortcut", "conv_shortcut")` on the whole resnet key.
    if (const size_t at = upstream.find(".conv_shortcut."); at != std::string::npos) {
      upstream.replace(at + 1, std::string("conv_shortcut").size(), "nin_shortcut");
    }
    return UpstreamName{std::move(upstream), rule.linear};
  }
  return std::nullopt;
}

// The file's tensors under the key prefix, each with its upstream name (without the prefix).
class StoredNames {
 public:
  struct Entry {
    std::string stored;    // as in the file, prefix included
    std::string upstream;  // empty when the stored name has no upstream counterpart
    bool linear = false;   // see UpstreamName::linear
  };

  // Recognises the naming from diffusers' first encoder resnet; upstream names otherwise.
  StoredNames(const SafetensorsFile& file, const std::string& prefix) : prefix_(prefix) {
    const auto down_block = [&](int i) {
      return prefix + "encoder.down_blocks." + std::to_string(i) + ".resnets.0.conv1.weight";
    };
    diffusers_ = file.find(down_block(0)) != nullptr;
    int levels = 0;
    while (diffusers_ && levels <= kMaxLevels && file.find(down_block(levels)) != nullptr) ++levels;
    // The BatchNorm's training counter, which diffusers' save_pretrained writes too.
    const std::string ignored = prefix + "bn.num_batches_tracked";
    for (const TensorInfo& info : file.tensors()) {
      if (!info.name.starts_with(prefix) || info.name == ignored) continue;
      const std::string key = info.name.substr(prefix.size());
      const std::optional<UpstreamName> upstream =
          diffusers_ ? upstream_name(key, levels) : UpstreamName{key};
      entries_.push_back({info.name, upstream ? upstream->name : "", upstream && upstream->linear});
      if (upstream) by_upstream_[upstream->name] = entries_.size() - 1;
    }
  }

  bool diffusers() const { return diffusers_; }
  // In the file's order.
  const std::vector<Entry>& entries() const { return entries_; }
  // nullptr when no stored tensor has this upstream name.
  const Entry* find(const std::string& upstream) const {
    const auto it = by_upstream_.find(upstream);
    return it == by_upstream_.end() ? nullptr : &entries_[it->second];
  }
  // "no tensor '<prefix><name>'", saying that the name is upstream's when the file's are not.
  std::string missing(const std::string& upstream) const {
    return diffusers_ ? "no diffusers tensor maps to the upstream name '" + upstream + "'"
                      : "no tensor '" + prefix_ + upstream + "'";
  }

 private:
  std::string prefix_;
  bool diffusers_ = false;
  std::vector<Entry> entries_;
  std::map<std::string, size_t> by_upstream_;
};

// ---- config inference ----

// The 4-d shape of conv weight `upstream`, or why there is none.
Result<std::vector<int64_t>> conv_shape(const SafetensorsFile& file, const StoredNames& names,
                                        const std::string& upstream) {
  const StoredNames::Entry* entry = names.find(upstream);
  if (entry == nullptr) {
    return not_found(file.path() + ": " + names.missing(upstream) +
                     " (needed to infer the FLUX.2 autoencoder's config)");
  }
  const TensorInfo* info = file.find(entry->stored);
  if (info->shape.size() != 4 || info->shape[0] <= 0 || info->shape[1] <= 0) {
    return invalid_argument(file.path() + ": " + entry->stored + " is " + shape_text(info->shape) +
                            ", expected a 4-d conv weight [out, in, k, k]");
  }
  return info->shape;
}

Result<Flux2AutoencoderConfig> infer_config(const SafetensorsFile& file, const StoredNames& names) {
  Flux2AutoencoderConfig c;
  c.ch_mult.clear();
  INFILL_ASSIGN_OR_RETURN(auto conv_in, conv_shape(file, names, "encoder.conv_in.weight"));
  c.ch = static_cast<int>(conv_in[0]);
  c.in_channels = static_cast<int>(conv_in[1]);
  const auto block_key = [&](size_t level, int block) {
    return "encoder.down." + std::to_string(level) + ".block." + std::to_string(block) +
           ".conv1.weight";
  };
  while (c.ch_mult.size() <= static_cast<size_t>(kMaxLevels) &&
         names.find(block_key(c.ch_mult.size(), 0)) != nullptr) {
    const std::string key = block_key(c.ch_mult.size(), 0);
    INFILL_ASSIGN_OR_RETURN(auto shape, conv_shape(file, names, key));
    if (shape[0] % c.ch != 0) {
      return invalid_argument(file.path() + ": " + names.find(key)->stored + " is " +
                              shape_text(shape) +
                              ", expected a multiple of ch=" + std::to_string(c.ch) +
                              " (from encoder.conv_in.weight) output channels");
    }
    c.ch_mult.push_back(static_cast<int>(shape[0] / c.ch));
  }
  if (c.ch_mult.empty()) {
    return not_found(file.path() + ": " + names.missing(block_key(0, 0)) +
                     " (needed to infer the FLUX.2 autoencoder's config)");
  }
  c.num_res_blocks = 0;
  while (c.num_res_blocks <= kMaxResBlocks &&
         names.find(block_key(0, c.num_res_blocks)) != nullptr) {
    ++c.num_res_blocks;
  }
  INFILL_ASSIGN_OR_RETURN(auto conv_out, conv_shape(file, names, "encoder.conv_out.weight"));
  const std::string& conv_out_key = names.find("encoder.conv_out.weight")->stored;
  if (conv_out[0] % 2 != 0) {
    return invalid_argument(file.path() + ": " + conv_out_key + " is " + shape_text(conv_out) +
                            ", expected an even number of output channels (mean and log-variance)");
  }
  c.z_channels = static_cast<int>(conv_out[0] / 2);
  INFILL_ASSIGN_OR_RETURN(auto dec_out, conv_shape(file, names, "decoder.conv_out.weight"));
  c.out_channels = static_cast<int>(dec_out[0]);
  const Status valid = c.validate();
  if (!valid.ok()) {
    return Status(valid.code(), file.path() + ": the FLUX.2 autoencoder config inferred from '" +
                                    names.find("encoder.conv_in.weight")->stored + "', '" +
                                    names.find(block_key(0, 0))->stored +
                                    "' and the other levels, '" + conv_out_key + "' and '" +
                                    names.find("decoder.conv_out.weight")->stored +
                                    "' is not usable: " + valid.message());
  }
  return c;
}

}  // namespace

struct Flux2Autoencoder::Weights {
  Flux2AutoencoderConfig config;
  Encoder encoder;
  Decoder decoder;
  at::Tensor bn_running_mean;  // [4z]
  at::Tensor bn_running_var;   // [4z]
  // Derived after loading, shaped [1, 4z, 1, 1] to broadcast over [B, 4z, h, w].
  at::Tensor bn_mean, bn_std;
  // Every weight under its upstream name, for save() (slots() resets the tensors it lists).
  std::vector<std::pair<std::string, at::Tensor>> named;

  // Every weight with its upstream name and expected shape, sizing the level vectors on the
  // way: the single list that loading walks.
  std::vector<Slot> slots() {
    const Flux2AutoencoderConfig& c = config;
    const auto levels = static_cast<int>(c.ch_mult.size());
    const auto width = [&](int level) { return int64_t{c.ch} * c.ch_mult[level]; };
    SlotList s;

    s.conv("encoder.conv_in", encoder.conv_in, c.ch, c.in_channels, 3);
    encoder.down.assign(levels, Level{});
    int64_t block_in = c.ch;
    for (int i = 0; i < levels; ++i) {
      const std::string name = "encoder.down." + std::to_string(i);
      Level& level = encoder.down[i];
      level.blocks.resize(c.num_res_blocks);
      for (int j = 0; j < c.num_res_blocks; ++j) {
        s.res_block(name + ".block." + std::to_string(j), level.blocks[j], block_in, width(i));
        block_in = width(i);
      }
      if (i != levels - 1) s.conv(name + ".downsample.conv", level.resample, block_in, block_in, 3);
    }
    s.mid("encoder.mid", encoder.mid, block_in);
    s.norm("encoder.norm_out", encoder.norm_out, block_in);
    s.conv("encoder.conv_out", encoder.conv_out, 2 * c.z_channels, block_in, 3);
    s.conv("encoder.quant_conv", encoder.quant_conv, 2 * c.z_channels, 2 * c.z_channels, 1);

    s.conv("decoder.post_quant_conv", decoder.post_quant_conv, c.z_channels, c.z_channels, 1);
    block_in = width(levels - 1);
    s.conv("decoder.conv_in", decoder.conv_in, block_in, c.z_channels, 3);
    s.mid("decoder.mid", decoder.mid, block_in);
    decoder.up.assign(levels, Level{});
    for (int i = levels - 1; i >= 0; --i) {
      const std::string name = "decoder.up." + std::to_string(i);
      Level& level = decoder.up[i];
      level.blocks.resize(c.num_res_blocks + 1);
      for (int j = 0; j <= c.num_res_blocks; ++j) {
        s.res_block(name + ".block." + std::to_string(j), level.blocks[j], block_in, width(i));
        block_in = width(i);
      }
      if (i != 0) s.conv(name + ".upsample.conv", level.resample, block_in, block_in, 3);
    }
    s.norm("decoder.norm_out", decoder.norm_out, block_in);
    s.conv("decoder.conv_out", decoder.conv_out, c.out_channels, block_in, 3);

    s.tensor("bn.running_mean", bn_running_mean, {c.latent_channels()});
    s.tensor("bn.running_var", bn_running_var, {c.latent_channels()});
    return s.take();
  }
};

int Flux2AutoencoderConfig::latent_channels() const { return kPatch * kPatch * z_channels; }

int Flux2AutoencoderConfig::factor() const {
  return (1 << (static_cast<int>(ch_mult.size()) - 1)) * static_cast<int>(kPatch);
}

Status Flux2AutoencoderConfig::validate() const {
  const auto fail = [&](const std::string& why) {
    return invalid_argument("FLUX.2 autoencoder config (" + to_string() + "): " + why);
  };
  if (in_channels <= 0 || out_channels <= 0 || ch <= 0 || num_res_blocks <= 0 || z_channels <= 0) {
    return fail("expected every size positive");
  }
  if (ch_mult.empty() || ch_mult.size() > static_cast<size_t>(kMaxLevels)) {
    return fail("expected 1 to " + std::to_string(kMaxLevels) + " levels in ch_mult");
  }
  if (ch % kGroups != 0) {
    return fail("expected ch a multiple of " + std::to_string(kGroups) + " (GroupNorm groups)");
  }
  for (int m : ch_mult) {
    if (m <= 0) return fail("expected every ch_mult entry positive");
  }
  return {};
}

std::string Flux2AutoencoderConfig::to_string() const {
  std::string mult = "[";
  for (size_t i = 0; i < ch_mult.size(); ++i) mult += (i ? ", " : "") + std::to_string(ch_mult[i]);
  return "ch=" + std::to_string(ch) + ", ch_mult=" + mult +
         "], num_res_blocks=" + std::to_string(num_res_blocks) +
         ", z_channels=" + std::to_string(z_channels) +
         ", in_channels=" + std::to_string(in_channels) +
         ", out_channels=" + std::to_string(out_channels);
}

Flux2Autoencoder::Flux2Autoencoder(std::shared_ptr<const Weights> weights)
    : w_(std::move(weights)) {}

Result<Flux2Autoencoder> Flux2Autoencoder::load(const SafetensorsFile& file,
                                                const std::string& key_prefix) {
  const StoredNames names(file, key_prefix);
  INFILL_ASSIGN_OR_RETURN(Flux2AutoencoderConfig config, infer_config(file, names));
  auto w = std::make_shared<Weights>();
  w->config = config;
  std::vector<Slot> slots = w->slots();
  const std::string context = " (a FLUX.2 autoencoder with " + config.to_string() +
                              ", inferred from the shapes, " +
                              (names.diffusers() ? "diffusers" : "upstream") +
                              " names under key prefix '" + key_prefix + "')";

  // Unexpected tensors first: they mean the file is not the layout we inferred, which is a
  // better explanation than whatever shape mismatch loading would then hit.
  std::set<std::string> expected;
  for (const Slot& slot : slots) expected.insert(slot.name);
  for (const StoredNames::Entry& entry : names.entries()) {
    if (expected.count(entry.upstream) == 0) {
      return invalid_argument(file.path() + ": unexpected tensor '" + entry.stored + "'" + context);
    }
  }

  for (Slot& slot : slots) {
    const StoredNames::Entry* entry = names.find(slot.name);
    if (entry == nullptr) return not_found(file.path() + ": " + names.missing(slot.name) + context);
    std::vector<int64_t> shape = slot.shape;
    if (entry->linear) shape.resize(2);  // [C, C, 1, 1] stored as [C, C]
    auto t = load_float_tensor(file, entry->stored, shape);
    if (!t.ok()) return Status(t.status().code(), t.status().message() + context);
    *slot.tensor = entry->linear ? t->reshape(slot.shape) : std::move(t).value();
    w->named.emplace_back(slot.name, *slot.tensor);
  }
  if (!(w->bn_running_var.min().item<float>() >= 0.0f)) {
    return corrupt_data(file.path() + ": " + key_prefix +
                        "bn.running_var has a negative value, expected variances >= 0");
  }
  const int64_t latent = config.latent_channels();
  w->bn_mean = w->bn_running_mean.reshape({1, latent, 1, 1});
  w->bn_std = (w->bn_running_var + kBatchNormEps).sqrt().reshape({1, latent, 1, 1});
  return Flux2Autoencoder(std::move(w));
}

Result<Flux2Autoencoder> Flux2Autoencoder::load(const std::string& path) {
  INFILL_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(path));
  return load(file, "");
}

Flux2Autoencoder Flux2Autoencoder::random(const Flux2AutoencoderConfig& config, uint64_t seed) {
  TORCH_CHECK(config.validate().ok(), config.validate().message());
  c10::InferenceMode guard;
  auto w = std::make_shared<Weights>();
  w->config = config;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (Slot& slot : w->slots()) {
    // GroupNorm scales near 1 and biases near 0 (as trained ones are), convolutions scaled by
    // fan-in so that activations neither vanish nor blow up through the blocks.
    const bool vector = slot.shape.size() == 1;
    const bool scale = vector && slot.name.size() > 7 && slot.name.compare(slot.name.size() - 7, 7, ".weight") == 0;
    at::Tensor t = at::empty(slot.shape, at::kFloat);
    if (slot.name == "bn.running_var") {
      t.uniform_(0.5, 1.5, gen);
    } else if (vector) {
      t.normal_(scale ? 1.0 : 0.0, 0.05, gen);
    } else {
      const double fan_in = double(t.numel() / slot.shape[0]);
      t.normal_(0.0, 1.0 / std::sqrt(fan_in), gen);
    }
    *slot.tensor = t;
    w->named.emplace_back(slot.name, t);
  }
  const int64_t latent = config.latent_channels();
  w->bn_mean = w->bn_running_mean.reshape({1, latent, 1, 1});
  w->bn_std = (w->bn_running_var + kBatchNormEps).sqrt().reshape({1, latent, 1, 1});
  return Flux2Autoencoder(std::move(w));
}

Status Flux2Autoencoder::save(const std::string& path) const {
  std::vector<std::pair<std::string, at::Tensor>> on_cpu;
  for (const auto& [name, t] : w_->named) on_cpu.emplace_back(name, t.to(at::kCPU));
  return write_safetensors(path, on_cpu, {{"format", "pt"}});
}

at::Device Flux2Autoencoder::device() const { return w_->bn_mean.device(); }

Result<Flux2Autoencoder> Flux2Autoencoder::on_device(const ComputeDevice& target) const {
  INFILL_RETURN_IF_ERROR(check_compute_device(target));
  const at::Device device = target.torch_device();
  auto w = std::make_shared<Weights>();
  w->config = w_->config;
  try {
    c10::InferenceMode guard;
    // Fresh slots (slots() sizes the level vectors), filled from this one's weights by name.
    std::map<std::string, at::Tensor> by_name(w_->named.begin(), w_->named.end());
    for (Slot& slot : w->slots()) {
      *slot.tensor = by_name.at(slot.name).to(device);
      w->named.emplace_back(slot.name, *slot.tensor);
    }
    w->bn_mean = w_->bn_mean.to(device);
    w->bn_std = w_->bn_std.to(device);
  } catch (const c10::Error& e) {
    return Status(ErrorCode::kResourceExhausted,
                  "FLUX.2 autoencoder to " + target.name() + ": " + e.what_without_backtrace());
  }
  return Flux2Autoencoder(std::move(w));
}

const Flux2AutoencoderConfig& Flux2Autoencoder::config() const { return w_->config; }
int Flux2Autoencoder::factor() const { return w_->config.factor(); }
int Flux2Autoencoder::latent_channels() const { return w_->config.latent_channels(); }

at::Tensor Flux2Autoencoder::encode_normalized(const at::Tensor& image) const {
  const Flux2AutoencoderConfig& c = w_->config;
  check_input(image, c.in_channels, "image", "[B, C, H, W]");
  const int64_t f = c.factor();
  TORCH_CHECK(
      image.size(2) > 0 && image.size(3) > 0 && image.size(2) % f == 0 && image.size(3) % f == 0,
      "flux2 autoencoder: image is ", image.sizes(), ", expected H and W multiples of ", f);
  at::Tensor out;
  {
    c10::InferenceMode guard;
    const at::Tensor moments = run_encoder(w_->encoder, image.to(device()));  // [B, 2z, H', W']
    out = patchify_normalize(moments.slice(1, 0, c.z_channels)).to(image.device());  // the mean [B, z, H', W']
  }
  // A clone made outside InferenceMode is an ordinary tensor, which callers may modify in place.
  return out.clone(at::MemoryFormat::Contiguous);
}

at::Tensor Flux2Autoencoder::decode_normalized(const at::Tensor& latent) const {
  const Flux2AutoencoderConfig& c = w_->config;
  check_input(latent, c.latent_channels(), "latent", "[B, C, h, w]");
  at::Tensor out;
  {
    c10::InferenceMode guard;
    const at::Tensor unpatched = unpatchify_denormalize(latent.to(device()));
    out = run_decoder(w_->decoder, unpatched).to(latent.device());
  }
  return out.clone(at::MemoryFormat::Contiguous);
}

at::Tensor Flux2Autoencoder::patchify_normalize(const at::Tensor& mean) const {
  const Flux2AutoencoderConfig& c = w_->config;
  check_input(mean, c.z_channels, "latent mean", "[B, z, H', W']");
  TORCH_CHECK(mean.size(2) % kPatch == 0 && mean.size(3) % kPatch == 0, "flux2 autoencoder: latent mean is ",
              mean.sizes(), ", expected even H' and W'");
  c10::InferenceMode guard;
  const int64_t batch = mean.size(0), h = mean.size(2) / kPatch, w = mean.size(3) / kPatch;
  // "c (i pi) (j pj) -> (c pi pj) i j"
  const at::Tensor z = mean.to(device())
                           .reshape({batch, c.z_channels, h, kPatch, w, kPatch})
                           .permute({0, 1, 3, 5, 2, 4})
                           .reshape({batch, c.latent_channels(), h, w});
  return ((z - w_->bn_mean) / w_->bn_std).to(mean.device());
}

at::Tensor Flux2Autoencoder::unpatchify_denormalize(const at::Tensor& latent) const {
  const Flux2AutoencoderConfig& c = w_->config;
  check_input(latent, c.latent_channels(), "latent", "[B, C, h, w]");
  c10::InferenceMode guard;
  const at::Tensor z = latent.to(device()) * w_->bn_std + w_->bn_mean;  // [B, 4z, h, w]
  const int64_t batch = z.size(0), h = z.size(2), w = z.size(3);
  // "(c pi pj) i j -> c (i pi) (j pj)"
  return z.reshape({batch, c.z_channels, kPatch, kPatch, h, w})
      .permute({0, 1, 4, 2, 5, 3})
      .reshape({batch, c.z_channels, h * kPatch, w * kPatch})
      .to(latent.device());
}

at::Tensor Flux2Autoencoder::encode(const at::Tensor& rgb) const {
  check_input(rgb, 3, "rgb", "[B, 3, H, W]");
  return encode_normalized(rgb * 2 - 1);
}

at::Tensor Flux2Autoencoder::decode(const at::Tensor& latent) const {
  TORCH_CHECK(w_->config.out_channels == 3, "flux2 autoencoder: decode needs 3 output channels, ",
              "the model has ", w_->config.out_channels);
  at::Tensor image = decode_normalized(latent);
  return image.add_(1).mul_(0.5).clamp_(0, 1);
}

at::Tensor Flux2Autoencoder::decode_crop(const at::Tensor& latent, int x0, int y0, int w, int h,
                                         int margin) const {
  check_input(latent, latent_channels(), "latent", "[B, C, h, w]");
  const auto [cx0, cy0, cx1, cy1] = latent_context_box(latent, x0, y0, w, h, margin, "flux2 autoencoder");
  const int64_t f = factor();
  const at::Tensor pixels = decode(latent.slice(2, cy0, cy1).slice(3, cx0, cx1));
  return pixels.slice(2, (y0 - cy0) * f, (y0 - cy0 + h) * f)
      .slice(3, (x0 - cx0) * f, (x0 - cx0 + w) * f)
      .contiguous();
}

}  // namespace infill
