#include "model/lora_adapter.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <regex>
#include <set>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>

#include "common/hash.h"
#include "common/shape_text.h"
#include "model/flux2_transformer.h"
#include "model/flux2_weight_names.h"
#include "model/safetensors.h"
#include "model/safetensors_torch.h"

namespace infill {

const char* lora_format_name(LoraFormat format) {
  switch (format) {
    case LoraFormat::kUpstream: return "upstream";
    case LoraFormat::kKohya: return "kohya";
    case LoraFormat::kDiffusers: return "diffusers";
  }
  return "unknown";
}

int64_t LoraAdapter::min_rank() const {
  int64_t r = 0;
  for (const auto& [_, l] : layers) r = r == 0 ? l.rank() : std::min(r, l.rank());
  return r;
}

int64_t LoraAdapter::max_rank() const {
  int64_t r = 0;
  for (const auto& [_, l] : layers) r = std::max(r, l.rank());
  return r;
}

int64_t LoraAdapter::bytes() const {
  int64_t b = 0;
  for (const auto& [_, l] : layers) b += static_cast<int64_t>(l.down.nbytes() + l.up.nbytes());
  return b;
}

at::Tensor LoraAdapter::delta(const std::string& weight) const {
  const auto it = layers.find(weight);
  if (it == layers.end()) return {};
  c10::InferenceMode guard;
  return at::mm(it->second.up, it->second.down);
}

std::string adapter_set_key(const std::vector<std::pair<std::string, double>>& uses) {
  std::string key;
  for (const auto& [id, s] : uses) {
    char strength[32];
    std::snprintf(strength, sizeof strength, "%.9g", s);
    key += (key.empty() ? "" : "+") + id + "*" + strength;
  }
  return key;
}

bool adapter_set_key_holds(std::string_view key, std::string_view id) {
  // Each use is "<id>*<strength>", joined by '+'. A strength's own '+' ("1e+09") is followed by
  // digits and then '+' or the end, never by '*': only an id is.
  if (id.empty()) return false;
  for (size_t at = key.find(id); at != std::string_view::npos; at = key.find(id, at + 1)) {
    const size_t end = at + id.size();
    if ((at == 0 || key[at - 1] == '+') && end < key.size() && key[end] == '*') return true;
  }
  return false;
}

std::string adapter_set_key(const AdapterSet& set) {
  std::vector<std::pair<std::string, double>> uses;
  for (const AdapterUse& use : set) uses.emplace_back(use.adapter->id, use.strength);
  return adapter_set_key(uses);
}

std::shared_ptr<const LoraAdapter> LoraAdapter::on(const at::TensorOptions& options) const {
  c10::InferenceMode guard;
  auto copy = std::make_shared<LoraAdapter>(*this);
  for (auto& [_, layer] : copy->layers) {
    layer.down = layer.down.to(options);
    layer.up = layer.up.to(options);
  }
  return copy;
}

std::shared_ptr<const LoraAdapter> LoraAdapter::pinned(at::ScalarType dtype, bool* pinned) const {
  c10::InferenceMode guard;
  auto copy = std::make_shared<LoraAdapter>(*this);
  *pinned = true;
  const auto to_host = [&](const at::Tensor& t) {
    if (*pinned) {
      try {
        return at::empty(t.sizes(), at::TensorOptions().dtype(dtype).pinned_memory(true)).copy_(t);
      } catch (const c10::Error&) {
        *pinned = false;  // the driver's limit on page-locked memory: copies are only slower
      }
    }
    return t.to(dtype);
  };
  for (auto& [_, layer] : copy->layers) {
    layer.down = to_host(layer.down);
    layer.up = to_host(layer.up);
  }
  return copy;
}

namespace {

std::string shape_of(const at::Tensor& t) { return shape_text(std::vector<int64_t>(t.sizes().begin(), t.sizes().end())); }

enum class Role { kDown = 1, kUp = 2, kAlpha = 3 };

// One module of the file: its stored keys by role.
struct StoredModule {
  LoraFormat format = LoraFormat::kUpstream;
  std::map<Role, std::string> keys;
};

// The upstream module names a FLUX.2 transformer may have, whatever its depth: those of a
// one-double, one-single block model with guidance, block indices written as "#". A name the
// model lacks but this knows is a layer of another model size, not an unknown key.
const std::set<std::string>& known_module_patterns() {
  static const std::set<std::string> patterns = [] {
    Flux2Config cfg;
    cfg.double_blocks = 1;
    cfg.single_blocks = 1;
    cfg.guidance_embed = true;
    std::set<std::string> out;
    for (const Flux2LinearLayer& l : flux2_linear_layers(cfg)) {
      std::string module = l.name.substr(0, l.name.size() - std::string(".weight").size());
      out.insert(std::regex_replace(module, std::regex(R"(_blocks\.0\.)"), "_blocks.#."));
    }
    return out;
  }();
  return patterns;
}

std::string module_pattern(const std::string& module) {
  static const std::regex block_index(R"(_blocks\.\d+\.)");
  return std::regex_replace(module, block_index, "_blocks.#.");
}

// kohya writes a module name with '_' for '.', which is ambiguous ("img_attn_qkv"): it is read
// back against the known names, as kohya's own loader matches against the model's modules.
std::optional<std::string> kohya_module_to_upstream(const std::string& kohya) {
  static const std::map<std::string, std::string> by_kohya = [] {
    std::map<std::string, std::string> m;
    for (const std::string& p : known_module_patterns()) {
      std::string k = p;
      std::replace(k.begin(), k.end(), '.', '_');
      m[k] = p;
    }
    return m;
  }();
  std::smatch match;
  std::string index;
  std::string pattern = kohya;
  static const std::regex block_module(R"((double_blocks|single_blocks)_(\d+)_(.+))");
  if (std::regex_match(kohya, match, block_module)) {
    index = match[2].str();
    pattern = match[1].str() + "_#_" + match[3].str();
  }
  const auto it = by_kohya.find(pattern);
  if (it == by_kohya.end()) return std::nullopt;
  std::string upstream = it->second;
  if (!index.empty()) upstream.replace(upstream.find('#'), 1, index);
  return upstream;
}

// Splits a stored key into (format, module, role), or nullopt for a key of no LoRA format.
struct ParsedKey {
  LoraFormat format;
  std::string module;
  Role role;
};

std::optional<ParsedKey> parse_key(const std::string& key) {
  static const std::vector<std::pair<std::string, Role>> kRoles = {
      {".lora_A.weight", Role::kDown},    {".lora_B.weight", Role::kUp},
      {".lora_A.default.weight", Role::kDown}, {".lora_B.default.weight", Role::kUp},
      {".lora_down.weight", Role::kDown}, {".lora_up.weight", Role::kUp},
      {".alpha", Role::kAlpha},
  };
  for (const auto& [suffix, role] : kRoles) {
    if (!key.ends_with(suffix)) continue;
    const std::string stem = key.substr(0, key.size() - suffix.size());
    if (stem.starts_with("lora_unet_")) return ParsedKey{LoraFormat::kKohya, stem.substr(10), role};
    if (stem.starts_with("transformer.")) return ParsedKey{LoraFormat::kDiffusers, stem.substr(12), role};
    for (const std::string prefix : {"model.diffusion_model.", "diffusion_model.", "base_model.model."}) {
      if (!stem.starts_with(prefix)) continue;
      const std::string module = stem.substr(prefix.size());
      // fal's trainer writes upstream names under PEFT's "base_model.model."; diffusers names
      // there are read as diffusers.
      const bool diffusers = upstream_weight_of_diffusers(module + ".weight").has_value();
      return ParsedKey{diffusers ? LoraFormat::kDiffusers : LoraFormat::kUpstream, module, role};
    }
    return std::nullopt;
  }
  return std::nullopt;
}

// The kinds of adapter this loader does not apply, recognised by their keys.
std::optional<std::string> unsupported_kind(const std::string& key) {
  if (key.find("lokr_w") != std::string::npos || key.find("lokr_t") != std::string::npos) return "LoKr";
  if (key.find("hada_w") != std::string::npos || key.find("hada_t") != std::string::npos) return "LoHa";
  if (key.find("dora_scale") != std::string::npos || key.find("lora_magnitude_vector") != std::string::npos) {
    return "DoRA";
  }
  if (key.find("lora_mid") != std::string::npos) return "LoCon with a CP-decomposed mid";
  return std::nullopt;
}

bool text_encoder_key(const std::string& key) {
  return key.starts_with("lora_te") || key.starts_with("text_encoder.") || key.starts_with("text_encoders.") ||
         key.starts_with("base_model.model.text_encoder") || key.starts_with("te.");
}

// PEFT's scale for a diffusers module: lora_alpha / r, or / sqrt(r) with use_rslora, either
// overridden per module by alpha_pattern / rank_pattern (a key matches a module name that ends
// with it, PEFT's "(.*\.)?key$").
struct PeftScale {
  bool present = false;
  double alpha = 0, r = 0;
  bool rslora = false;
  std::map<std::string, double> alpha_pattern, rank_pattern;

  double scale(const std::string& module, int64_t stored_rank) const {
    if (!present) return 1.0;
    auto lookup = [&](const std::map<std::string, double>& patterns, double fallback) {
      for (const auto& [key, value] : patterns) {
        if (module == key || module.ends_with("." + key)) return value;
      }
      return fallback;
    };
    const double r_module = lookup(rank_pattern, r > 0 ? r : static_cast<double>(stored_rank));
    const double a_module = lookup(alpha_pattern, alpha > 0 ? alpha : r_module);
    return rslora ? a_module / std::sqrt(r_module) : a_module / r_module;
  }
};

Result<PeftScale> peft_scale(const SafetensorsFile& file) {
  PeftScale s;
  const auto it = file.metadata().find("lora_adapter_metadata");
  if (it == file.metadata().end()) return s;
  const nlohmann::json j = nlohmann::json::parse(it->second, nullptr, false);
  if (!j.is_object()) {
    return invalid_argument(file.path() + ": metadata lora_adapter_metadata is not a JSON object (expected PEFT's "
                            "LoraConfig: r, lora_alpha, ...)");
  }
  auto number = [&](const char* name, double& out) -> Status {
    if (!j.contains(name)) return {};
    if (!j[name].is_number()) {
      return invalid_argument(file.path() + ": lora_adapter_metadata." + name + " is not a number");
    }
    out = j[name].get<double>();
    if (!(out > 0)) return invalid_argument(file.path() + ": lora_adapter_metadata." + name + " must be positive");
    return {};
  };
  s.present = true;
  INFILL_RETURN_IF_ERROR(number("r", s.r));
  INFILL_RETURN_IF_ERROR(number("lora_alpha", s.alpha));
  s.rslora = j.value("use_rslora", false);
  for (const auto& [field, target] : {std::pair{"alpha_pattern", &s.alpha_pattern}, std::pair{"rank_pattern", &s.rank_pattern}}) {
    if (!j.contains(field) || !j[field].is_object()) continue;
    for (const auto& [key, value] : j[field].items()) {
      if (value.is_number() && value.get<double>() > 0) (*target)[key] = value.get<double>();
    }
  }
  return s;
}

// One resolved update before q/k/v parts are fused: down [r, in], up [rows, r] (scaled).
struct Part {
  UpstreamWeight::Part part = UpstreamWeight::Part::kWhole;
  std::string key;  // the down key, for messages
  at::Tensor down, up;
};

}  // namespace

Result<std::shared_ptr<const LoraAdapter>> load_lora(const std::string& path, const Flux2Config& config,
                                                     const std::string& model_name) {
  INFILL_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(path));
  c10::InferenceMode guard;
  auto adapter = std::make_shared<LoraAdapter>();
  adapter->path = path;
  adapter->file_bytes = static_cast<int64_t>(file.file_bytes().size());
  adapter->id = sha256_hex(file.file_bytes());
  const std::string lora = "LoRA " + path;

  std::map<std::string, Flux2LinearLayer> model_layers;
  for (Flux2LinearLayer& l : flux2_linear_layers(config)) model_layers[l.name] = l;
  const std::string model_shape = model_name + " (" + std::to_string(config.double_blocks) + " double and " +
                                  std::to_string(config.single_blocks) + " single blocks, hidden " +
                                  std::to_string(config.hidden_size) + ")";

  // Keys grouped by module, every key accounted for.
  std::map<std::string, StoredModule> modules;
  std::vector<std::string> text_keys;
  std::optional<LoraFormat> format;
  for (const TensorInfo& t : file.tensors()) {
    if (const auto kind = unsupported_kind(t.name)) {
      return invalid_argument(lora + ": key " + t.name + " belongs to a " + *kind +
                              " adapter; only plain LoRA (lora_A/lora_B or lora_down/lora_up) is supported");
    }
    if (text_encoder_key(t.name)) {
      text_keys.push_back(t.name);
      continue;
    }
    const std::optional<ParsedKey> parsed = parse_key(t.name);
    if (!parsed) {
      return invalid_argument(lora + ": key " + t.name +
                              " is not a LoRA key of a FLUX.2 transformer (expected diffusion_model.<module>.lora_A/"
                              "lora_B.weight, lora_unet_<module>.lora_down/lora_up.weight/.alpha, or "
                              "transformer.<diffusers module>.lora_A/lora_B.weight)");
    }
    if (format && *format != parsed->format) {
      return invalid_argument(lora + ": key " + t.name + " is in the " + lora_format_name(parsed->format) +
                              " format, the keys before it in the " + lora_format_name(*format) +
                              " format; a file holds one format");
    }
    format = parsed->format;
    StoredModule& m = modules[parsed->module];
    m.format = parsed->format;
    if (!m.keys.emplace(parsed->role, t.name).second) {
      return invalid_argument(lora + ": key " + t.name + " repeats the " +
                              (parsed->role == Role::kAlpha ? std::string("alpha") : std::string("lora weight")) +
                              " of module " + parsed->module + " (also " + m.keys[parsed->role] + ")");
    }
  }
  if (!text_keys.empty()) {
    return invalid_argument(lora + ": " + std::to_string(text_keys.size()) + " key(s) adapt the text encoder (" +
                            text_keys.front() + (text_keys.size() > 1 ? ", ..." : "") +
                            "); LoRAs of the Qwen3 text encoder are not applied by this engine, and dropping them "
                            "would change what the LoRA does");
  }
  if (modules.empty()) return invalid_argument(lora + ": no LoRA weights in the file");
  adapter->format = *format;
  INFILL_ASSIGN_OR_RETURN(PeftScale peft, peft_scale(file));

  std::map<std::string, std::vector<Part>> parts_by_weight;
  for (const auto& [module, stored] : modules) {
    const auto down_key = stored.keys.find(Role::kDown), up_key = stored.keys.find(Role::kUp);
    if (down_key == stored.keys.end() || up_key == stored.keys.end()) {
      const std::string& have = stored.keys.begin()->second;
      return invalid_argument(lora + ": module " + module + " has " + have + " but no " +
                              (down_key == stored.keys.end() ? "down (lora_A / lora_down)" : "up (lora_B / lora_up)") +
                              " weight");
    }
    // The upstream weight this module adapts.
    UpstreamWeight target;
    if (stored.format == LoraFormat::kKohya) {
      const std::optional<std::string> upstream = kohya_module_to_upstream(module);
      if (!upstream) {
        return invalid_argument(lora + ": key " + down_key->second + " names module " + module +
                                ", which is no layer of a FLUX.2 transformer");
      }
      target = {*upstream + ".weight", UpstreamWeight::Part::kWhole};
    } else if (stored.format == LoraFormat::kDiffusers) {
      const std::optional<UpstreamWeight> upstream = upstream_weight_of_diffusers(module + ".weight");
      if (!upstream) {
        return invalid_argument(lora + ": key " + down_key->second + " names module " + module +
                                ", which is no linear layer of a diffusers Flux2Transformer2DModel");
      }
      target = *upstream;
    } else {
      target = {module + ".weight", UpstreamWeight::Part::kWhole};
    }
    const std::string target_module = target.name.substr(0, target.name.size() - 7);
    if (known_module_patterns().count(module_pattern(target_module)) == 0) {
      return invalid_argument(lora + ": key " + down_key->second + " adapts " + target_module +
                              ", which is no linear layer of a FLUX.2 transformer");
    }
    const auto layer = model_layers.find(target.name);
    if (layer == model_layers.end()) {
      return invalid_argument(lora + ": key " + down_key->second + " adapts " + target_module + ", which " +
                              model_shape + " does not have: a LoRA for another model?");
    }
    INFILL_ASSIGN_OR_RETURN(at::Tensor down, load_float_tensor(file, down_key->second));
    INFILL_ASSIGN_OR_RETURN(at::Tensor up, load_float_tensor(file, up_key->second));
    const bool qkv_part = target.part == UpstreamWeight::Part::kQ || target.part == UpstreamWeight::Part::kK ||
                          target.part == UpstreamWeight::Part::kV;
    const int64_t out = qkv_part ? layer->second.out / 3 : layer->second.out;
    const int64_t in = layer->second.in;
    if (down.dim() != 2 || down.size(1) != in || down.size(0) < 1) {
      return invalid_argument(lora + ": " + down_key->second + " is " + shape_of(down) + ", expected [rank, " +
                              std::to_string(in) + "] for " + target.name + " of " + model_shape +
                              ": a LoRA for another model size?");
    }
    const int64_t rank = down.size(0);
    if (up.dim() != 2 || up.size(0) != out || up.size(1) != rank) {
      return invalid_argument(lora + ": " + up_key->second + " is " + shape_of(up) + ", expected [" +
                              std::to_string(out) + ", " + std::to_string(rank) + "] (the layer's output rows, the "
                              "rank of " + down_key->second + ") for " + model_shape);
    }
    double scale = 1.0;
    if (const auto alpha_key = stored.keys.find(Role::kAlpha); alpha_key != stored.keys.end()) {
      INFILL_ASSIGN_OR_RETURN(at::Tensor alpha, load_float_tensor(file, alpha_key->second));
      if (alpha.numel() != 1) {
        return invalid_argument(lora + ": " + alpha_key->second + " is " + shape_of(alpha) +
                                ", expected a scalar");
      }
      scale = alpha.item<double>() / static_cast<double>(rank);
    } else if (stored.format == LoraFormat::kDiffusers) {
      scale = peft.scale(module, rank);
    }
    if (target.part == UpstreamWeight::Part::kSwappedHalves) {
      const auto halves = up.chunk(2, 0);
      up = at::cat({halves[1], halves[0]}, 0);
    }
    parts_by_weight[target.name].push_back(Part{target.part, down_key->second, down, up.mul_(scale)});
  }

  for (auto& [weight, parts] : parts_by_weight) {
    const Flux2LinearLayer& layer = model_layers.at(weight);
    if (parts.size() == 1 && (parts[0].part == UpstreamWeight::Part::kWhole ||
                              parts[0].part == UpstreamWeight::Part::kSwappedHalves)) {
      adapter->layers[weight] = LoraLayer{parts[0].down.contiguous(), parts[0].up.contiguous()};
      continue;
    }
    // q, k and v stored apart: one update of the fused weight, each part's up on its rows.
    std::set<UpstreamWeight::Part> seen;
    int64_t total_rank = 0;
    for (const Part& p : parts) {
      if (p.part == UpstreamWeight::Part::kWhole || !seen.insert(p.part).second) {
        return invalid_argument(lora + ": key " + p.key + " adapts rows of " + weight +
                                " that another key of the file adapts too");
      }
      total_rank += p.down.size(0);
    }
    const int64_t rows = layer.out / 3;
    at::Tensor up = at::zeros({layer.out, total_rank}, at::kFloat);
    std::vector<at::Tensor> downs;
    int64_t col = 0;
    for (const Part& p : parts) {
      const int64_t row = (static_cast<int>(p.part) - static_cast<int>(UpstreamWeight::Part::kQ)) * rows;
      up.narrow(0, row, rows).narrow(1, col, p.down.size(0)).copy_(p.up);
      downs.push_back(p.down);
      col += p.down.size(0);
    }
    adapter->layers[weight] = LoraLayer{at::cat(downs, 0).contiguous(), up};
  }
  return std::shared_ptr<const LoraAdapter>(std::move(adapter));
}

}  // namespace infill
