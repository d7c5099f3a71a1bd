#pragma once
/// The engine's HTTP routes as one table: the dispatcher's 404 and 405 answers name routes
/// and methods from it, and GET /v1/openapi.json is generated from it (openapi.h) and from the
/// edit-parameter table. A test holds the dispatcher to it (every operation is routed, every
/// other method of a path is 405 naming the table's methods).

#include <array>
#include <string>
#include <string_view>

namespace infill {

/// What a request or a response carries.
enum class ApiBody {
  kNone,
  kJson,            ///< a JSON object (responses: documented per route)
  kImage,           ///< an encoded image, raw or as the 'image' part of multipart/form-data
  kSafetensors,     ///< a .safetensors file, raw or as the 'file' part of multipart/form-data
  kEditParameters,  ///< JSON edit parameters, or multipart/form-data with a 'mask' part
  kJsonOrResult,    ///< JSON status, or the result file with Accept: image/*
  kResult,          ///< the result file: PNG, TIFF or OpenEXR (the edit's output_format)
  kEventStream,     ///< text/event-stream (or a WebSocket after Upgrade)
  kPrometheusText,
};

struct ApiOperation {
  std::string_view method;  ///< upper case: GET, HEAD, POST, DELETE
  std::string_view path;    ///< with {id} for a path parameter
  std::string_view operation_id;
  std::string_view summary;
  ApiBody request = ApiBody::kNone;
  ApiBody response = ApiBody::kJson;
  int ok_status = 200;
  std::string_view error_statuses;  ///< space-separated, besides 401/403/503 common to all
  bool open_on_tcp = false;         ///< answers without the bearer token (only /health)
};

inline constexpr std::array<ApiOperation, 17> kApiOperations = {{
    {"GET", "/health", "getHealth", "Liveness and readiness: 200 when the models are loaded, 503 while loading",
     ApiBody::kNone, ApiBody::kJson, 200, "", true},
    {"HEAD", "/health", "headHealth", "The same as GET /health without a body", ApiBody::kNone, ApiBody::kNone, 200, "", true},
    {"GET", "/v1/models", "listModels", "The loaded models, the default first", ApiBody::kNone, ApiBody::kJson, 200, ""},
    {"GET", "/v1/metrics", "getMetrics", "Serving metrics as JSON", ApiBody::kNone, ApiBody::kJson, 200, ""},
    {"GET", "/metrics", "getPrometheusMetrics", "The same metrics in the Prometheus text format", ApiBody::kNone,
     ApiBody::kPrometheusText, 200, ""},
    {"GET", "/v1/openapi.json", "getOpenApi", "This document", ApiBody::kNone, ApiBody::kJson, 200, ""},
    {"POST", "/v1/templates", "createTemplate", "Upload an image to edit (decoded and encoded once)", ApiBody::kImage,
     ApiBody::kJson, 201, "400 413 415 429"},
    {"GET", "/v1/templates/{id}", "getTemplate", "A template's size and preparation state", ApiBody::kNone,
     ApiBody::kJson, 200, "404"},
    {"POST", "/v1/edits", "submitEdit", "Queue an edit; answered at once with its id", ApiBody::kEditParameters,
     ApiBody::kJson, 202, "400 404 413 415 429"},
    {"GET", "/v1/edits/{id}", "getEdit", "An edit's state; its result file with Accept: image/* once done",
     ApiBody::kNone, ApiBody::kJsonOrResult, 200, "404 409"},
    {"DELETE", "/v1/edits/{id}", "cancelEdit", "Cancel a live edit at its next step", ApiBody::kNone, ApiBody::kJson,
     200, "404 409"},
    {"GET", "/v1/edits/{id}/result", "getEditResult",
     "The result of a done edit: PNG, TIFF or OpenEXR as its output_format asked", ApiBody::kNone, ApiBody::kResult, 200,
     "404 409"},
    {"POST", "/v1/adapters", "createAdapter",
     "Upload a LoRA file (read for the model first: refused naming the key when it does not fit)",
     ApiBody::kSafetensors, ApiBody::kJson, 201, "400 404 413"},
    {"GET", "/v1/adapters", "listAdapters", "Every LoRA file in the adapter store", ApiBody::kNone, ApiBody::kJson, 200, ""},
    {"GET", "/v1/adapters/{id}", "getAdapter", "One LoRA file's format, rank, layers and size", ApiBody::kNone,
     ApiBody::kJson, 200, "404"},
    {"DELETE", "/v1/adapters/{id}", "deleteAdapter", "Remove a LoRA file (edits holding it finish with it)",
     ApiBody::kNone, ApiBody::kJson, 200, "404"},
    {"GET", "/v1/events", "streamEvents",
     "The client's events (queued, started, progress, preview, done, failed) as Server-Sent Events, or over a "
     "WebSocket with Upgrade: websocket",
     ApiBody::kNone, ApiBody::kEventStream, 200, ""},
}};

/// The table's path that `path` matches ("/v1/edits/7/result" -> "/v1/edits/{id}/result"), or
/// "" when none does.
inline std::string_view api_route_of(std::string_view path) {
  for (const ApiOperation& op : kApiOperations) {
    const std::string_view t = op.path;
    const size_t brace = t.find('{');
    if (brace == std::string_view::npos) {
      if (t == path) return t;
      continue;
    }
    const std::string_view suffix = t.substr(t.find('}') + 1);
    if (path.size() <= brace + suffix.size() || path.substr(0, brace) != t.substr(0, brace)) continue;
    if (path.substr(path.size() - suffix.size()) != suffix) continue;
    const std::string_view id = path.substr(brace, path.size() - brace - suffix.size());
    if (id.find('/') == std::string_view::npos) return t;
  }
  return {};
}

/// "GET, DELETE": the methods the table lists for the route `route` (a table path).
inline std::string api_methods_of(std::string_view route) {
  std::string r;
  for (const ApiOperation& op : kApiOperations) {
    if (op.path != route) continue;
    if (!r.empty()) r += ", ";
    r += op.method;
  }
  return r;
}

/// "/health, /v1/models, ...": every route once, for the 404 answer.
inline std::string api_route_list() {
  std::string r;
  std::string_view last;
  for (const ApiOperation& op : kApiOperations) {
    if (op.path == last) continue;
    last = op.path;
    if (!r.empty()) r += ", ";
    r += op.path;
  }
  return r;
}

}  // namespace infill
