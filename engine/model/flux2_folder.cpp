#include "model/flux2_folder.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "model/safetensors.h"
#include "model/safetensors_shards.h"

namespace infill {

namespace fs = std::filesystem;

namespace {

Result<nlohmann::json> read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return not_found(path.string() + " is missing");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    return corrupt_data(path.string() + " is not valid JSON: " + e.what());
  }
}

Status require_file(const fs::path& path, const std::string& what) {
  if (fs::is_regular_file(path)) return {};
  return not_found(path.string() + " is missing (expected " + what + ")");
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

void set_defaults(Flux2Folder& folder) {
  folder.default_steps = folder.distilled ? 4 : 50;
  folder.default_guidance = folder.distilled ? 1.0 : 4.0;
}

bool name_says_distilled(const std::string& name) {
  const std::string n = lower(name);
  return n.find("klein") != std::string::npos && n.find("base") == std::string::npos;
}

// model_index.json's "infill" object (the bundled model's settings), when present.
Status read_infill_settings(const nlohmann::json& index, const std::string& index_path, Flux2Folder& f) {
  if (!index.contains("infill")) return {};
  const nlohmann::json& s = index["infill"];
  const auto bad = [&](const std::string& field, const std::string& expected) {
    return invalid_argument(index_path + ": \"infill\"." + field + " is " + (s.contains(field) ? s[field].dump() : "missing") +
                            ", expected " + expected);
  };
  if (!s.is_object()) return invalid_argument(index_path + ": \"infill\" is not an object");
  if (s.contains("max_sequence_length")) {
    if (!s["max_sequence_length"].is_number_integer() || s["max_sequence_length"].get<int>() < 1 ||
        s["max_sequence_length"].get<int>() > 4096) {
      return bad("max_sequence_length", "an integer in 1..4096");
    }
    f.max_sequence_length = s["max_sequence_length"].get<int>();
  }
  if (s.contains("default_steps")) {
    if (!s["default_steps"].is_number_integer() || s["default_steps"].get<int>() < 1 || s["default_steps"].get<int>() > 1000) {
      return bad("default_steps", "an integer in 1..1000");
    }
    f.default_steps = s["default_steps"].get<int>();
  }
  if (s.contains("default_guidance")) {
    if (!s["default_guidance"].is_number() || s["default_guidance"].get<double>() < 0 || s["default_guidance"].get<double>() > 20) {
      return bad("default_guidance", "a number in [0, 20]");
    }
    f.default_guidance = s["default_guidance"].get<double>();
  }
  if (s.contains("description")) {
    if (!s["description"].is_string()) return bad("description", "a string");
    f.description = s["description"].get<std::string>();
  }
  return {};
}

Result<Flux2Folder> diffusers_folder(const fs::path& root) {
  Flux2Folder f;
  f.layout = Flux2Folder::Layout::kDiffusers;
  f.root = root.string();
  f.name = root.filename().string();
  INFILL_ASSIGN_OR_RETURN(nlohmann::json index, read_json(root / "model_index.json"));
  const std::string index_path = (root / "model_index.json").string();
  if (!index.is_object() || !index.contains("_class_name") || !index["_class_name"].is_string()) {
    return corrupt_data(index_path + " has no \"_class_name\"; expected a diffusers pipeline such as Flux2KleinPipeline");
  }
  f.pipeline_class = index["_class_name"].get<std::string>();
  if (f.pipeline_class.rfind("Flux2", 0) != 0) {
    return invalid_argument(index_path + ": pipeline " + f.pipeline_class +
                            " is not a FLUX.2 pipeline (expected Flux2KleinPipeline or Flux2Pipeline)");
  }
  for (const char* component : {"transformer", "vae", "text_encoder", "tokenizer"}) {
    if (!index.contains(component)) {
      return corrupt_data(index_path + " lists no \"" + std::string(component) + "\" component");
    }
  }
  INFILL_ASSIGN_OR_RETURN(f.transformer_files, safetensors_shards((root / "transformer").string(), "diffusion_pytorch_model"));
  const nlohmann::json& vae_entry = index["vae"];
  if (vae_entry.is_array() && vae_entry.size() == 2 && vae_entry[0] == "infill") {
    if (vae_entry[1] != "LearnedDecoderCodec") {
      return invalid_argument(index_path + ": \"vae\" names codec " + vae_entry[1].dump() +
                              ", expected [\"infill\", \"LearnedDecoderCodec\"] or a diffusers autoencoder");
    }
    f.codec_class = "LearnedDecoderCodec";
    f.autoencoder_file = (root / "vae" / "codec.safetensors").string();
    INFILL_RETURN_IF_ERROR(require_file(f.autoencoder_file, "the bundled model's codec"));
  } else {
    INFILL_ASSIGN_OR_RETURN(auto vae, safetensors_shards((root / "vae").string(), "diffusion_pytorch_model"));
    if (vae.size() != 1) return invalid_argument((root / "vae").string() + ": a sharded autoencoder is not supported");
    f.autoencoder_file = vae[0];
    f.autoencoder_diffusers_names = true;
  }
  f.text_encoder_dir = (root / "text_encoder").string();
  INFILL_RETURN_IF_ERROR(require_file(root / "text_encoder" / "config.json", "the text encoder's configuration"));
  INFILL_RETURN_IF_ERROR(safetensors_shards((root / "text_encoder").string(), "model").status());
  f.tokenizer_dir = (root / "tokenizer").string();
  INFILL_RETURN_IF_ERROR(require_file(root / "tokenizer" / "tokenizer.json", "the tokenizer's vocabulary and merges"));
  if (index.contains("is_distilled")) {
    if (!index["is_distilled"].is_boolean()) return corrupt_data(index_path + ": \"is_distilled\" is not true or false");
    f.distilled = index["is_distilled"].get<bool>();
  } else {
    // Base klein checkpoints omit the field; dev is never distilled.
    f.distilled = false;
  }
  set_defaults(f);
  INFILL_RETURN_IF_ERROR(read_infill_settings(index, index_path, f));
  return f;
}

// True when `path` holds a FLUX.2 transformer (its header is enough): upstream names
// (img_in.weight), or diffusers' in one file (x_embedder.weight), as some FP8 files are.
bool is_transformer_file(const fs::path& path) {
  auto file = SafetensorsFile::open(path.string());
  if (!file.ok()) return false;
  for (const TensorInfo& t : file->tensors()) {
    if (t.name.ends_with("img_in.weight") || t.name.ends_with("x_embedder.weight")) return true;
  }
  return false;
}

Result<Flux2Folder> single_file_folder(const fs::path& root, const fs::path& transformer) {
  Flux2Folder f;
  f.layout = Flux2Folder::Layout::kSingleFile;
  f.root = root.string();
  f.name = transformer.stem().string();
  f.transformer_files = {transformer.string()};
  // The autoencoder as BFL ships it (ae.safetensors) or as ComfyUI users rename it.
  for (const char* name : {"ae.safetensors", "flux2-vae.safetensors", "flux2_ae.safetensors"}) {
    if (fs::is_regular_file(root / name)) {
      f.autoencoder_file = (root / name).string();
      break;
    }
  }
  if (f.autoencoder_file.empty()) {
    return not_found((root / "ae.safetensors").string() + " is missing (expected the FLUX.2 autoencoder beside " +
                     transformer.filename().string() + ")");
  }
  if (fs::is_directory(root / "text_encoder")) {
    INFILL_RETURN_IF_ERROR(require_file(root / "text_encoder" / "config.json", "the text encoder's configuration"));
    INFILL_RETURN_IF_ERROR(safetensors_shards((root / "text_encoder").string(), "model").status());
    f.text_encoder_dir = (root / "text_encoder").string();
  }
  if (fs::is_directory(root / "tokenizer")) {
    INFILL_RETURN_IF_ERROR(require_file(root / "tokenizer" / "tokenizer.json", "the tokenizer's vocabulary and merges"));
    f.tokenizer_dir = (root / "tokenizer").string();
  }
  f.distilled = name_says_distilled(f.name) || name_says_distilled(root.filename().string());
  set_defaults(f);
  return f;
}

}  // namespace

const char* flux2_layout_name(Flux2Folder::Layout layout) {
  return layout == Flux2Folder::Layout::kDiffusers ? "diffusers" : "single_file";
}

Result<Flux2Folder> find_flux2_folder(const std::string& path) {
  const fs::path p = fs::absolute(path).lexically_normal();
  if (fs::is_regular_file(p)) {
    if (!is_transformer_file(p)) {
      return invalid_argument(p.string() +
                              " is not a FLUX.2 transformer file (neither img_in.weight nor x_embedder.weight in its header)");
    }
    return single_file_folder(p.parent_path(), p);
  }
  if (!fs::is_directory(p)) return not_found(p.string() + " does not exist");
  if (fs::exists(p / "model_index.json")) return diffusers_folder(p);
  std::vector<fs::path> candidates;
  for (const auto& entry : fs::directory_iterator(p)) {
    if (entry.is_regular_file() && entry.path().extension() == ".safetensors" && is_transformer_file(entry.path())) {
      candidates.push_back(entry.path());
    }
  }
  std::sort(candidates.begin(), candidates.end());
  if (candidates.empty()) {
    return not_found(p.string() + " holds neither model_index.json (diffusers layout) nor a FLUX.2 transformer "
                     ".safetensors file with ae.safetensors (single-file layout)");
  }
  if (candidates.size() > 1) {
    return invalid_argument(p.string() + " holds " + std::to_string(candidates.size()) + " transformer files (" +
                            candidates[0].filename().string() + ", " + candidates[1].filename().string() +
                            "); give the one to load");
  }
  return single_file_folder(p, candidates[0]);
}

}  // namespace infill
