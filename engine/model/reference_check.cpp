#include "model/reference_check.h"

#include <algorithm>
#include <filesystem>
#include <limits>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>

#include "model/flux2_autoencoder.h"
#include "model/flux2_checkpoint.h"
#include "model/flux2_transformer.h"
#include "model/lora_adapter.h"
#include "model/safetensors.h"
#include "model/safetensors_torch.h"

namespace infill {

namespace {

constexpr const char* kWeightsPrefix = "weights.";

ReferenceComparison compare(const std::string& name, const at::Tensor& ours, const at::Tensor& reference) {
  ReferenceComparison c;
  c.name = name;
  if (ours.sizes() != reference.sizes()) {
    // A shape mismatch is a failed comparison, not an error: report it as infinitely wrong.
    c.max_abs_err = c.max_rel_err = std::numeric_limits<double>::infinity();
    return c;
  }
  c.max_abs_err = (ours.to(at::kFloat) - reference).abs().max().item<double>();
  const double scale = reference.abs().max().item<double>();
  c.max_rel_err = scale > 0 ? c.max_abs_err / scale : c.max_abs_err;
  return c;
}

Result<at::Tensor> required(const SafetensorsFile& file, const std::string& name) {
  if (file.find(name) == nullptr) {
    return not_found(file.path() + ": the reference call needs tensor '" + name + "', which is missing");
  }
  return load_float_tensor(file, name);
}

// The LoRAs named in the file's "loras" metadata (JSON list of {"file", "strength", ...}),
// read from the reference file's folder, in the order applied.
Result<AdapterSet> recorded_loras(const SafetensorsFile& file, const Flux2Config& config) {
  AdapterSet set;
  const auto it = file.metadata().find("loras");
  if (it == file.metadata().end()) return set;
  const nlohmann::json list = nlohmann::json::parse(it->second, nullptr, false);
  if (!list.is_array()) return invalid_argument(file.path() + ": metadata \"loras\" is not a JSON list");
  const std::filesystem::path folder = std::filesystem::path(file.path()).parent_path();
  for (const nlohmann::json& entry : list) {
    if (!entry.is_object() || !entry.contains("file") || !entry["file"].is_string()) {
      return invalid_argument(file.path() + ": an entry of metadata \"loras\" has no \"file\"");
    }
    const double strength = entry.contains("strength") && entry["strength"].is_number() ? entry["strength"].get<double>() : 1.0;
    INFILL_ASSIGN_OR_RETURN(auto adapter, load_lora((folder / entry["file"].get<std::string>()).string(), config,
                                                    "the reference file's transformer"));
    set.push_back({std::move(adapter), strength});
  }
  return set;
}

Status check_transformer(const SafetensorsFile& file, ReferenceCheck& check, const ReferenceCheckOptions& options) {
  INFILL_ASSIGN_OR_RETURN(Flux2Transformer model, Flux2Transformer::load(file, kWeightsPrefix));
  INFILL_ASSIGN_OR_RETURN(AdapterSet loras, recorded_loras(file, model.config()));
  if (options.float8) {
    // As the engine loads them (Flux2Transformer::to_device_float8).
    if (!options.bfloat16) return invalid_argument(file.path() + ": FP8 weights are checked with bf16 compute");
    INFILL_RETURN_IF_ERROR(model.to_device_float8(options.device));
  } else if (options.device.cuda) {
    INFILL_RETURN_IF_ERROR(model.to_device(options.device, options.bfloat16 ? at::kBFloat16 : at::kFloat));
  }
  if (options.fused_norms) {
    INFILL_ASSIGN_OR_RETURN(Flux2Transformer fused, model.with_fused_norms());
    model = std::move(fused);
  }
  INFILL_ASSIGN_OR_RETURN(at::Tensor x, required(file, "input.x"));
  INFILL_ASSIGN_OR_RETURN(at::Tensor x_ids, required(file, "input.x_ids"));
  INFILL_ASSIGN_OR_RETURN(at::Tensor ctx, required(file, "input.ctx"));
  INFILL_ASSIGN_OR_RETURN(at::Tensor ctx_ids, required(file, "input.ctx_ids"));
  INFILL_ASSIGN_OR_RETURN(at::Tensor timestep, required(file, "input.timestep"));
  INFILL_ASSIGN_OR_RETURN(at::Tensor prediction, required(file, "output.prediction"));
  Flux2Segment seg;
  seg.txt = ctx;
  seg.txt_ids = ctx_ids;
  seg.img = x;
  seg.img_ids = x_ids;
  seg.timestep = timestep.item<double>();
  seg.adapters = loras;
  check.loras = loras.size();
  if (model.config().guidance_embed) {
    INFILL_ASSIGN_OR_RETURN(at::Tensor guidance, required(file, "input.guidance"));
    seg.guidance = guidance.item<double>();
  }
  Flux2Trace trace;
  const at::Tensor out = model.forward(std::span<Flux2Segment>(&seg, 1), &trace);
  check.comparisons.push_back(compare("output.prediction", out, prediction));
  auto traced = [&](const std::string& name, const at::Tensor& ours) -> Status {
    if (file.find(name) == nullptr) return {};
    INFILL_ASSIGN_OR_RETURN(at::Tensor ref, load_float_tensor(file, name));
    check.comparisons.push_back(compare(name, ours, ref));
    return {};
  };
  for (size_t b = 0; b < trace.double_img.size(); ++b) {
    const std::string base = "trace.double_blocks." + std::to_string(b);
    INFILL_RETURN_IF_ERROR(traced(base + ".img", trace.double_img[b]));
    INFILL_RETURN_IF_ERROR(traced(base + ".txt", trace.double_txt[b]));
  }
  for (size_t b = 0; b < trace.single.size(); ++b) {
    INFILL_RETURN_IF_ERROR(traced("trace.single_blocks." + std::to_string(b), trace.single[b]));
  }
  return {};
}

Status check_autoencoder(const SafetensorsFile& file, ReferenceCheck& check, const ReferenceCheckOptions& options) {
  if (options.device.cuda) {
    return Status(ErrorCode::kUnimplemented, file.path() + ": the FLUX.2 autoencoder runs on the CPU only, not on " +
                                                 options.device.name());
  }
  INFILL_ASSIGN_OR_RETURN(Flux2Autoencoder ae, Flux2Autoencoder::load(file, kWeightsPrefix));
  INFILL_ASSIGN_OR_RETURN(at::Tensor image, required(file, "input.image"));
  INFILL_ASSIGN_OR_RETURN(at::Tensor latent, required(file, "output.latent"));
  INFILL_ASSIGN_OR_RETURN(at::Tensor decoded, required(file, "output.decoded"));
  // The decoder runs on the reference latent so that each half is checked on its own.
  check.comparisons.push_back(compare("output.latent", ae.encode_normalized(image.unsqueeze(0))[0], latent));
  check.comparisons.push_back(compare("output.decoded", ae.decode_normalized(latent.unsqueeze(0))[0], decoded));
  return {};
}

}  // namespace

Result<ReferenceCheck> run_reference_check(const std::string& path, const ReferenceCheckOptions& options) {
  INFILL_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(path));
  ReferenceCheck check;
  check.file = path;
  const auto model = file.metadata().find("model");
  if (model == file.metadata().end()) {
    return invalid_argument(path + ": no \"model\" in the metadata; expected \"flux2-transformer\" or "
                            "\"flux2-autoencoder\"");
  }
  check.model = model->second;
  c10::InferenceMode guard;
  if (check.model == "flux2-transformer") {
    INFILL_RETURN_IF_ERROR(check_transformer(file, check, options));
  } else if (check.model == "flux2-autoencoder") {
    INFILL_RETURN_IF_ERROR(check_autoencoder(file, check, options));
  } else {
    return invalid_argument(path + ": model \"" + check.model +
                            "\" is not known; expected \"flux2-transformer\" or \"flux2-autoencoder\"");
  }
  for (const ReferenceComparison& c : check.comparisons) {
    check.max_abs_err = std::max(check.max_abs_err, c.max_abs_err);
    check.max_rel_err = std::max(check.max_rel_err, c.max_rel_err);
  }
  check.ok = check.max_rel_err <= options.tolerance();
  return check;
}

}  // namespace infill
