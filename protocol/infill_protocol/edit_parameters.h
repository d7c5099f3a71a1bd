#pragma once
/// The one table of every edit parameter: its name in the API's JSON and in job files, type,
/// range, default and which clients may set it. The engine's parser, the SDK's checks,
/// infill-render's job-file reader and the editor's widgets read their ranges from here, and
/// tests check docs/job.schema.json and docs/api.md against it, so they cannot drift apart.
///
/// Header-only and dependency-free (C++20 standard library only): a leaf that the engine, the
/// SDK (which must not depend on the engine) and the editor all include.

#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

namespace infill::protocol {

enum class ParamType {
  kInteger,
  kNumber,
  kString,
  kEnum,
  kRectangle,    ///< [x, y, w, h]
  kAdapterList,  ///< [{"id": string, "strength": number}]: max_length entries at most, strengths in [min, max]
  kTemplateList, ///< [string]: template ids, max_length entries at most, no repeats
};

/// Who may set a parameter (bit flags).
enum ParamClient : unsigned {
  kApi = 1u << 0,      ///< POST /v1/edits
  kSdk = 1u << 1,      ///< infill_edit_params of libinfill_client
  kJobFile = 1u << 2,  ///< infill-render job files (under job_name)
  kEditor = 1u << 3,   ///< a widget of the Qt editor's parameter panel
};

/// Largest integer a JSON number carries exactly (2^53 - 1): the bound of every id and seed.
inline constexpr double kMaxSafeInteger = 9007199254740991.0;

struct EditParameter {
  std::string_view name;      ///< in the API's JSON and the SDK's struct
  std::string_view job_name;  ///< in job files ("" = not settable there)
  ParamType type;
  double min = 0;  ///< numbers and integers: the range [min, max] (or (min, max])
  double max = 0;
  bool min_exclusive = false;
  /// The value when omitted; has_default false = chosen elsewhere (the model's default,
  /// the class's deadline, none).
  bool has_default = false;
  double default_value = 0;
  std::string_view choices;  ///< kEnum: the values, separated by '|'
  size_t max_length = 0;     ///< kString: the longest value in bytes (0 = no limit here)
  unsigned clients = 0;
  /// The editor's widget range where a widget cannot hold the whole range (a QSpinBox holds
  /// an int) or a value is useless to offer (strength near 0); else min and max.
  double editor_min = std::numeric_limits<double>::quiet_NaN();
  double editor_max = std::numeric_limits<double>::quiet_NaN();
  std::string_view description;
};

// Designated initializers keep each row readable; omitted fields take the defaults above.
// g++ 12 warns about every omitted field all the same (GCC bug 96868), hence the pragma.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
inline constexpr std::array<EditParameter, 20> kEditParameters = {{
    {.name = "template", .job_name = "template", .type = ParamType::kString, .clients = kApi | kSdk | kJobFile,
     .description = "the template: its id from POST /v1/templates (job files: an image path)"},
    {.name = "prompt", .job_name = "prompt", .type = ParamType::kString, .max_length = 1000,
     .clients = kApi | kSdk | kJobFile | kEditor,
     .description = "free text, or words of the model's vocabulary; \"\" = none"},
    {.name = "model", .type = ParamType::kString, .clients = kApi | kSdk,
     .description = "the id or name of a loaded model (GET /v1/models); default: the engine's default model"},
    {.name = "seed", .job_name = "seed", .type = ParamType::kInteger, .min = 0, .max = kMaxSafeInteger,
     .has_default = true, .default_value = 0, .clients = kApi | kSdk | kJobFile | kEditor,
     .editor_min = 0, .editor_max = double(std::numeric_limits<int>::max()), .description = "noise seed"},
    {.name = "steps", .job_name = "steps", .type = ParamType::kInteger, .min = 1, .max = 1000,
     .clients = kApi | kSdk | kJobFile | kEditor, .description = "denoising steps; default: the model's"},
    {.name = "strength", .job_name = "strength", .type = ParamType::kNumber, .min = 0, .max = 1, .min_exclusive = true,
     .has_default = true, .default_value = 1, .clients = kApi | kSdk | kJobFile | kEditor, .editor_min = 0.05,
     .editor_max = 1, .description = "1 = regenerate from pure noise; lower keeps more of the template"},
    {.name = "guidance", .job_name = "guidance", .type = ParamType::kNumber, .min = 1, .max = 20,
     .clients = kApi | kSdk | kJobFile | kEditor, .description = "classifier-free guidance scale; default: the model's"},
    {.name = "sampler", .job_name = "sampler", .type = ParamType::kEnum, .choices = "euler_rf|ddim",
     .clients = kApi | kSdk | kJobFile, .description = "default: the model's"},
    {.name = "class", .type = ParamType::kEnum, .choices = "live|interactive|batch", .clients = kApi | kSdk,
     .description = "scheduling class: deadline and priority; batch edits are journaled; default interactive"},
    {.name = "deadline_ms", .type = ParamType::kNumber, .min = 1, .max = 7 * 24 * 3600e3, .clients = kApi | kSdk,
     .description = "milliseconds from submission; default: by class"},
    {.name = "preview_every_steps", .type = ParamType::kInteger, .min = 0, .max = 1000, .has_default = true,
     .default_value = 0, .clients = kApi | kSdk, .description = "a preview event every N steps; 0 = none"},
    {.name = "supersedes", .type = ParamType::kInteger, .min = 0, .max = kMaxSafeInteger, .has_default = true,
     .default_value = 0, .clients = kApi | kSdk,
     .description = "id of a live edit of the same client that this one replaces (cancelled); 0 = none"},
    {.name = "halo_tokens", .job_name = "halo", .type = ParamType::kInteger, .min = 0, .max = 64, .has_default = true,
     .default_value = 1, .clients = kApi | kSdk | kJobFile, .description = "masked-token dilation, in tokens"},
    {.name = "feather_px", .job_name = "feather", .type = ParamType::kNumber, .min = 0, .max = 256, .has_default = true,
     .default_value = 4, .clients = kApi | kSdk | kJobFile | kEditor,
     .description = "inward feather of the composite at the mask's edge, in pixels"},
    {.name = "output_format", .type = ParamType::kEnum, .choices = "template|png|tiff|exr", .clients = kApi | kSdk,
     .description = "the result's file format; default template: the template's own (PNG, TIFF or OpenEXR; else PNG "
                    "for 8/16-bit and OpenEXR for float templates)"},
    {.name = "mask_png_base64", .type = ParamType::kString, .clients = kApi,
     .description = "the mask as base64 PNG (or a 'mask' file part, or mask_rect)"},
    {.name = "mask_rect", .type = ParamType::kRectangle, .clients = kApi | kSdk,
     .description = "the mask as a rectangle [x, y, w, h] (an array)"},
    {.name = "adapters", .job_name = "adapters", .type = ParamType::kAdapterList, .min = -10, .max = 10,
     .max_length = 8, .clients = kApi | kSdk | kJobFile | kEditor,
     .description = "LoRAs applied in order, each {\"id\": from POST /v1/adapters, \"strength\": default 1}; FLUX.2 "
                    "models only; part of the cache key"},
    {.name = "adapters_from_step", .type = ParamType::kInteger, .min = 0, .max = 1000, .has_default = true,
     .default_value = 0, .clients = kApi | kSdk,
     .description = "the first step that applies the adapters (Katz's K): earlier steps run without them, so that an "
                    "adapter still being read holds up none of them; at most the edit's steps; part of the cache key"},
    {.name = "references", .job_name = "references", .type = ParamType::kTemplateList, .max_length = 4,
     .clients = kApi | kSdk | kJobFile | kEditor,
     .description = "reference images besides the template (their ids from POST /v1/templates), entered as tokens at "
                    "t = 20, 30, ... the way FLUX.2 [klein] edits; each scaled to at most 1024x1024 pixels; FLUX.2 "
                    "models only; part of the cache key"},
}};
#pragma GCC diagnostic pop

/// The row named `name` (API name), or nullptr.
constexpr const EditParameter* find_edit_parameter(std::string_view name) {
  for (const EditParameter& p : kEditParameters)
    if (p.name == name) return &p;
  return nullptr;
}

/// The row named `name`; a name not in the table does not compile where used in a constant
/// expression (and throws otherwise).
constexpr const EditParameter& edit_parameter(std::string_view name) {
  const EditParameter* p = find_edit_parameter(name);
  if (!p) throw "edit parameter not in the table";
  return *p;
}

/// The row whose job-file name is `job_name`, or nullptr.
constexpr const EditParameter* find_job_parameter(std::string_view job_name) {
  for (const EditParameter& p : kEditParameters)
    if (!p.job_name.empty() && p.job_name == job_name) return &p;
  return nullptr;
}

constexpr double editor_min(const EditParameter& p) { return p.editor_min == p.editor_min ? p.editor_min : p.min; }
constexpr double editor_max(const EditParameter& p) { return p.editor_max == p.editor_max ? p.editor_max : p.max; }

/// True when `v` is one of an enum parameter's choices.
constexpr bool is_choice(const EditParameter& p, std::string_view v) {
  std::string_view rest = p.choices;
  while (!rest.empty()) {
    const size_t bar = rest.find('|');
    if (rest.substr(0, bar) == v) return true;
    if (bar == std::string_view::npos) break;
    rest.remove_prefix(bar + 1);
  }
  return false;
}

/// True when `v` lies in the parameter's range.
constexpr bool in_range(const EditParameter& p, double v) {
  return (p.min_exclusive ? v > p.min : v >= p.min) && v <= p.max;
}

/// "0..64", "(0, 1]" or "1..20", for error messages ("halo_tokens is 80, expected 0..64").
inline std::string range_text(const EditParameter& p) {
  auto num = [](double v) {
    if (v == kMaxSafeInteger) return std::string("2^53-1");
    std::string s = std::to_string(v);
    s.erase(s.find_last_not_of('0') + 1);
    if (!s.empty() && s.back() == '.') s.pop_back();
    return s;
  };
  // Appended, not "(" + ...: g++ 12 raises a false -Wrestrict on a literal + std::string.
  std::string r;
  if (p.min_exclusive) {
    r.append("(").append(num(p.min)).append(", ").append(num(p.max)).append("]");
  } else {
    r.append(num(p.min)).append("..").append(num(p.max));
  }
  return r;
}

}  // namespace infill::protocol
