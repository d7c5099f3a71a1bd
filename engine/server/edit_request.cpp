#include "server/edit_request.h"

#include <algorithm>

#include <infill_protocol/edit_parameters.h>

#include "server/multipart.h"

namespace infill {

using nlohmann::json;
namespace proto = infill::protocol;

std::variant<EditRequestFields, ApiReply> parse_edit_request(const json& p, std::string mask_part) {
  if (!p.is_object()) return error_reply(400, "invalid_params", "edit parameters must be a JSON object");
  for (const auto& [key, value] : p.items()) {
    const proto::EditParameter* known = proto::find_edit_parameter(key);
    if (!known || !(known->clients & proto::kApi)) {
      std::string names;
      for (const proto::EditParameter& k : proto::kEditParameters)
        if (k.clients & proto::kApi) names += (names.empty() ? "" : ", ") + std::string(k.name);
      return error_reply(400, "unknown_parameter", "edit parameter '" + key + "' is not known (known: " + names + ")");
    }
  }
  auto str = [&](const char* key, std::string& out) -> std::optional<ApiReply> {
    if (!p.contains(key)) return std::nullopt;
    const proto::EditParameter& spec = proto::edit_parameter(key);
    if (!p[key].is_string()) return error_reply(400, "invalid_parameter", std::string(key) + " must be a string");
    out = p[key].get<std::string>();
    if (spec.max_length > 0 && out.size() > spec.max_length)
      return error_reply(400, "invalid_parameter", std::string(key) + " has " + std::to_string(out.size()) +
                                                       " bytes, expected at most " + std::to_string(spec.max_length));
    if (spec.type == proto::ParamType::kEnum && !out.empty() && !proto::is_choice(spec, out))
      return error_reply(400, "invalid_parameter",
                         std::string(key) + " is " + json(out).dump() + ", expected one of " + std::string(spec.choices));
    return std::nullopt;
  };
  auto num = [&](const char* key, std::optional<double>& out) -> std::optional<ApiReply> {
    if (!p.contains(key)) return std::nullopt;
    const proto::EditParameter& spec = proto::edit_parameter(key);
    const bool integer = spec.type == proto::ParamType::kInteger;
    const json& v = p[key];
    if (!v.is_number() || (integer && !v.is_number_integer()))
      return error_reply(400, "invalid_parameter", std::string(key) + " must be " + (integer ? "an integer" : "a number"));
    const double x = v.get<double>();
    if (!proto::in_range(spec, x))
      return error_reply(400, "invalid_parameter", std::string(key) + " is " + v.dump() + ", expected " + proto::range_text(spec));
    out = x;
    return std::nullopt;
  };
  EditRequestFields f;
  std::string cls_name, mask_b64;
  for (auto r : {str("template", f.template_id), str("prompt", f.prompt), str("class", cls_name),
                 str("mask_png_base64", mask_b64), str("sampler", f.sampler), str("model", f.model), str("output_format", f.output_format),
                 num("seed", f.seed), num("steps", f.steps), num("strength", f.strength), num("guidance", f.guidance),
                 num("deadline_ms", f.deadline_ms), num("preview_every_steps", f.preview_every_steps),
                 num("supersedes", f.supersedes), num("halo_tokens", f.halo_tokens), num("feather_px", f.feather_px),
                 num("adapters_from_step", f.adapters_from_step)}) {
    if (r) return *r;
  }
  if (f.template_id.empty()) return error_reply(400, "missing_parameter", "template is required (the id POST /v1/templates returned)");
  if (p.contains("adapters")) {
    const proto::EditParameter& spec = proto::edit_parameter("adapters");
    const json& list = p["adapters"];
    if (!list.is_array() || list.size() > spec.max_length)
      return error_reply(400, "invalid_parameter", "adapters must be an array of at most " + std::to_string(spec.max_length) +
                                                       " objects {\"id\", \"strength\"}");
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string at = "adapters[" + std::to_string(i) + "]";
      const json& a = list[i];
      if (!a.is_object() || !a.contains("id") || !a["id"].is_string())
        return error_reply(400, "invalid_parameter", at + " must be an object with an \"id\" string (from POST /v1/adapters)");
      for (const auto& [key, _] : a.items())
        if (key != "id" && key != "strength")
          return error_reply(400, "invalid_parameter", at + "." + key + " is not known (known: id, strength)");
      double strength = 1.0;
      if (a.contains("strength")) {
        if (!a["strength"].is_number()) return error_reply(400, "invalid_parameter", at + ".strength must be a number");
        strength = a["strength"].get<double>();
        if (!proto::in_range(spec, strength))
          return error_reply(400, "invalid_parameter",
                             at + ".strength is " + a["strength"].dump() + ", expected " + proto::range_text(spec));
      }
      f.adapters.emplace_back(a["id"].get<std::string>(), strength);
    }
  }
  if (p.contains("references")) {
    const proto::EditParameter& spec = proto::edit_parameter("references");
    const json& list = p["references"];
    const std::string expected =
        "expected an array of at most " + std::to_string(spec.max_length) + " template ids (from POST /v1/templates)";
    if (!list.is_array()) {
      return error_reply(400, "invalid_parameter", "references is " + std::string(list.type_name()) + ", " + expected);
    }
    if (list.size() > spec.max_length) {
      return error_reply(400, "invalid_parameter",
                         "references has " + std::to_string(list.size()) + " template ids, " + expected);
    }
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string at = "references[" + std::to_string(i) + "]";
      if (!list[i].is_string() || list[i].get<std::string>().empty())
        return error_reply(400, "invalid_parameter", at + " must be a template id (a string from POST /v1/templates)");
      const std::string id = list[i].get<std::string>();
      if (std::find(f.references.begin(), f.references.end(), id) != f.references.end())
        return error_reply(400, "invalid_parameter", at + " repeats " + id + " (each reference once)");
      f.references.push_back(id);
    }
  }
  if (!cls_name.empty()) {
    auto c = parse_request_class(cls_name);
    if (!c.ok()) return error_reply(400, "invalid_parameter", "class: " + c.status().message());
    f.cls = *c;
  }
  const int mask_sources = (mask_part.empty() ? 0 : 1) + (mask_b64.empty() ? 0 : 1) + (p.contains("mask_rect") ? 1 : 0);
  if (mask_sources != 1)
    return error_reply(400, "invalid_mask", mask_sources == 0 ? "a mask is required: a 'mask' file part, mask_png_base64 or mask_rect"
                                                              : "give exactly one of: a 'mask' file part, mask_png_base64, mask_rect");
  if (!mask_b64.empty()) {
    auto decoded = base64_decode(mask_b64);
    if (!decoded.ok()) return error_reply(400, "invalid_mask", "mask_png_base64: " + decoded.status().message());
    f.mask_bytes = std::move(*decoded);
  } else if (p.contains("mask_rect")) {
    f.mask_rect = p["mask_rect"];
  } else {
    f.mask_bytes = std::move(mask_part);
  }
  return f;
}

}  // namespace infill
