// The C API: argument checks, JSON in and out, and the one place where internal errors become
// infill_error objects (to_c). No exception leaves this file: every entry point catches.
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <new>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include <infill_protocol/edit_parameters.h>

#include "client_core.h"
#include "codec.h"
#include "endpoint.h"
#include "http.h"
#include "infill/infill_client.h"
#include "version.h"

using infill::sdk::ClientCore;
using infill::sdk::Error;
using infill::sdk::Job;
using infill::sdk::make_error;
using infill::sdk::Result;
using infill::sdk::Status;
using nlohmann::json;

struct infill_client {
  ClientCore* core = nullptr;
  std::string endpoint;
  std::string name;
};

struct infill_job {
  std::shared_ptr<Job> job;
};

struct infill_model_list {
  struct Model {
    std::string id, name, description, sampler, family;
    std::vector<std::string> words;
    std::vector<const char*> vocabulary;
  };
  std::vector<Model> models;
  std::vector<infill_model_info> infos;
};

struct infill_adapter_list {
  std::vector<infill_adapter_info> infos;
};

namespace {

// The size of each caller-filled struct in API 1.0: the smallest struct_size accepted.
constexpr size_t kOptionsSizeV1 = sizeof(infill_client_options);
constexpr size_t kHealthSizeV1 = sizeof(infill_health);
constexpr size_t kTemplateInfoSizeV1 = sizeof(infill_template_info);
constexpr size_t kEditParamsSizeV1 = offsetof(infill_edit_params, model);
// API 1.1 added infill_edit_params.model: read it only from callers whose struct holds it.
constexpr size_t kEditParamsSizeWithModel = offsetof(infill_edit_params, model) + sizeof(const char*);
// API 1.2 added infill_edit_params.output_format; older callers get PNG, as they were told.
constexpr size_t kEditParamsSizeWithOutputFormat = offsetof(infill_edit_params, output_format) + sizeof(const char*);
// API 1.3 added the adapter and reference lists: callers built against 1.2 or older send none.
constexpr size_t kEditParamsSizeWithAdapters = offsetof(infill_edit_params, adapter_count) + sizeof(size_t);
constexpr size_t kEditParamsSizeWithReferences = offsetof(infill_edit_params, reference_count) + sizeof(size_t);
constexpr size_t kEditParamsSizeWithAdaptersFromStep = offsetof(infill_edit_params, adapters_from_step) + sizeof(uint32_t);
// infill_adapter_info and infill_edit_adapter came with 1.3: their first layout.
constexpr size_t kAdapterInfoSizeV1 = sizeof(infill_adapter_info);
constexpr size_t kEditAdapterSizeV1 = sizeof(infill_edit_adapter);

infill_error* to_c(Error e) { return new infill_error{std::move(e)}; }


infill_error* invalid(std::string message) { return to_c(make_error(INFILL_ERROR_INVALID_ARGUMENT, std::move(message))); }

// Runs `f` and turns an escaping exception into an INTERNAL error.
template <class F>
infill_error* guarded(const char* function, F&& f) {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return to_c(make_error(INFILL_ERROR_INTERNAL, std::string(function) + ": out of memory"));
  } catch (const std::exception& e) {
    return to_c(make_error(INFILL_ERROR_INTERNAL, std::string(function) + ": " + e.what()));
  } catch (...) {
    return to_c(make_error(INFILL_ERROR_INTERNAL, std::string(function) + ": unknown exception"));
  }
}

std::string struct_size_message(const char* type, size_t got, size_t want, const char* init) {
  return std::string(type) + ".struct_size is " + std::to_string(got) + ", expected at least " + std::to_string(want) +
         " (prepare it with " + init + ")";
}

void copy_string(char* dst, size_t size, const std::string& src) {
  size_t n = std::min(size - 1, src.size());
  // A cut string ends before the character it would split (UTF-8 continuation bytes).
  if (n < src.size())
    while (n > 0 && (static_cast<unsigned char>(src[n]) & 0xC0) == 0x80) --n;
  std::memcpy(dst, src.data(), n);
  dst[n] = '\0';
}

// A number as a person writes it ("11", "-10.5"), for messages.
std::string number_text(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

// Copies the fields of `full` that fit in the caller's struct (its struct_size), keeping it.
template <class T>
void fill_out(T* out, const T& full) {
  const size_t size = std::min(out->struct_size, sizeof(T));
  std::memcpy(static_cast<void*>(out), &full, size);
  out->struct_size = size;
}

std::string url_encode(const std::string& s) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out += {'%', hex[c >> 4], hex[c & 15]};
    }
  }
  return out;
}

std::string str(const json& j, const char* key) {
  return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string();
}
uint64_t u64(const json& j, const char* key) {
  return j.contains(key) && j[key].is_number_unsigned() ? j[key].get<uint64_t>() : 0;
}

Result<json> parse_json(const infill::sdk::HttpResponse& r, const std::string& what) {
  json j = json::parse(r.body, nullptr, false);
  if (!j.is_object()) return make_error(INFILL_ERROR_PROTOCOL, what + ": the engine's answer is not a JSON object: " + r.body.substr(0, 200));
  return j;
}

Result<infill_template_info> template_from_json(const json& j, bool created) {
  infill_template_info t{};
  t.struct_size = sizeof t;
  const std::string id = str(j, "id");
  if (id.empty() || id.size() >= sizeof t.id) return make_error(INFILL_ERROR_PROTOCOL, "the engine's template answer has no valid id");
  copy_string(t.id, sizeof t.id, id);
  t.width = static_cast<uint32_t>(u64(j, "width"));
  t.height = static_cast<uint32_t>(u64(j, "height"));
  t.model_width = static_cast<uint32_t>(u64(j, "model_width"));
  t.model_height = static_cast<uint32_t>(u64(j, "model_height"));
  t.channels = static_cast<uint32_t>(u64(j, "channels"));
  copy_string(t.format, sizeof t.format, str(j, "format"));
  const std::string state = str(j, "state");
  t.state = state == "prepared" ? INFILL_TEMPLATE_PREPARED : state == "preparing" ? INFILL_TEMPLATE_PREPARING : INFILL_TEMPLATE_READY;
  t.edits_waiting = static_cast<uint32_t>(u64(j, "edits_waiting"));
  t.created = created ? 1 : 0;
  return t;
}

Result<infill_adapter_info> adapter_from_json(const json& j, bool created) {
  infill_adapter_info a{};
  a.struct_size = sizeof a;
  const std::string id = str(j, "id");
  if (id.empty() || id.size() >= sizeof a.id) return make_error(INFILL_ERROR_PROTOCOL, "the engine's adapter answer has no valid id");
  copy_string(a.id, sizeof a.id, id);
  copy_string(a.name, sizeof a.name, str(j, "name"));
  copy_string(a.format, sizeof a.format, str(j, "format"));
  a.min_rank = static_cast<uint32_t>(u64(j, "min_rank"));
  a.max_rank = static_cast<uint32_t>(u64(j, "rank"));
  a.layers = static_cast<uint32_t>(u64(j, "layers"));
  a.bytes = u64(j, "bytes");
  a.created = created ? 1 : 0;
  return a;
}

infill_error* check_client(const infill_client* client) {
  if (!client || !client->core) return invalid("client is NULL (create one with infill_client_create)");
  return nullptr;
}

infill_error* check_template_out(const infill_template_info* out) {
  if (out && out->struct_size < kTemplateInfoSizeV1)
    return invalid(struct_size_message("infill_template_info", out->struct_size, kTemplateInfoSizeV1, "infill_template_info_init"));
  return nullptr;
}

infill_error* check_adapter_out(const infill_adapter_info* out) {
  if (out && out->struct_size < kAdapterInfoSizeV1)
    return invalid(struct_size_message("infill_adapter_info", out->struct_size, kAdapterInfoSizeV1, "infill_adapter_info_init"));
  return nullptr;
}

// The adapter list of API 1.3 as the edit's "adapters" (null when none), or the message
// naming the bad element. The array's stride is its first element's struct_size, so that
// callers built against a later API (larger elements) are read right.
Result<json> adapters_json(const infill_edit_params& p) {
  auto bad = [](std::string m) { return make_error(INFILL_ERROR_INVALID_ARGUMENT, "infill_edit_params." + m); };
  if (p.adapter_count == 0) return json();
  const infill::protocol::EditParameter& spec = infill::protocol::edit_parameter("adapters");
  if (!p.adapters) return bad("adapters is NULL but adapter_count is " + std::to_string(p.adapter_count));
  if (p.adapter_count > spec.max_length)
    return bad("adapter_count is " + std::to_string(p.adapter_count) + ", expected at most " + std::to_string(spec.max_length) +
               " (0 = none)");
  const size_t stride = p.adapters[0].struct_size;
  if (stride < kEditAdapterSizeV1)
    return bad("adapters[0].struct_size is " + std::to_string(stride) + ", expected at least " + std::to_string(kEditAdapterSizeV1) +
               " (prepare each element with infill_edit_adapter_init)");
  json list = json::array();
  for (size_t i = 0; i < p.adapter_count; ++i) {
    const std::string at = "adapters[" + std::to_string(i) + "]";
    const auto* a = reinterpret_cast<const infill_edit_adapter*>(reinterpret_cast<const char*>(p.adapters) + i * stride);
    if (a->struct_size != stride)
      return bad(at + ".struct_size is " + std::to_string(a->struct_size) + ", adapters[0]'s is " + std::to_string(stride) +
                 " (prepare each element with infill_edit_adapter_init)");
    if (!a->id || !*a->id) return bad(at + ".id is NULL or empty (the id infill_client_upload_adapter returned)");
    if (std::isnan(a->strength) || !infill::protocol::in_range(spec, a->strength))
      return bad(at + ".strength is " + number_text(a->strength) + ", expected " + infill::protocol::range_text(spec));
    list.push_back({{"id", a->id}, {"strength", a->strength}});
  }
  return list;
}

// The reference list of API 1.3 as the edit's "references" (null when none).
Result<json> references_json(const infill_edit_params& p) {
  auto bad = [](std::string m) { return make_error(INFILL_ERROR_INVALID_ARGUMENT, "infill_edit_params." + m); };
  if (p.reference_count == 0) return json();
  const infill::protocol::EditParameter& spec = infill::protocol::edit_parameter("references");
  if (!p.references) return bad("references is NULL but reference_count is " + std::to_string(p.reference_count));
  if (p.reference_count > spec.max_length)
    return bad("reference_count is " + std::to_string(p.reference_count) + ", expected at most " + std::to_string(spec.max_length) +
               " (0 = none)");
  json list = json::array();
  for (size_t i = 0; i < p.reference_count; ++i) {
    const std::string at = "references[" + std::to_string(i) + "]";
    const char* id = p.references[i];
    if (!id || !*id) return bad(at + " is NULL or empty (a template id from infill_client_upload_template)");
    for (size_t k = 0; k < i; ++k)
      if (list[k].get<std::string>() == id)
        return bad(at + " repeats references[" + std::to_string(k) + "], \"" + id + "\" (each reference once)");
    list.push_back(id);
  }
  return list;
}

// Builds the POST /v1/edits body from the C parameters, with a message for each bad field.
Result<json> edit_json(const infill_edit_params& p) {
  auto bad = [](std::string m) { return make_error(INFILL_ERROR_INVALID_ARGUMENT, "infill_edit_params." + m); };
  if (!p.template_id || !*p.template_id) return bad("template_id is required (the id infill_client_upload_template returned)");
  json j = {{"template", p.template_id}};
  const bool png = p.mask_png != nullptr || p.mask_png_size != 0;
  const bool pixels = p.mask_pixels != nullptr || p.mask_width != 0 || p.mask_height != 0;
  const bool rect = p.mask_rect[2] != 0 || p.mask_rect[3] != 0;
  const int forms = int(png) + int(pixels) + int(rect);
  if (forms == 0) return bad("mask: give one of mask_png (+ mask_png_size), mask_pixels (+ mask_width, mask_height) or mask_rect");
  if (forms > 1) return bad("mask: give only one of mask_png, mask_pixels and mask_rect");
  if (png) {
    if (!p.mask_png) return bad("mask_png is NULL but mask_png_size is " + std::to_string(p.mask_png_size));
    if (p.mask_png_size == 0) return bad("mask_png_size is 0; give the size of the encoded mask in bytes");
    j["mask_png_base64"] = infill::sdk::base64_encode(std::string_view(static_cast<const char*>(p.mask_png), p.mask_png_size));
  } else if (pixels) {
    if (!p.mask_pixels) return bad("mask_pixels is NULL");
    if (p.mask_width == 0 || p.mask_height == 0)
      return bad("mask_width x mask_height is " + std::to_string(p.mask_width) + "x" + std::to_string(p.mask_height) + "; both must be > 0");
    if (uint64_t(p.mask_width) * p.mask_height > (uint64_t(1) << 28)) return bad("mask_pixels: the mask is larger than 2^28 pixels");
    const size_t stride = p.mask_stride == 0 ? p.mask_width : p.mask_stride;
    if (stride < p.mask_width) return bad("mask_stride is " + std::to_string(stride) + ", less than mask_width " + std::to_string(p.mask_width));
    const std::string encoded = infill::sdk::encode_grey_png(p.mask_pixels, p.mask_width, p.mask_height, stride);
    if (encoded.empty()) return bad("mask_pixels: out of memory compressing the mask");
    j["mask_png_base64"] = infill::sdk::base64_encode(encoded);
  } else {
    if (p.mask_rect[0] < 0 || p.mask_rect[1] < 0 || p.mask_rect[2] <= 0 || p.mask_rect[3] <= 0)
      return bad("mask_rect is {" + std::to_string(p.mask_rect[0]) + ", " + std::to_string(p.mask_rect[1]) + ", " +
                 std::to_string(p.mask_rect[2]) + ", " + std::to_string(p.mask_rect[3]) +
                 "}; expected x >= 0, y >= 0, width > 0, height > 0");
    j["mask_rect"] = {p.mask_rect[0], p.mask_rect[1], p.mask_rect[2], p.mask_rect[3]};
  }
  if (p.prompt && *p.prompt) j["prompt"] = p.prompt;
  // Ranges from the one parameter table (protocol/infill_protocol/edit_parameters.h), with
  // the struct's "0 / < 0 = default" conventions on top.
  using infill::protocol::edit_parameter;
  using infill::protocol::in_range;
  using infill::protocol::range_text;
  auto out_of_range = [&](const char* name, const std::string& shown, const char* unset) {
    return bad(std::string(name) + " is " + shown + ", expected " + range_text(edit_parameter(name)) + " (" + unset + ")");
  };
  if (p.prompt && std::strlen(p.prompt) > edit_parameter("prompt").max_length)
    return bad("prompt has " + std::to_string(std::strlen(p.prompt)) + " bytes, expected at most " +
               std::to_string(edit_parameter("prompt").max_length));
  if (p.prompt && *p.prompt) j["prompt"] = p.prompt;
  if (!in_range(edit_parameter("seed"), double(p.seed)) || p.seed > 9007199254740991ull)
    return out_of_range("seed", std::to_string(p.seed), "0 = 0");
  if (p.seed != 0) j["seed"] = p.seed;
  if (p.steps != 0 && !in_range(edit_parameter("steps"), double(p.steps)))
    return out_of_range("steps", std::to_string(p.steps), "0 = the model's default");
  if (p.steps != 0) j["steps"] = p.steps;
  if (p.strength != 0 && !in_range(edit_parameter("strength"), p.strength))
    return out_of_range("strength", std::to_string(p.strength), "0 = 1");
  if (p.strength != 0) j["strength"] = p.strength;
  if (p.guidance != 0 && !in_range(edit_parameter("guidance"), p.guidance))
    return out_of_range("guidance", std::to_string(p.guidance), "0 = the model's default");
  if (p.guidance != 0) j["guidance"] = p.guidance;
  if (p.sampler && *p.sampler) {
    if (!infill::protocol::is_choice(edit_parameter("sampler"), p.sampler))
      return bad("sampler is \"" + std::string(p.sampler) + "\", expected one of " + std::string(edit_parameter("sampler").choices) +
                 " (NULL or \"\" = the model's default)");
    j["sampler"] = p.sampler;
  }
  // Read as an integer: a C caller may pass any value, which is no valid C++ enum value.
  std::underlying_type_t<infill_edit_class> cls = 0;
  std::memcpy(&cls, &p.edit_class, sizeof cls);
  switch (cls) {
    case INFILL_CLASS_DEFAULT: break;
    case INFILL_CLASS_LIVE: j["class"] = "live"; break;
    case INFILL_CLASS_INTERACTIVE: j["class"] = "interactive"; break;
    case INFILL_CLASS_BATCH: j["class"] = "batch"; break;
    default: return bad("edit_class is " + std::to_string(cls) + ", expected an infill_edit_class value");
  }
  if (std::isnan(p.deadline_ms) || p.deadline_ms < 0 || (p.deadline_ms != 0 && !in_range(edit_parameter("deadline_ms"), p.deadline_ms)))
    return out_of_range("deadline_ms", std::to_string(p.deadline_ms), "0 = by class");
  if (p.deadline_ms > 0) j["deadline_ms"] = p.deadline_ms;
  if (!in_range(edit_parameter("preview_every_steps"), double(p.preview_every_steps)))
    return out_of_range("preview_every_steps", std::to_string(p.preview_every_steps), "0 = none");
  if (p.preview_every_steps != 0) j["preview_every_steps"] = p.preview_every_steps;
  if (double(p.supersedes) > edit_parameter("supersedes").max)
    return out_of_range("supersedes", std::to_string(p.supersedes), "0 = none");
  if (p.supersedes != 0) j["supersedes"] = p.supersedes;
  if (p.halo_tokens >= 0 && !in_range(edit_parameter("halo_tokens"), double(p.halo_tokens)))
    return out_of_range("halo_tokens", std::to_string(p.halo_tokens), "< 0 = the default");
  if (p.halo_tokens >= 0) j["halo_tokens"] = p.halo_tokens;
  if (std::isnan(p.feather_px) || (p.feather_px >= 0 && !in_range(edit_parameter("feather_px"), p.feather_px)))
    return out_of_range("feather_px", std::to_string(p.feather_px), "< 0 = the default");
  if (p.feather_px >= 0) j["feather_px"] = p.feather_px;
  if (p.struct_size >= kEditParamsSizeWithModel && p.model && *p.model) j["model"] = p.model;
  const char* format = p.struct_size >= kEditParamsSizeWithOutputFormat ? p.output_format : nullptr;
  if (format && *format && !infill::protocol::is_choice(edit_parameter("output_format"), format))
    return bad("output_format is \"" + std::string(format) + "\", expected one of " +
               std::string(edit_parameter("output_format").choices) + " (NULL or \"\" = png)");
  j["output_format"] = format && *format ? format : "png";
  if (p.struct_size >= kEditParamsSizeWithAdapters) {
    auto adapters = adapters_json(p);
    if (!adapters.ok()) return adapters.error();
    if (!adapters->is_null()) j["adapters"] = std::move(*adapters);
  }
  if (p.struct_size >= kEditParamsSizeWithReferences) {
    auto references = references_json(p);
    if (!references.ok()) return references.error();
    if (!references->is_null()) j["references"] = std::move(*references);
  }
  if (p.struct_size >= kEditParamsSizeWithAdaptersFromStep) {
    if (!in_range(edit_parameter("adapters_from_step"), double(p.adapters_from_step)))
      return out_of_range("adapters_from_step", std::to_string(p.adapters_from_step), "0 = from the first step");
    if (p.adapters_from_step != 0) j["adapters_from_step"] = p.adapters_from_step;
  }
  return j;
}

std::atomic<uint64_t> g_client_counter{0};

}  // namespace

extern "C" {

uint32_t infill_api_version(void) { return INFILL_CLIENT_API_VERSION; }

const char* infill_library_version(void) { return infill::sdk::kLibraryVersion; }

// ---- errors ----

infill_error_code infill_error_get_code(const infill_error* error) { return error ? error->e.code : INFILL_ERROR_INVALID_ARGUMENT; }
const char* infill_error_message(const infill_error* error) { return error ? error->e.message.c_str() : "error is NULL"; }
int infill_error_http_status(const infill_error* error) { return error ? error->e.http_status : 0; }
const char* infill_error_engine_code(const infill_error* error) { return error ? error->e.engine_code.c_str() : ""; }
int infill_error_retry_after_s(const infill_error* error) { return error ? error->e.retry_after_s : 0; }
void infill_error_delete(infill_error* error) { delete error; }

const char* infill_error_code_name(infill_error_code code) {
  switch (code) {
    case INFILL_ERROR_INVALID_ARGUMENT: return "invalid_argument";
    case INFILL_ERROR_VERSION_MISMATCH: return "version_mismatch";
    case INFILL_ERROR_CONNECTION: return "connection";
    case INFILL_ERROR_TIMEOUT: return "timeout";
    case INFILL_ERROR_PROTOCOL: return "protocol";
    case INFILL_ERROR_UNAUTHORIZED: return "unauthorized";
    case INFILL_ERROR_NOT_FOUND: return "not_found";
    case INFILL_ERROR_CONFLICT: return "conflict";
    case INFILL_ERROR_RATE_LIMITED: return "rate_limited";
    case INFILL_ERROR_UNAVAILABLE: return "unavailable";
    case INFILL_ERROR_TOO_LARGE: return "too_large";
    case INFILL_ERROR_REJECTED: return "rejected";
    case INFILL_ERROR_SERVER: return "server";
    case INFILL_ERROR_CANCELLED: return "cancelled";
    case INFILL_ERROR_EXPIRED: return "expired";
    case INFILL_ERROR_EDIT_FAILED: return "edit_failed";
    case INFILL_ERROR_ENGINE_LOST: return "engine_lost";
    case INFILL_ERROR_CLIENT_CLOSED: return "client_closed";
    case INFILL_ERROR_IO: return "io";
    case INFILL_ERROR_INTERNAL: return "internal";
  }
  return "unknown";
}

const char* infill_job_state_name(infill_job_state state) {
  switch (state) {
    case INFILL_JOB_QUEUED: return "queued";
    case INFILL_JOB_RUNNING: return "running";
    case INFILL_JOB_DONE: return "done";
    case INFILL_JOB_FAILED: return "failed";
    case INFILL_JOB_CANCELLED: return "cancelled";
    case INFILL_JOB_EXPIRED: return "expired";
  }
  return "unknown";
}

// ---- client ----

void infill_client_options_init(infill_client_options* o) {
  if (!o) return;
  std::memset(static_cast<void*>(o), 0, sizeof *o);
  o->struct_size = sizeof *o;
  o->api_version = INFILL_CLIENT_API_VERSION;
  o->connect_timeout_ms = 5000;
  o->request_timeout_ms = 60000;
  o->stream_idle_timeout_ms = 45000;
  o->reconnect_interval_ms = 500;
  o->engine_lost_timeout_ms = 10000;
  o->cancel_on_destroy = 1;
}

infill_error* infill_client_create(const infill_client_options* options, infill_client** out_client) {
  return guarded(__func__, [&]() -> infill_error* {
    if (!out_client) return invalid("out_client is NULL");
    *out_client = nullptr;
    if (!options) return invalid("options is NULL (prepare them with infill_client_options_init)");
    if (options->struct_size < kOptionsSizeV1)
      return invalid(struct_size_message("infill_client_options", options->struct_size, kOptionsSizeV1, "infill_client_options_init"));
    const uint32_t want = options->api_version, have = INFILL_CLIENT_API_VERSION;
    if ((want >> 16) != (have >> 16) || (want & 0xFFFF) > (have & 0xFFFF))
      return to_c(make_error(INFILL_ERROR_VERSION_MISMATCH,
                             "the caller was compiled against infill_client API " + std::to_string(want >> 16) + "." +
                                 std::to_string(want & 0xFFFF) + ", this library (" + infill::sdk::kLibraryVersion +
                                 ") implements API " + std::to_string(have >> 16) + "." + std::to_string(have & 0xFFFF) +
                                 " (same major, minor up to it)"));
    auto ep = infill::sdk::parse_endpoint(options->endpoint ? options->endpoint : "");
    if (!ep.ok()) return to_c(ep.error());
    infill::sdk::CoreOptions co;
    co.http.endpoint = *ep;
    if (!ep->is_unix()) {
      auto token = infill::sdk::resolve_token(options->token, options->token_file);
      if (!token.ok()) return to_c(token.error());
      for (char c : *token)
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7F)
          return invalid("token contains a control character; it must be the engine's token text");
      co.http.token = *token;
    }
    if (options->client_name) {
      if (!infill::sdk::valid_client_name(options->client_name))
        return invalid(std::string("client_name '") + std::string(options->client_name).substr(0, 80) +
                       "' must be 1-64 characters of A-Z a-z 0-9 . _ -");
      co.http.client_name = options->client_name;
    } else {
      co.http.client_name = "sdk-" + std::to_string(::getpid()) + "-" + std::to_string(++g_client_counter);
    }
    auto or_default = [](uint32_t v, uint32_t d) { return v == 0 ? d : v; };
    co.http.connect_timeout_ms = or_default(options->connect_timeout_ms, 5000);
    co.http.request_timeout_ms = or_default(options->request_timeout_ms, 60000);
    co.stream_idle_timeout_ms = or_default(options->stream_idle_timeout_ms, 45000);
    co.reconnect_interval_ms = or_default(options->reconnect_interval_ms, 500);
    co.engine_lost_timeout_ms = or_default(options->engine_lost_timeout_ms, 10000);
    co.cancel_on_destroy = options->cancel_on_destroy != 0;
    auto client = std::make_unique<infill_client>();
    client->endpoint = ep->text;
    client->name = co.http.client_name;
    client->core = new ClientCore(std::move(co));
    *out_client = client.release();
    return nullptr;
  });
}

void infill_client_destroy(infill_client* client) {
  if (!client) return;
  try {
    if (client->core) client->core->destroy();
  } catch (...) {
  }
  delete client;
}

const char* infill_client_endpoint(const infill_client* client) { return client ? client->endpoint.c_str() : ""; }
const char* infill_client_name(const infill_client* client) { return client ? client->name.c_str() : ""; }

size_t infill_default_endpoint(char* buffer, size_t buffer_size) {
  try {
    const std::string e = infill::sdk::default_endpoint();
    if (buffer && buffer_size > 0) copy_string(buffer, buffer_size, e);
    return e.size();
  } catch (...) {
    if (buffer && buffer_size > 0) buffer[0] = '\0';
    return 0;
  }
}

// ---- health and models ----

void infill_health_init(infill_health* h) {
  if (!h) return;
  std::memset(static_cast<void*>(h), 0, sizeof *h);
  h->struct_size = sizeof *h;
}

infill_error* infill_client_health(infill_client* client, infill_health* out) {
  return guarded(__func__, [&]() -> infill_error* {
    if (auto* e = check_client(client)) return e;
    if (!out) return invalid("out (infill_health*) is NULL");
    if (out->struct_size < kHealthSizeV1) return invalid(struct_size_message("infill_health", out->struct_size, kHealthSizeV1, "infill_health_init"));
    const auto& http = client->core->http();
    auto r = infill::sdk::http_call(http, "GET", "/health");
    if (!r.ok()) return to_c(r.error());
    infill_health h{};
    h.struct_size = sizeof h;
    if (r->status == 503) {
      json j = json::parse(r->body, nullptr, false);
      if (j.is_object() && j.contains("error") && str(j["error"], "code") == "not_ready") {
        fill_out(out, h);
        return nullptr;
      }
    }
    if (r->status != 200) return to_c(infill::sdk::response_error(http, *r, "GET /health"));
    auto j = parse_json(*r, "GET /health");
    if (!j.ok()) return to_c(j.error());
    h.ready = 1;
    h.live_edits = static_cast<uint32_t>(u64(*j, "live_edits"));
    copy_string(h.model_id, sizeof h.model_id, str(*j, "model"));
    fill_out(out, h);
    return nullptr;
  });
}

infill_error* infill_client_wait_ready(infill_client* client, uint32_t timeout_ms) {
  return guarded(__func__, [&]() -> infill_error* {
    if (auto* e = check_client(client)) return e;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    std::string last = "no answer yet";
    for (;;) {
      infill_health h;
      infill_health_init(&h);
      infill_error* e = infill_client_health(client, &h);
      if (!e && h.ready) return nullptr;
      if (e) {
        if (e->e.code == INFILL_ERROR_UNAUTHORIZED) return e;  // waiting will not fix a token
        last = e->e.message;
        infill_error_delete(e);
      } else {
        last = "the engine is loading its model";
      }
      if (std::chrono::steady_clock::now() >= deadline)
        return to_c(make_error(INFILL_ERROR_TIMEOUT, "the engine at " + client->endpoint + " was not ready within " +
                                                         std::to_string(timeout_ms) + " ms: " + last));
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
}

infill_error* infill_client_list_models(infill_client* client, infill_model_list** out_list) {
  return guarded(__func__, [&]() -> infill_error* {
    if (!out_list) return invalid("out_list is NULL");
    *out_list = nullptr;
    if (auto* e = check_client(client)) return e;
    const auto& http = client->core->http();
    auto r = infill::sdk::http_call(http, "GET", "/v1/models");
    if (!r.ok()) return to_c(r.error());
    if (r->status != 200) return to_c(infill::sdk::response_error(http, *r, "listing the models"));
    auto j = parse_json(*r, "GET /v1/models");
    if (!j.ok()) return to_c(j.error());
    if (!j->contains("models") || !(*j)["models"].is_array())
      return to_c(make_error(INFILL_ERROR_PROTOCOL, "GET /v1/models: the answer has no 'models' array"));
    auto list = std::make_unique<infill_model_list>();
    for (const json& m : (*j)["models"]) {
      infill_model_list::Model model;
      model.id = str(m, "id");
      model.name = str(m, "name");
      model.description = str(m, "description");
      model.sampler = str(m, "default_sampler");
      model.family = str(m, "family");
      if (m.contains("vocabulary") && m["vocabulary"].is_array())
        for (const json& w : m["vocabulary"])
          if (w.is_string()) model.words.push_back(w.get<std::string>());
      list->models.push_back(std::move(model));
    }
    // Pointers into the models are taken once the vector no longer grows.
    size_t i = 0;
    for (const json& m : (*j)["models"]) {
      auto& model = list->models[i++];
      for (const auto& w : model.words) model.vocabulary.push_back(w.c_str());
      infill_model_info info{};
      info.struct_size = sizeof info;
      info.id = model.id.c_str();
      info.name = model.name.c_str();
      info.description = model.description.c_str();
      info.default_steps = static_cast<uint32_t>(u64(m, "default_steps"));
      info.default_sampler = model.sampler.c_str();
      info.default_guidance = m.contains("default_guidance") && m["default_guidance"].is_number() ? m["default_guidance"].get<double>() : 1.0;
      info.vocabulary = model.vocabulary.data();
      info.vocabulary_count = model.vocabulary.size();
      info.max_image_pixels = u64(m, "max_image_pixels");
      info.grid_pixels = static_cast<uint32_t>(u64(m, "grid_pixels"));
      info.free_text = str(m, "prompt") == "free_text" ? 1 : 0;
      info.family = model.family.c_str();
      list->infos.push_back(info);
    }
    *out_list = list.release();
    return nullptr;
  });
}

size_t infill_model_list_count(const infill_model_list* list) { return list ? list->infos.size() : 0; }
const infill_model_info* infill_model_list_get(const infill_model_list* list, size_t index) {
  return list && index < list->infos.size() ? &list->infos[index] : nullptr;
}
void infill_model_list_delete(infill_model_list* list) { delete list; }

// ---- templates ----

void infill_template_info_init(infill_template_info* info) {
  if (!info) return;
  std::memset(static_cast<void*>(info), 0, sizeof *info);
  info->struct_size = sizeof *info;
}

static infill_error* upload(infill_client* client, std::string bytes, const std::string& name, infill_template_info* out) {
  const auto& http = client->core->http();
  const std::string what = "uploading template " + (name.empty() ? std::string("(unnamed)") : name);
  std::string target = "/v1/templates";
  if (!name.empty()) target += "?name=" + url_encode(name);
  auto r = infill::sdk::http_call(http, "POST", target, bytes, "application/octet-stream");
  if (!r.ok()) return to_c(r.error());
  if (r->status != 200 && r->status != 201) return to_c(infill::sdk::response_error(http, *r, what));
  auto j = parse_json(*r, what);
  if (!j.ok()) return to_c(j.error());
  auto t = template_from_json(*j, r->status == 201);
  if (!t.ok()) return to_c(t.error());
  if (out) fill_out(out, *t);
  return nullptr;
}

infill_error* infill_client_upload_template(infill_client* client, const void* bytes, size_t size, const char* name,
                                            infill_template_info* out) {
  return guarded(__func__, [&]() -> infill_error* {
    if (auto* e = check_client(client)) return e;
    if (!bytes) return invalid("bytes is NULL (the encoded image to upload)");
    if (size == 0) return invalid("size is 0; give the size of the encoded image in bytes");
    if (auto* e = check_template_out(out)) return e;
    return upload(client, std::string(static_cast<const char*>(bytes), size), name ? name : "", out);
  });
}

infill_error* infill_client_upload_template_file(infill_client* client, const char* path, infill_template_info* out) {
  return guarded(__func__, [&]() -> infill_error* {
    if (auto* e = check_client(client)) return e;
    if (!path || !*path) return invalid("path is NULL or empty");
    if (auto* e = check_template_out(out)) return e;
    std::ifstream in(path, std::ios::binary);
    if (!in) return to_c(make_error(INFILL_ERROR_IO, std::string("cannot open the template image ") + path + ": " + std::strerror(errno)));
    std::stringstream ss;
    ss << in.rdbuf();
    std::string bytes = ss.str();
    if (bytes.empty()) return to_c(make_error(INFILL_ERROR_IO, std::string("the template image ") + path + " is empty"));
    std::string name = path;
    if (auto slash = name.rfind('/'); slash != std::string::npos) name = name.substr(slash + 1);
    return upload(client, std::move(bytes), name, out);
  });
}

infill_error* infill_client_get_template(infill_client* client, const char* template_id, infill_template_info* out) {
  return guarded(__func__, [&]() -> infill_error* {
    if (auto* e = check_client(client)) return e;
    if (!template_id || !*template_id) return invalid("template_id is NULL or empty");
    if (!out) return invalid("out (infill_template_info*) is NULL");
    if (auto* e = check_template_out(out)) return e;
    const auto& http = client->core->http();
    auto r = infill::sdk::http_call(http, "GET", "/v1/templates/" + url_encode(template_id));
    if (!r.ok()) return to_c(r.error());
    if (r->status != 200) return to_c(infill::sdk::response_error(http, *r, std::string("template ") + template_id));
    auto j = parse_json(*r, "GET /v1/templates");
    if (!j.ok()) return to_c(j.error());
    auto t = template_from_json(*j, false);
    if (!t.ok()) return to_c(t.error());
    fill_out(out, *t);
    return nullptr;
  });
}

// ---- adapters ----

void infill_adapter_info_init(infill_adapter_info* info) {
  if (!info) return;
  std::memset(static_cast<void*>(info), 0, sizeof *info);
  info->struct_size = sizeof *info;
}

static infill_error* upload_adapter(infill_client* client, std::string bytes, const std::string& name, const char* model,
                                    infill_adapter_info* out) {
  const auto& http = client->core->http();
  const std::string what = "uploading adapter " + (name.empty() ? std::string("(unnamed)") : name);
  std::string query;
  if (!name.empty()) query += "name=" + url_encode(name);
  if (model && *model) query += std::string(query.empty() ? "" : "&") + "model=" + url_encode(model);
  const std::string target = "/v1/adapters" + (query.empty() ? std::string() : "?" + query);
  auto r = infill::sdk::http_call(http, "POST", target, bytes, "application/octet-stream");
  if (!r.ok()) return to_c(r.error());
  if (r->status != 200 && r->status != 201) return to_c(infill::sdk::response_error(http, *r, what));
  auto j = parse_json(*r, what);
  if (!j.ok()) return to_c(j.error());
  auto a = adapter_from_json(*j, r->status == 201);
  if (!a.ok()) return to_c(a.error());
  if (out) fill_out(out, *a);
  return nullptr;
}

infill_error* infill_client_upload_adapter(infill_client* client, const void* bytes, size_t size, const char* name,
                                           const char* model, infill_adapter_info* out) {
  return guarded(__func__, [&]() -> infill_error* {
    if (auto* e = check_client(client)) return e;
    if (!bytes) return invalid("bytes is NULL (the .safetensors file to upload)");
    if (size == 0) return invalid("size is 0; give the size of the .safetensors file in bytes");
    if (auto* e = check_adapter_out(out)) return e;
    return upload_adapter(client, std::string(static_cast<const char*>(bytes), size), name ? name : "", model, out);
  });
}

infill_error* infill_client_upload_adapter_file(infill_client* client, const char* path, const char* model,
                                                infill_adapter_info* out) {
  return guarded(__func__, [&]() -> infill_error* {
    if (auto* e = check_client(client)) return e;
    if (!path || !*path) return invalid("path is NULL or empty (the LoRA's .safetensors file)");
    if (auto* e = check_adapter_out(out)) return e;
    std::ifstream in(path, std::ios::binary);
    if (!in) return to_c(make_error(INFILL_ERROR_IO, std::string("cannot open the LoRA file ") + path + ": " + std::strerror(errno)));
    std::stringstream ss;
    ss << in.rdbuf();
    std::string bytes = ss.str();
    if (bytes.empty()) return to_c(make_error(INFILL_ERROR_IO, std::string("the LoRA file ") + path + " is empty"));
    std::string name = path;
    if (auto slash = name.rfind('/'); slash != std::string::npos) name = name.substr(slash + 1);
    return upload_adapter(client, std::move(bytes), name, model, out);
  });
}

infill_error* infill_client_get_adapter(infill_client* client, const char* adapter_id, infill_adapter_info* out) {
  return guarded(__func__, [&]() -> infill_error* {
    if (auto* e = check_client(client)) return e;
    if (!adapter_id || !*adapter_id) return invalid("adapter_id is NULL or empty");
    if (!out) return invalid("out (infill_adapter_info*) is NULL");
    if (auto* e = check_adapter_out(out)) return e;
    const auto& http = client->core->http();
    auto r = infill::sdk::http_call(http, "GET", "/v1/adapters/" + url_encode(adapter_id));
    if (!r.ok()) return to_c(r.error());
    if (r->status != 200) return to_c(infill::sdk::response_error(http, *r, std::string("adapter ") + adapter_id));
    auto j = parse_json(*r, "GET /v1/adapters/{id}");
    if (!j.ok()) return to_c(j.error());
    auto a = adapter_from_json(*j, false);
    if (!a.ok()) return to_c(a.error());
    fill_out(out, *a);
    return nullptr;
  });
}

infill_error* infill_client_delete_adapter(infill_client* client, const char* adapter_id) {
  return guarded(__func__, [&]() -> infill_error* {
    if (auto* e = check_client(client)) return e;
    if (!adapter_id || !*adapter_id) return invalid("adapter_id is NULL or empty");
    const auto& http = client->core->http();
    auto r = infill::sdk::http_call(http, "DELETE", "/v1/adapters/" + url_encode(adapter_id));
    if (!r.ok()) return to_c(r.error());
    if (r->status != 200) return to_c(infill::sdk::response_error(http, *r, std::string("deleting adapter ") + adapter_id));
    return nullptr;
  });
}

infill_error* infill_client_list_adapters(infill_client* client, infill_adapter_list** out_list) {
  return guarded(__func__, [&]() -> infill_error* {
    if (!out_list) return invalid("out_list is NULL");
    *out_list = nullptr;
    if (auto* e = check_client(client)) return e;
    const auto& http = client->core->http();
    auto r = infill::sdk::http_call(http, "GET", "/v1/adapters");
    if (!r.ok()) return to_c(r.error());
    if (r->status != 200) return to_c(infill::sdk::response_error(http, *r, "listing the adapters"));
    auto j = parse_json(*r, "GET /v1/adapters");
    if (!j.ok()) return to_c(j.error());
    if (!j->contains("adapters") || !(*j)["adapters"].is_array())
      return to_c(make_error(INFILL_ERROR_PROTOCOL, "GET /v1/adapters: the answer has no 'adapters' array"));
    auto list = std::make_unique<infill_adapter_list>();
    for (const json& a : (*j)["adapters"]) {
      auto info = adapter_from_json(a, false);
      if (!info.ok()) return to_c(info.error());
      list->infos.push_back(*info);
    }
    *out_list = list.release();
    return nullptr;
  });
}

size_t infill_adapter_list_count(const infill_adapter_list* list) { return list ? list->infos.size() : 0; }
const infill_adapter_info* infill_adapter_list_get(const infill_adapter_list* list, size_t index) {
  return list && index < list->infos.size() ? &list->infos[index] : nullptr;
}
void infill_adapter_list_delete(infill_adapter_list* list) { delete list; }

// ---- edits ----

void infill_edit_adapter_init(infill_edit_adapter* adapter) {
  if (!adapter) return;
  std::memset(static_cast<void*>(adapter), 0, sizeof *adapter);
  adapter->struct_size = sizeof *adapter;
  adapter->strength = 1.0;
}

void infill_edit_params_init(infill_edit_params* p) {
  if (!p) return;
  std::memset(static_cast<void*>(p), 0, sizeof *p);
  p->struct_size = sizeof *p;
  p->halo_tokens = -1;
  p->feather_px = -1;
}

infill_error* infill_client_submit_edit(infill_client* client, const infill_edit_params* params, infill_job** out_job) {
  return guarded(__func__, [&]() -> infill_error* {
    if (out_job) *out_job = nullptr;
    if (auto* e = check_client(client)) return e;
    if (!params) return invalid("params is NULL (prepare them with infill_edit_params_init)");
    if (params->struct_size < kEditParamsSizeV1)
      return invalid(struct_size_message("infill_edit_params", params->struct_size, kEditParamsSizeV1, "infill_edit_params_init"));
    auto body = edit_json(*params);
    if (!body.ok()) return to_c(body.error());
    infill::sdk::Callbacks cb{params->on_progress, params->on_preview, params->on_done, params->user_data};
    auto handle = out_job ? std::make_unique<infill_job>() : nullptr;  // allocated before: no failure after acceptance
    auto job = client->core->submit(*body, cb);
    if (!job.ok()) return to_c(job.error());
    if (out_job) {
      handle->job = *job;
      *out_job = handle.release();
    }
    return nullptr;
  });
}

uint64_t infill_job_id(const infill_job* job) { return job && job->job ? job->job->id : 0; }

infill_job_state infill_job_get_state(const infill_job* job) {
  if (!job || !job->job) return INFILL_JOB_FAILED;
  std::lock_guard lock(job->job->mu);
  return job->job->state;
}

void infill_job_progress(const infill_job* job, uint32_t* steps_done, uint32_t* steps_total) {
  uint32_t d = 0, t = 0;
  if (job && job->job) {
    std::lock_guard lock(job->job->mu);
    d = job->job->steps_done;
    t = job->job->steps_total;
  }
  if (steps_done) *steps_done = d;
  if (steps_total) *steps_total = t;
}

infill_error* infill_job_cancel(infill_job* job) {
  return guarded(__func__, [&]() -> infill_error* {
    if (!job || !job->job) return invalid("job is NULL");
    Job& j = *job->job;
    {
      std::lock_guard lock(j.mu);
      if (j.state == INFILL_JOB_DONE || j.state == INFILL_JOB_FAILED || j.state == INFILL_JOB_CANCELLED ||
          j.state == INFILL_JOB_EXPIRED)
        return nullptr;
    }
    auto r = infill::sdk::http_call(*j.http, "DELETE", "/v1/edits/" + std::to_string(j.id));
    if (!r.ok()) return to_c(r.error());
    if (r->status == 202 || r->status == 409) return nullptr;  // 409: it ended meanwhile
    return to_c(infill::sdk::response_error(*j.http, *r, "cancelling edit " + std::to_string(j.id)));
  });
}

infill_error* infill_client_cancel_edit(infill_client* client, uint64_t edit_id) {
  return guarded(__func__, [&]() -> infill_error* {
    if (auto* e = check_client(client)) return e;
    if (edit_id == 0) return invalid("edit_id is 0; give the id infill_job_id returned");
    const auto& http = client->core->http();
    auto r = infill::sdk::http_call(http, "DELETE", "/v1/edits/" + std::to_string(edit_id));
    if (!r.ok()) return to_c(r.error());
    if (r->status == 202 || r->status == 409) return nullptr;  // 409: it had ended
    return to_c(infill::sdk::response_error(http, *r, "cancelling edit " + std::to_string(edit_id)));
  });
}

infill_error* infill_job_wait(infill_job* job, uint32_t timeout_ms) {
  return guarded(__func__, [&]() -> infill_error* {
    if (!job || !job->job) return invalid("job is NULL");
    Job& j = *job->job;
    std::unique_lock lock(j.mu);
    if (j.finished) return nullptr;
    if (std::this_thread::get_id() == j.io_thread)
      return invalid("infill_job_wait was called from a callback for edit " + std::to_string(j.id) +
                     ", which has not finished: that would wait forever");
    if (timeout_ms == UINT32_MAX) {
      j.cv.wait(lock, [&] { return j.finished; });
      return nullptr;
    }
    if (j.cv.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return j.finished; })) return nullptr;
    return to_c(make_error(INFILL_ERROR_TIMEOUT, "edit " + std::to_string(j.id) + " did not finish within " +
                                                     std::to_string(timeout_ms) + " ms (it is " +
                                                     infill_job_state_name(j.state) + ")"));
  });
}

infill_error* infill_job_result(const infill_job* job, const void** png, size_t* png_size) {
  return guarded(__func__, [&]() -> infill_error* {
    if (!job || !job->job) return invalid("job is NULL");
    if (!png || !png_size) return invalid("png and png_size must not be NULL");
    *png = nullptr;
    *png_size = 0;
    Job& j = *job->job;
    std::lock_guard lock(j.mu);
    if (j.state != INFILL_JOB_DONE)
      return to_c(make_error(INFILL_ERROR_CONFLICT, "edit " + std::to_string(j.id) + " is " + infill_job_state_name(j.state) +
                                                        ", not done: it has no result" +
                                                        (j.error ? " (" + j.error->e.message + ")" : std::string())));
    *png = j.result_png.data();
    *png_size = j.result_png.size();
    return nullptr;
  });
}

const char* infill_job_result_media_type(const infill_job* job) {
  if (!job || !job->job) return "";
  std::lock_guard lock(job->job->mu);
  return job->job->state == INFILL_JOB_DONE ? job->job->result_media_type.c_str() : "";
}

const infill_error* infill_job_error(const infill_job* job) {
  if (!job || !job->job) return nullptr;
  std::lock_guard lock(job->job->mu);
  return job->job->error.get();
}

infill_error* infill_job_write_result(const infill_job* job, const char* path) {
  return guarded(__func__, [&]() -> infill_error* {
    if (!path || !*path) return invalid("path is NULL or empty");
    const void* png = nullptr;
    size_t size = 0;
    if (infill_error* e = infill_job_result(job, &png, &size)) return e;
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    if (!out) return to_c(make_error(INFILL_ERROR_IO, std::string("cannot write ") + path + ": " + std::strerror(errno)));
    out.write(static_cast<const char*>(png), static_cast<std::streamsize>(size));
    out.close();
    if (!out) return to_c(make_error(INFILL_ERROR_IO, std::string("writing ") + path + " failed: " + std::strerror(errno)));
    return nullptr;
  });
}

void infill_job_release(infill_job* job) { delete job; }

}  // extern "C"
