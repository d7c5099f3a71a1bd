#include "model/flux2_checkpoint.h"

#include <optional>
#include <set>

#include <ATen/ATen.h>

#include "common/shape_text.h"
#include "model/float8_checkpoint.h"
#include "model/flux2_weight_names.h"

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

Result<Flux2Checkpoint> Flux2Checkpoint::from_file(const SafetensorsFile& file, const std::string& prefix) {
  Flux2Checkpoint c;
  c.files_.push_back(file);
  c.where_ = file.path();
  INFILL_ASSIGN_OR_RETURN(Float8Layout layout, read_float8_layout(c.files_));
  c.float8_ = std::make_shared<const Float8Layout>(std::move(layout));
  auto sources = std::make_shared<std::map<std::string, Source>>();
  for (const TensorInfo& t : file.tensors()) {
    if (t.name.rfind(prefix, 0) != 0 || c.float8_->companions.count(t.name)) continue;
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
  // FP8 checkpoints: scales and format records describe weights and are not weights.
  INFILL_ASSIGN_OR_RETURN(Float8Layout layout, read_float8_layout(c.files_));
  for (const std::string& name : layout.companions) stored.erase(name);
  c.float8_ = std::make_shared<const Float8Layout>(std::move(layout));
  c.where_ = paths[0] + (paths.size() > 1 ? " (+" + std::to_string(paths.size() - 1) + " shards)" : "");

  // Which naming, and under which prefix: the first name ending in an anchor with blocks
  // beside it.
  std::optional<std::string> upstream_prefix, diffusers_prefix;
  for (const auto& [name, _] : stored) {
    if (!upstream_prefix && name.ends_with("img_in.weight")) {
      const std::string p = name.substr(0, name.size() - std::string("img_in.weight").size());
      if (stored.count(p + "double_blocks.0.img_attn.qkv.weight") || stored.count(p + "single_blocks.0.linear1.weight")) {
        upstream_prefix = p;
      }
    }
    if (!diffusers_prefix && name.ends_with("x_embedder.weight")) {
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
    // q/k/v triples, collected by upstream weight before they are fused.
    std::map<std::string, std::map<char, std::string>> triples;
    for (const auto& [name, where] : stored) {
      if (name.rfind(*diffusers_prefix, 0) != 0) continue;
      const std::optional<UpstreamWeight> upstream = upstream_weight_of_diffusers(name.substr(diffusers_prefix->size()));
      if (!upstream) {
        return invalid_argument(paths[where.first] + ": tensor " + name +
                                " is not part of a diffusers Flux2Transformer2DModel");
      }
      switch (upstream->part) {
        case UpstreamWeight::Part::kQ: triples[upstream->name]['q'] = name; continue;
        case UpstreamWeight::Part::kK: triples[upstream->name]['k'] = name; continue;
        case UpstreamWeight::Part::kV: triples[upstream->name]['v'] = name; continue;
        case UpstreamWeight::Part::kSwappedHalves:
          (*sources)[upstream->name] = Source{Source::Kind::kSwappedHalves, {{where.first, name}}};
          break;
        case UpstreamWeight::Part::kWhole:
          (*sources)[upstream->name] = Source{Source::Kind::kDirect, {{where.first, name}}};
          break;
      }
      c.shapes_[upstream->name] = where.second->shape;
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

std::vector<std::string> Flux2Checkpoint::stored_dtypes() const {
  std::set<std::string> names;
  for (const auto& [_, src] : *sources_) {
    for (const auto& [file, name] : src.parts) names.insert(dtype_name(files_[file].find(name)->dtype));
  }
  return {names.begin(), names.end()};
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
      INFILL_ASSIGN_OR_RETURN(at::Tensor t, load_weight_tensor(files_, file, name, part_shape, *float8_));
      parts.push_back(t);
    }
    return at::cat(parts, 0);
  }
  const auto& [file, name] = src.parts[0];
  INFILL_ASSIGN_OR_RETURN(at::Tensor t, load_weight_tensor(files_, file, name, expected_shape, *float8_));
  if (src.kind == Source::Kind::kSwappedHalves) {
    const auto halves = t.chunk(2, 0);
    return at::cat({halves[1], halves[0]}, 0);
  }
  return t;
}

Result<at::Tensor> Flux2Checkpoint::float8_row_scales(const std::string& upstream_name) const {
  const auto it = sources_->find(upstream_name);
  if (it == sources_->end()) return not_found(where_ + ": weight " + upstream_name + " is missing");
  std::vector<at::Tensor> parts;
  for (const auto& [file, name] : it->second.parts) {
    INFILL_ASSIGN_OR_RETURN(at::Tensor scales, float8_e4m3_row_scales(files_, file, name, *float8_));
    if (!scales.defined()) return at::Tensor();
    parts.push_back(std::move(scales));
  }
  at::Tensor scales = at::cat(parts, 0);  // q, k, v rows in the order read fuses them
  if (it->second.kind == Source::Kind::kSwappedHalves) {
    const auto halves = scales.chunk(2, 0);
    return at::cat({halves[1], halves[0]}, 0);
  }
  return scales;
}

}  // namespace infill
