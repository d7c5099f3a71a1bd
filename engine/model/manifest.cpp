#include "model/manifest.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

namespace infill {
namespace {

using nlohmann::json;

constexpr const char* kFormat = "infill-model/1";

// Reads typed fields out of one JSON object and remembers which ones were seen, so that
// unknown (misspelled) fields can be reported instead of silently ignored.
class FieldReader {
 public:
  FieldReader(const json& object, std::string path, std::string file)
      : object_(object), path_(std::move(path)), file_(std::move(file)) {}

  std::string where(const std::string& field) const {
    return file_ + ": " + (path_.empty() ? field : path_ + "." + field);
  }

  template <class T>
  Status read(const std::string& field, T& out, bool required) {
    seen_.insert(field);
    auto it = object_.find(field);
    if (it == object_.end()) {
      return required ? invalid_argument(where(field) + " is required but missing") : Status();
    }
    if constexpr (std::is_same_v<T, std::string>) {
      if (!it->is_string()) return invalid_argument(where(field) + " must be a string");
    } else if constexpr (std::is_same_v<T, bool>) {
      if (!it->is_boolean()) return invalid_argument(where(field) + " must be true or false");
    } else if constexpr (std::is_integral_v<T>) {
      if (!it->is_number_integer()) return invalid_argument(where(field) + " must be an integer");
    } else {
      if (!it->is_number()) return invalid_argument(where(field) + " must be a number");
    }
    out = it->get<T>();
    return {};
  }

  const json* child(const std::string& field) {
    seen_.insert(field);
    auto it = object_.find(field);
    return it == object_.end() ? nullptr : &*it;
  }

  Status check_unknown() const {
    for (auto it = object_.begin(); it != object_.end(); ++it) {
      if (!seen_.count(it.key())) {
        std::string known;
        for (const auto& k : seen_) known += (known.empty() ? "" : ", ") + k;
        return invalid_argument(where(it.key()) + " is not a known field (known: " + known + ")");
      }
    }
    return {};
  }

 private:
  const json& object_;
  std::string path_;
  std::string file_;
  std::set<std::string> seen_;
};

Status parse_inputs(const json& value, const std::string& where, std::vector<DitInput>& out) {
  if (!value.is_array() || value.empty()) {
    return invalid_argument(where + " must be a non-empty array of \"noisy_latent\", \"masked_latent\", \"mask\"");
  }
  out.clear();
  for (const auto& item : value) {
    const std::string name = item.is_string() ? item.get<std::string>() : item.dump();
    if (name == "noisy_latent") out.push_back(DitInput::kNoisyLatent);
    else if (name == "masked_latent") out.push_back(DitInput::kMaskedLatent);
    else if (name == "mask") out.push_back(DitInput::kMask);
    else return invalid_argument(where + " has unknown input " + name + " (expected noisy_latent, masked_latent or mask)");
  }
  if (out.front() != DitInput::kNoisyLatent) return invalid_argument(where + " must start with \"noisy_latent\"");
  return {};
}

Status parse_dit(const json& object, const std::string& file, DitConfig& dit) {
  if (!object.is_object()) return invalid_argument(file + ": dit must be an object");
  FieldReader r(object, "dit", file);
  INFILL_RETURN_IF_ERROR(r.read("weights", dit.weights, true));
  INFILL_RETURN_IF_ERROR(r.read("key_prefix", dit.key_prefix, false));
  INFILL_RETURN_IF_ERROR(r.read("hidden_size", dit.hidden_size, true));
  INFILL_RETURN_IF_ERROR(r.read("depth", dit.depth, true));
  INFILL_RETURN_IF_ERROR(r.read("num_heads", dit.num_heads, true));
  INFILL_RETURN_IF_ERROR(r.read("patch_size", dit.patch_size, false));
  INFILL_RETURN_IF_ERROR(r.read("mlp_ratio", dit.mlp_ratio, false));
  INFILL_RETURN_IF_ERROR(r.read("latent_channels", dit.latent_channels, true));
  INFILL_RETURN_IF_ERROR(r.read("learn_sigma", dit.learn_sigma, false));
  INFILL_RETURN_IF_ERROR(r.read("frequency_embedding_size", dit.frequency_embedding_size, false));
  if (const json* inputs = r.child("inputs")) {
    INFILL_RETURN_IF_ERROR(parse_inputs(*inputs, r.where("inputs"), dit.inputs));
  }
  std::string conditioning = "none";
  INFILL_RETURN_IF_ERROR(r.read("conditioning", conditioning, false));
  if (conditioning == "none") dit.conditioning = ConditioningType::kNone;
  else if (conditioning == "class") dit.conditioning = ConditioningType::kClass;
  else if (conditioning == "vector") dit.conditioning = ConditioningType::kVector;
  else return invalid_argument(r.where("conditioning") + " is \"" + conditioning + "\", expected none, class or vector");
  INFILL_RETURN_IF_ERROR(r.read("num_classes", dit.num_classes, false));
  INFILL_RETURN_IF_ERROR(r.read("conditioning_dim", dit.conditioning_dim, false));
  std::string scope = "global";
  INFILL_RETURN_IF_ERROR(r.read("prompt_scope", scope, false));
  if (scope == "global") dit.prompt_scope = PromptScope::kGlobal;
  else if (scope == "masked_tokens") dit.prompt_scope = PromptScope::kMaskedTokens;
  else return invalid_argument(r.where("prompt_scope") + " is \"" + scope + "\", expected global or masked_tokens");
  std::string prediction = "flow";
  INFILL_RETURN_IF_ERROR(r.read("prediction", prediction, false));
  if (prediction == "flow") dit.prediction = PredictionType::kFlow;
  else if (prediction == "epsilon") dit.prediction = PredictionType::kEpsilon;
  else return invalid_argument(r.where("prediction") + " is \"" + prediction + "\", expected flow or epsilon");
  INFILL_RETURN_IF_ERROR(r.check_unknown());
  return dit.validate();
}

Status parse_autoencoder(const json& object, const std::string& file, AutoencoderSpec& ae) {
  if (!object.is_object()) return invalid_argument(file + ": autoencoder must be an object");
  FieldReader r(object, "autoencoder", file);
  INFILL_RETURN_IF_ERROR(r.read("type", ae.type, true));
  INFILL_RETURN_IF_ERROR(r.read("encoder", ae.encoder, true));
  INFILL_RETURN_IF_ERROR(r.read("decoder", ae.decoder, true));
  INFILL_RETURN_IF_ERROR(r.read("latent_channels", ae.latent_channels, true));
  INFILL_RETURN_IF_ERROR(r.read("factor", ae.factor, false));
  INFILL_RETURN_IF_ERROR(r.read("scale", ae.scale, false));
  INFILL_RETURN_IF_ERROR(r.read("shift", ae.shift, false));
  INFILL_RETURN_IF_ERROR(r.check_unknown());
  if (ae.type == "taesd") {
    if (ae.factor != 8) return invalid_argument(r.where("factor") + " is " + std::to_string(ae.factor) + ", expected 8");
  } else if (ae.type == "patch_pca") {
    if (ae.factor != 2 && ae.factor != 4 && ae.factor != 8 && ae.factor != 16) {
      return invalid_argument(r.where("factor") + " is " + std::to_string(ae.factor) + ", expected 2, 4, 8 or 16");
    }
  } else {
    return invalid_argument(r.where("type") + " is \"" + ae.type + "\", expected taesd or patch_pca");
  }
  if (!(ae.scale > 0.0) || !std::isfinite(ae.scale) || !std::isfinite(ae.shift)) {
    return invalid_argument(r.where("scale") + " must be finite and positive, and shift finite");
  }
  if (ae.latent_channels <= 0) return invalid_argument(r.where("latent_channels") + " must be positive");
  return {};
}

Status parse_prompt(const json& object, const std::string& file, PromptSpec& prompt) {
  if (!object.is_object()) return invalid_argument(file + ": prompt must be an object");
  FieldReader r(object, "prompt", file);
  const json* vocabulary = r.child("vocabulary");
  if (vocabulary == nullptr) return invalid_argument(r.where("vocabulary") + " is required but missing");
  if (!vocabulary->is_array() || vocabulary->empty()) {
    return invalid_argument(r.where("vocabulary") + " must be a non-empty array of words");
  }
  std::set<std::string> seen;
  for (const auto& item : *vocabulary) {
    if (!item.is_string()) return invalid_argument(r.where("vocabulary") + " holds " + item.dump() + ", expected a word");
    const std::string word = item.get<std::string>();
    if (word.empty() || word.find_first_of(" ,\t\n") != std::string::npos) {
      return invalid_argument(r.where("vocabulary") + " word \"" + word + "\" must be non-empty without spaces or commas");
    }
    for (char c : word) {
      if (c >= 'A' && c <= 'Z') return invalid_argument(r.where("vocabulary") + " word \"" + word + "\" must be lower case");
    }
    if (!seen.insert(word).second) return invalid_argument(r.where("vocabulary") + " lists \"" + word + "\" twice");
    prompt.vocabulary.push_back(word);
  }
  return r.check_unknown();
}

Status parse_sampler(const json& object, const std::string& file, SamplerDefaults& s, double& guidance) {
  if (!object.is_object()) return invalid_argument(file + ": sampler must be an object");
  FieldReader r(object, "sampler", file);
  INFILL_RETURN_IF_ERROR(r.read("default", s.sampler, false));
  INFILL_RETURN_IF_ERROR(r.read("steps", s.steps, false));
  INFILL_RETURN_IF_ERROR(r.read("shift", s.shift, false));
  INFILL_RETURN_IF_ERROR(r.read("guidance", guidance, false));
  INFILL_RETURN_IF_ERROR(r.check_unknown());
  if (s.steps < 1 || s.steps > 1000) return invalid_argument(r.where("steps") + " must be in [1, 1000]");
  if (s.shift <= 0) return invalid_argument(r.where("shift") + " must be positive");
  if (!(guidance >= 1.0 && guidance <= 20.0)) return invalid_argument(r.where("guidance") + " must be in [1, 20]");
  return {};
}

const char* input_name(DitInput input) {
  switch (input) {
    case DitInput::kNoisyLatent: return "noisy_latent";
    case DitInput::kMaskedLatent: return "masked_latent";
    case DitInput::kMask: return "mask";
  }
  return "?";
}

}  // namespace

int DitConfig::in_channels() const {
  int channels = 0;
  for (DitInput input : inputs) channels += input == DitInput::kMask ? 1 : latent_channels;
  return channels;
}

Status DitConfig::validate() const {
  if (hidden_size <= 0 || depth <= 0 || num_heads <= 0 || patch_size <= 0 || latent_channels <= 0) {
    return invalid_argument("dit: hidden_size, depth, num_heads, patch_size and latent_channels must be positive");
  }
  if (hidden_size % num_heads != 0) {
    return invalid_argument("dit.hidden_size " + std::to_string(hidden_size) + " is not divisible by num_heads " +
                            std::to_string(num_heads));
  }
  if (hidden_size % 4 != 0) return invalid_argument("dit.hidden_size must be a multiple of 4 (2D sin-cos positions)");
  if (mlp_ratio <= 0) return invalid_argument("dit.mlp_ratio must be positive");
  if (frequency_embedding_size <= 0 || frequency_embedding_size % 2 != 0) {
    return invalid_argument("dit.frequency_embedding_size must be a positive even number");
  }
  if (conditioning == ConditioningType::kClass && num_classes <= 0) {
    return invalid_argument("dit.num_classes must be positive when conditioning is \"class\"");
  }
  if (conditioning == ConditioningType::kVector && conditioning_dim <= 0) {
    return invalid_argument("dit.conditioning_dim must be positive when conditioning is \"vector\"");
  }
  return {};
}

std::string ModelManifest::resolve(const std::string& relative) const {
  std::filesystem::path p(relative);
  return p.is_absolute() ? p.string() : (std::filesystem::path(folder) / p).string();
}

Result<ModelManifest> parse_manifest(const std::string& json_text, const std::string& folder,
                                     const std::string& name_for_errors) {
  json root = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return invalid_argument(name_for_errors + " is not valid JSON");
  if (!root.is_object()) return invalid_argument(name_for_errors + " must hold a JSON object");
  ModelManifest m;
  m.folder = folder;
  FieldReader r(root, "", name_for_errors);
  std::string format;
  INFILL_RETURN_IF_ERROR(r.read("format", format, true));
  if (format != kFormat) {
    return invalid_argument(r.where("format") + " is \"" + format + "\", expected \"" + kFormat + "\"");
  }
  INFILL_RETURN_IF_ERROR(r.read("name", m.name, true));
  INFILL_RETURN_IF_ERROR(r.read("description", m.description, false));
  INFILL_RETURN_IF_ERROR(r.read("max_image_pixels", m.max_image_pixels, false));
  const json* dit = r.child("dit");
  if (dit == nullptr) return invalid_argument(r.where("dit") + " is required but missing");
  INFILL_RETURN_IF_ERROR(parse_dit(*dit, name_for_errors, m.dit));
  if (const json* ae = r.child("autoencoder")) {
    m.has_autoencoder = true;
    INFILL_RETURN_IF_ERROR(parse_autoencoder(*ae, name_for_errors, m.autoencoder));
    if (m.autoencoder.latent_channels != m.dit.latent_channels) {
      return invalid_argument(name_for_errors + ": autoencoder.latent_channels is " +
                              std::to_string(m.autoencoder.latent_channels) + ", dit.latent_channels is " +
                              std::to_string(m.dit.latent_channels));
    }
  }
  if (const json* sampler = r.child("sampler")) {
    INFILL_RETURN_IF_ERROR(parse_sampler(*sampler, name_for_errors, m.sampler, m.default_guidance));
  }
  if (const json* prompt = r.child("prompt")) {
    m.has_prompt = true;
    INFILL_RETURN_IF_ERROR(parse_prompt(*prompt, name_for_errors, m.prompt));
    if (m.dit.conditioning != ConditioningType::kVector ||
        m.dit.conditioning_dim != static_cast<int>(m.prompt.vocabulary.size())) {
      return invalid_argument(name_for_errors + ": prompt.vocabulary has " + std::to_string(m.prompt.vocabulary.size()) +
                              " words; it needs dit.conditioning \"vector\" with conditioning_dim equal to that");
    }
  }
  INFILL_RETURN_IF_ERROR(r.check_unknown());
  if (m.max_image_pixels <= 0) return invalid_argument(r.where("max_image_pixels") + " must be positive");
  return m;
}

Result<ModelManifest> load_manifest(const std::string& path) {
  std::filesystem::path p(path);
  std::error_code ec;
  if (std::filesystem::is_directory(p, ec)) p /= "manifest.json";
  std::ifstream in(p, std::ios::binary);
  if (!in) return not_found("model manifest " + p.string() + " cannot be opened");
  std::stringstream text;
  text << in.rdbuf();
  const std::string folder = std::filesystem::absolute(p, ec).parent_path().string();
  return parse_manifest(text.str(), folder, p.string());
}

std::string manifest_to_json(const ModelManifest& m) {
  json dit = {{"weights", m.dit.weights},
              {"hidden_size", m.dit.hidden_size},
              {"depth", m.dit.depth},
              {"num_heads", m.dit.num_heads},
              {"patch_size", m.dit.patch_size},
              {"mlp_ratio", m.dit.mlp_ratio},
              {"latent_channels", m.dit.latent_channels},
              {"learn_sigma", m.dit.learn_sigma},
              {"frequency_embedding_size", m.dit.frequency_embedding_size}};
  if (!m.dit.key_prefix.empty()) dit["key_prefix"] = m.dit.key_prefix;
  json inputs = json::array();
  for (DitInput input : m.dit.inputs) inputs.push_back(input_name(input));
  dit["inputs"] = inputs;
  switch (m.dit.conditioning) {
    case ConditioningType::kNone: dit["conditioning"] = "none"; break;
    case ConditioningType::kClass:
      dit["conditioning"] = "class";
      dit["num_classes"] = m.dit.num_classes;
      break;
    case ConditioningType::kVector:
      dit["conditioning"] = "vector";
      dit["conditioning_dim"] = m.dit.conditioning_dim;
      break;
  }
  dit["prompt_scope"] = m.dit.prompt_scope == PromptScope::kGlobal ? "global" : "masked_tokens";
  dit["prediction"] = m.dit.prediction == PredictionType::kFlow ? "flow" : "epsilon";
  json root = {{"format", kFormat}, {"name", m.name}, {"max_image_pixels", m.max_image_pixels}, {"dit", dit}};
  if (!m.description.empty()) root["description"] = m.description;
  if (m.has_prompt) root["prompt"] = {{"vocabulary", m.prompt.vocabulary}};
  if (m.has_autoencoder) {
    root["autoencoder"] = {{"type", m.autoencoder.type},       {"encoder", m.autoencoder.encoder},
                           {"decoder", m.autoencoder.decoder}, {"latent_channels", m.autoencoder.latent_channels},
                           {"factor", m.autoencoder.factor},   {"scale", m.autoencoder.scale},
                           {"shift", m.autoencoder.shift}};
  }
  root["sampler"] = {{"default", m.sampler.sampler}, {"steps", m.sampler.steps}, {"shift", m.sampler.shift},
                     {"guidance", m.default_guidance}};
  return root.dump(2) + "\n";
}

}  // namespace infill
