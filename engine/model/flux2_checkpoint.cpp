#include "model/flux2_checkpoint.h"

#include <optional>
#include <regex>

#include <ATen/ATen.h>

#include "common/shape_text.h"
#include "model/safetensors_torch.h"

namespace infill {

struct Flux2Checkpoint::Source {
  enum class Kind {
    kDirect = 1,         // one stored tensor
    kFusedQkv = 2,       // diffusers' q, k, v concatenated along the output rows
    kSwappedHalves = 3,  // diffusers' (scale, shift) -> upstream's (shift, scale)
  };
  Kind kind = Kind::kDirect;
  std::vector<std::pair<size_t, std::string>> parts;  // (file index, stored name)
};

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Renames of diffusers' conversion, inverted: diffusers name (without prefix) -> upstream.
// Block-level names carry the block index in a capture group.
struct Rename {
  std::regex pattern;
  std::string upstream;  // "$1" is the block index
};

const std::vector<Rename>& diffusers_renames() {
  static const std::vector<Rename> renames = [] {
    std::vector<std::pair<std::string, std::string>> table = {
        {R"(x_embedder\.weight)", "img_in.weight"},
        {R"(context_embedder\.weight)", "txt_in.weight"},
        {R"(time_guidance_embed\.timestep_embedder\.linear_1\.weight)", "time_in.in_layer.weight"},
        {R"(time_guidance_embed\.timestep_embedder\.linear_2\.weight)", "time_in.out_layer.weight"},
        {R"(time_guidance_embed\.guidance_embedder\.linear_1\.weight)", "guidance_in.in_layer.weight"},
        {R"(time_guidance_embed\.guidance_embedder\.linear_2\.weight)", "guidance_in.out_layer.weight"},
        {R"(double_stream_modulation_img\.linear\.weight)", "double_stream_modulation_img.lin.weight"},
        {R"(double_stream_modulation_txt\.linear\.weight)", "double_stream_modulation_txt.lin.weight"},
        {R"(single_stream_modulation\.linear\.weight)", "single_stream_modulation.lin.weight"},
        {R"(proj_out\.weight)", "final_layer.linear.weight"},
        {R"(transformer_blocks\.(\d+)\.attn\.norm_q\.weight)", "double_blocks.$1.img_attn.norm.query_norm.scale"},
        {R"(transformer_blocks\.(\d+)\.attn\.norm_k\.weight)", "double_blocks.$1.img_attn.norm.key_norm.scale"},
        {R"(transformer_blocks\.(\d+)\.attn\.to_out\.0\.weight)", "double_blocks.$1.img_attn.proj.weight"},
        {R"(transformer_blocks\.(\d+)\.ff\.linear_in\.weight)", "double_blocks.$1.img_mlp.0.weight"},
        {R"(transformer_blocks\.(\d+)\.ff\.linear_out\.weight)", "double_blocks.$1.img_mlp.2.weight"},
        {R"(transformer_blocks\.(\d+)\.attn\.norm_added_q\.weight)", "double_blocks.$1.txt_attn.norm.query_norm.scale"},
        {R"(transformer_blocks\.(\d+)\.attn\.norm_added_k\.weight)", "double_blocks.$1.txt_attn.norm.key_norm.scale"},
        {R"(transformer_blocks\.(\d+)\.attn\.to_add_out\.weight)", "double_blocks.$1.txt_attn.proj.weight"},
        {R"(transformer_blocks\.(\d+)\.ff_context\.linear_in\.weight)", "double_blocks.$1.txt_mlp.0.weight"},
        {R"(transformer_blocks\.(\d+)\.ff_context\.linear_out\.weight)", "double_blocks.$1.txt_mlp.2.weight"},
        {R"(single_transformer_blocks\.(\d+)\.attn\.to_qkv_mlp_proj\.weight)", "single_blocks.$1.linear1.weight"},
        {R"(single_transformer_blocks\.(\d+)\.attn\.to_out\.weight)", "single_blocks.$1.linear2.weight"},
        {R"(single_transformer_blocks\.(\d+)\.attn\.norm_q\.weight)", "single_blocks.$1.norm.query_norm.scale"},
        {R"(single_transformer_blocks\.(\d+)\.attn\.norm_k\.weight)", "single_blocks.$1.norm.key_norm.scale"},
    };
    std::vector<Rename> out;
    for (auto& [from, to] : table) out.push_back({std::regex(from), to});
    return out;
  }();
  return renames;
}

// diffusers' split q/k/v of double block N: image stream to_{q,k,v}, text stream
// add_{q,k,v}_proj.
const std::regex kImageQkv(R"(transformer_blocks\.(\d+)\.attn\.to_([qkv])\.weight)");
const std::regex kTextQkv(R"(transformer_blocks\.(\d+)\.attn\.add_([qkv])_proj\.weight)");

}  // namespace

Result<Flux2Checkpoint> Flux2Checkpoint::from_file(const SafetensorsFile& file, const std::string& prefix) {
  Flux2Checkpoint c;
  c.files_.push_back(file);
  c.where_ = file.path();
  auto sources = std::make_shared<std::map<std::string, Source>>();
  for (const TensorInfo& t : file.tensors()) {
    if (t.name.rfind(prefix, 0) != 0) continue;
    const std::string name = t.name.substr(prefix.size());
    (*sources)[name] = Source{Source::Kind::kDirect, {{0, t.name}}};
    c.shapes_[name] = t.shape;
  }
  c.sources_ = std::move(sources);
  return c;
}

Result<Flux2Checkpoint> Flux2Checkpoint::open(const std::vector<std::string>& paths) {
  if (paths.empty()) return invalid_argument("FLUX.2 transformer: no weight files given");
  Flux2Checkpoint c;
  // Every stored name -> (file, info), across shards.
  std::map<std::string, std::pair<size_t, const TensorInfo*>> stored;
  for (const std::string& path : paths) {
    INFILL_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(path));
    c.files_.push_back(std::move(file));
  }
  for (size_t f = 0; f < c.files_.size(); ++f) {
    for (const TensorInfo& t : c.files_[f].tensors()) {
      if (!stored.emplace(t.name, std::pair{f, &t}).second) {
        return invalid_argument(paths[f] + ": tensor " + t.name + " is also in another shard");
      }
    }
  }
  c.where_ = paths[0] + (paths.size() > 1 ? " (+" + std::to_string(paths.size() - 1) + " shards)" : "");

  // Which naming, and under which prefix: the first name ending in an anchor with blocks
  // beside it.
  std::optional<std::string> upstream_prefix, diffusers_prefix;
  for (const auto& [name, _] : stored) {
    if (!upstream_prefix && ends_with(name, "img_in.weight")) {
      const std::string p = name.substr(0, name.size() - std::string("img_in.weight").size());
      if (stored.count(p + "double_blocks.0.img_attn.qkv.weight") || stored.count(p + "single_blocks.0.linear1.weight")) {
        upstream_prefix = p;
      }
    }
    if (!diffusers_prefix && ends_with(name, "x_embedder.weight")) {
      const std::string p = name.substr(0, name.size() - std::string("x_embedder.weight").size());
      if (stored.count(p + "transformer_blocks.0.attn.to_q.weight") ||
          stored.count(p + "single_transformer_blocks.0.attn.to_qkv_mlp_proj.weight")) {
        diffusers_prefix = p;
      }
    }
  }
  auto sources = std::make_shared<std::map<std::string, Source>>();
  if (upstream_prefix) {
    c.naming_ = Naming::kUpstream;
    for (const auto& [name, where] : stored) {
      if (name.rfind(*upstream_prefix, 0) != 0) continue;
      const std::string upstream = name.substr(upstream_prefix->size());
      (*sources)[upstream] = Source{Source::Kind::kDirect, {{where.first, name}}};
      c.shapes_[upstream] = where.second->shape;
    }
  } else if (diffusers_prefix) {
    c.naming_ = Naming::kDiffusers;
    // q/k/v triples, collected by (stream, block) before they are fused.
    std::map<std::string, std::map<char, std::string>> triples;
    for (const auto& [name, where] : stored) {
      if (name.rfind(*diffusers_prefix, 0) != 0) continue;
      const std::string key = name.substr(diffusers_prefix->size());
      std::smatch m;
      if (std::regex_match(key, m, kImageQkv)) {
        triples["double_blocks." + m[1].str() + ".img_attn.qkv.weight"][m[2].str()[0]] = name;
        continue;
      }
      if (std::regex_match(key, m, kTextQkv)) {
        triples["double_blocks." + m[1].str() + ".txt_attn.qkv.weight"][m[2].str()[0]] = name;
        continue;
      }
      if (key == "norm_out.linear.weight") {
        (*sources)["final_layer.adaLN_modulation.1.weight"] = Source{Source::Kind::kSwappedHalves, {{where.first, name}}};
        c.shapes_["final_layer.adaLN_modulation.1.weight"] = where.second->shape;
        continue;
      }
      bool renamed = false;
      for (const Rename& r : diffusers_renames()) {
        if (std::regex_match(key, m, r.pattern)) {
          const std::string upstream = m.format(r.upstream);
          (*sources)[upstream] = Source{Source::Kind::kDirect, {{where.first, name}}};
          c.shapes_[upstream] = where.second->shape;
          renamed = true;
          break;
        }
      }
      if (!renamed) {
        return invalid_argument(paths[where.first] + ": tensor " + name +
                                " is not part of a diffusers Flux2Transformer2DModel");
      }
    }
    for (auto& [upstream, parts] : triples) {
      Source src{Source::Kind::kFusedQkv, {}};
      std::vector<int64_t> shape;
      for (char which : {'q', 'k', 'v'}) {
        const auto it = parts.find(which);
        if (it == parts.end()) {
          return not_found(c.where_ + ": the " + std::string(1, which) + " projection of " + upstream +
                           " is missing (diffusers stores q, k and v apart)");
        }
        const auto& [file, info] = stored.at(it->second);
        if (shape.empty()) {
          shape = info->shape;
        } else if (info->shape != shape) {
          return invalid_argument(paths[file] + ": " + it->second + " is " + shape_text(info->shape) + ", expected " +
                                  shape_text(shape) + " like its q projection");
        }
        src.parts.emplace_back(file, it->second);
      }
      if (shape.size() == 2) shape[0] *= 3;
      (*sources)[upstream] = std::move(src);
      c.shapes_[upstream] = shape;
    }
  } else {
    return not_found(c.where_ + ": not a FLUX.2 transformer (neither img_in.weight with double_blocks/single_blocks "
                     "nor diffusers' x_embedder.weight with transformer_blocks)");
  }
  c.sources_ = std::move(sources);
  return c;
}

Result<at::Tensor> Flux2Checkpoint::read(const std::string& upstream_name,
                                         const std::vector<int64_t>& expected_shape) const {
  const auto it = sources_->find(upstream_name);
  if (it == sources_->end()) {
    return not_found(where_ + ": weight " + upstream_name + " is missing" +
                     (expected_shape.empty() ? "" : " (expected shape " + shape_text(expected_shape) + ")"));
  }
  const Source& src = it->second;
  if (src.kind == Source::Kind::kFusedQkv) {
    std::vector<int64_t> part_shape = expected_shape;
    if (part_shape.size() == 2) part_shape[0] /= 3;
    std::vector<at::Tensor> parts;
    for (const auto& [file, name] : src.parts) {
      INFILL_ASSIGN_OR_RETURN(at::Tensor t, load_stored_tensor(files_[file], name, part_shape));
      parts.push_back(t);
    }
    return at::cat(parts, 0);
  }
  const auto& [file, name] = src.parts[0];
  INFILL_ASSIGN_OR_RETURN(at::Tensor t, load_stored_tensor(files_[file], name, expected_shape));
  if (src.kind == Source::Kind::kSwappedHalves) {
    const auto halves = t.chunk(2, 0);
    return at::cat({halves[1], halves[0]}, 0);
  }
  return t;
}

}  // namespace infill
