#include "server/openapi.h"

#include <infill_protocol/edit_parameters.h>

#include <string>

#include "server/api_routes.h"

namespace infill {
namespace {

using nlohmann::json;
namespace proto = infill::protocol;

std::string lower(std::string_view s) {
  std::string r(s);
  for (char& c : r) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  return r;
}

json error_response(const std::string& description) {
  return {{"description", description},
          {"content", {{"application/json", {{"schema", {{"$ref", "#/components/schemas/Error"}}}}}}}};
}

const char* status_description(int status) {
  switch (status) {
    case 400: return "Invalid request: the message names the input and what was expected";
    case 401: return "Missing or wrong bearer token (TCP only)";
    case 403: return "Origin not allowed";
    case 404: return "No such template or edit";
    case 409: return "Conflict: the edit is not done, or already ended";
    case 413: return "Body too large (limits.max_body_bytes or max_image_pixels)";
    case 415: return "Unsupported media type";
    case 429: return "Too many live edits or templates; retry after Retry-After seconds";
    case 503: return "Not ready (loading) or the journal is unavailable; retry after Retry-After seconds";
  }
  return "Error";
}

json request_body(ApiBody body) {
  switch (body) {
    case ApiBody::kImage:
      return {{"required", true},
              {"content",
               {{"image/*", {{"schema", {{"type", "string"}, {"contentMediaType", "image/*"}}}}},
                {"application/octet-stream", {{"schema", {{"type", "string"}, {"contentMediaType", "image/*"}}}}},
                {"multipart/form-data",
                 {{"schema",
                   {{"type", "object"},
                    {"required", {"image"}},
                    {"properties", {{"image", {{"type", "string"}, {"contentMediaType", "image/*"}}}}}}}}}}}};
    case ApiBody::kEditParameters:
      return {{"required", true},
              {"content",
               {{"application/json", {{"schema", {{"$ref", "#/components/schemas/EditParameters"}}}}},
                {"multipart/form-data",
                 {{"schema",
                   {{"type", "object"},
                    {"description",
                     "A 'mask' file part, an optional 'params' part holding the JSON parameters, and any parameter "
                     "as its own field (numbers parsed as JSON)"},
                    {"properties",
                     {{"mask", {{"type", "string"}, {"contentMediaType", "image/png"}}},
                      {"params", {{"type", "string"}, {"contentMediaType", "application/json"}}}}}}}}}}}};
    case ApiBody::kSafetensors:
      return {{"required", true},
              {"content",
               {{"application/octet-stream", {{"schema", {{"type", "string"}, {"contentMediaType", "application/octet-stream"}}}}},
                {"multipart/form-data",
                 {{"schema",
                   {{"type", "object"},
                    {"required", {"file"}},
                    {"properties", {{"file", {{"type", "string"}, {"contentMediaType", "application/octet-stream"}}}}}}}}}}}};
    default: return nullptr;
  }
}

// The result file, in each of the formats output_format can ask for.
json result_content() {
  json content = json::object();
  for (const char* type : {"image/png", "image/tiff", "image/x-exr"})
    content[type] = {{"schema", {{"type", "string"}, {"contentMediaType", type}}}};
  return content;
}

json ok_content(ApiBody body, const std::string& schema_name) {
  const json object_schema = {{"$ref", "#/components/schemas/" + schema_name}};
  switch (body) {
    case ApiBody::kNone: return nullptr;
    case ApiBody::kJson: return {{"application/json", {{"schema", object_schema}}}};
    case ApiBody::kJsonOrResult: {
      json content = result_content();
      content["application/json"] = {{"schema", object_schema}};
      return content;
    }
    case ApiBody::kResult: return result_content();
    case ApiBody::kEventStream: return {{"text/event-stream", {{"schema", {{"type", "string"}}}}}};
    case ApiBody::kPrometheusText: return {{"text/plain", {{"schema", {{"type", "string"}}}}}};
    default: return nullptr;
  }
}

// The schema name of a route's JSON answer.
std::string response_schema(std::string_view operation_id) {
  if (operation_id == "getHealth") return "Health";
  if (operation_id == "listModels") return "Models";
  if (operation_id == "createTemplate" || operation_id == "getTemplate") return "Template";
  if (operation_id == "submitEdit") return "EditAccepted";
  if (operation_id == "getEdit" || operation_id == "cancelEdit") return "Edit";
  if (operation_id == "createAdapter" || operation_id == "getAdapter") return "Adapter";
  if (operation_id == "listAdapters") return "Adapters";
  if (operation_id == "deleteAdapter") return "AdapterDeleted";
  return "Object";
}

json loose_object(const std::string& description, json required = json::array(), json properties = json::object()) {
  json s = {{"type", "object"}, {"description", description}, {"additionalProperties", true}};
  if (!required.empty()) s["required"] = required;
  if (!properties.empty()) s["properties"] = properties;
  return s;
}

}  // namespace

json edit_parameters_schema() {
  json properties = json::object();
  for (const proto::EditParameter& p : proto::kEditParameters) {
    if (!(p.clients & proto::kApi)) continue;
    json s = {{"description", std::string(p.description)}};
    switch (p.type) {
      case proto::ParamType::kInteger:
      case proto::ParamType::kNumber:
        s["type"] = p.type == proto::ParamType::kInteger ? "integer" : "number";
        s[p.min_exclusive ? "exclusiveMinimum" : "minimum"] = p.min;
        s["maximum"] = p.max;
        break;
      case proto::ParamType::kString:
        s["type"] = "string";
        if (p.max_length > 0) s["maxLength"] = p.max_length;
        break;
      case proto::ParamType::kEnum: {
        json values = json::array();
        std::string_view rest = p.choices;
        while (!rest.empty()) {
          const size_t bar = rest.find('|');
          values.push_back(std::string(rest.substr(0, bar)));
          rest = bar == std::string_view::npos ? std::string_view() : rest.substr(bar + 1);
        }
        s["type"] = "string";
        s["enum"] = values;
        break;
      }
      case proto::ParamType::kRectangle:
        s["type"] = "array";
        s["items"] = {{"type", "integer"}, {"minimum", 0}};
        s["minItems"] = 4;
        s["maxItems"] = 4;
        break;
      case proto::ParamType::kAdapterList:
        s["type"] = "array";
        s["maxItems"] = p.max_length;
        s["items"] = {{"type", "object"},
                      {"required", {"id"}},
                      {"additionalProperties", false},
                      {"properties",
                       {{"id", {{"type", "string"}}},
                        {"strength", {{"type", "number"}, {"minimum", p.min}, {"maximum", p.max}, {"default", 1}}}}}};
        break;
      case proto::ParamType::kTemplateList:
        s["type"] = "array";
        s["maxItems"] = p.max_length;
        s["uniqueItems"] = true;
        s["items"] = {{"type", "string"}};
        break;
    }
    if (p.has_default) s["default"] = p.default_value;
    properties[std::string(p.name)] = s;
  }
  return {{"type", "object"},
          {"description", "Edit parameters (docs/api.md); give exactly one mask: mask_png_base64, mask_rect or a 'mask' part"},
          {"required", {"template"}},
          {"additionalProperties", false},
          {"properties", properties}};
}

json openapi_document() {
  json paths = json::object();
  for (const ApiOperation& op : kApiOperations) {
    json o = {{"operationId", std::string(op.operation_id)}, {"summary", std::string(op.summary)}};
    json responses = json::object();
    json ok = {{"description", "Success"}};
    if (json content = ok_content(op.response, response_schema(op.operation_id)); !content.is_null()) ok["content"] = content;
    if (op.response == ApiBody::kEventStream) ok["description"] = "The event stream (101 Switching Protocols for a WebSocket)";
    responses[std::to_string(op.ok_status)] = ok;
    std::string errors(op.error_statuses);
    errors += op.open_on_tcp ? " 503" : " 401 403 503";
    size_t at = 0;
    while (at < errors.size()) {
      const size_t end = errors.find(' ', at);
      const std::string code = errors.substr(at, end == std::string::npos ? std::string::npos : end - at);
      if (!code.empty()) responses[code] = error_response(status_description(std::stoi(code)));
      if (end == std::string::npos) break;
      at = end + 1;
    }
    o["responses"] = responses;
    if (json body = request_body(op.request); !body.is_null()) o["requestBody"] = body;
    json parameters = json::array();
    if (std::string_view(op.path).find("{id}") != std::string_view::npos)
      parameters.push_back({{"$ref", "#/components/parameters/" +
                                         std::string(std::string_view(op.path).rfind("/v1/templates", 0) == 0  ? "TemplateId"
                                                     : std::string_view(op.path).rfind("/v1/adapters", 0) == 0 ? "AdapterId"
                                                                                                                : "EditId")}});
    if (op.operation_id == "createAdapter") {
      parameters.push_back({{"name", "name"}, {"in", "query"}, {"schema", {{"type", "string"}}},
                            {"description", "The adapter's name (default: the multipart file name, else 'adapter')"}});
      parameters.push_back({{"name", "model"}, {"in", "query"}, {"schema", {{"type", "string"}}},
                            {"description", "The model the LoRA is read for (default: the default model)"}});
    }
    if (op.operation_id == "createTemplate")
      parameters.push_back({{"name", "name"}, {"in", "query"}, {"schema", {{"type", "string"}}},
                            {"description", "The template's name (default: the multipart file name, else 'upload')"}});
    if (op.operation_id == "streamEvents") {
      parameters.push_back({{"name", "client"}, {"in", "query"}, {"schema", {{"type", "string"}}},
                            {"description", "Whose events (default: the X-Infill-Client header, else 'default')"}});
      parameters.push_back({{"name", "all"}, {"in", "query"}, {"schema", {{"type", "string"}}},
                            {"description", "Present: every client's events"}});
    }
    if (!parameters.empty()) o["parameters"] = parameters;
    // Unix-socket clients need no token; on TCP every route but /health needs the bearer.
    o["security"] = op.open_on_tcp ? json::array({json::object()}) : json::array({json::object(), {{"bearer", json::array()}}});
    paths[std::string(op.path)][lower(op.method)] = o;
  }
  json schemas = {
      {"Error",
       {{"type", "object"},
        {"required", {"error"}},
        {"properties",
         {{"error",
           {{"type", "object"},
            {"required", {"code", "message", "type"}},
            {"properties",
             {{"code", {{"type", "string"}, {"description", "a stable snake_case word, e.g. invalid_parameter"}}},
              {"message", {{"type", "string"}, {"description", "names the input at fault and what was expected"}}},
              {"type", {{"type", "string"}}}}}}}}}}},
      {"EditParameters", edit_parameters_schema()},
      {"Health", loose_object("Readiness and the loaded models", {"status"},
                              {{"status", {{"type", "string"}}}, {"model", {{"type", "string"}}},
                               {"models", {{"type", "array"}, {"items", {{"type", "string"}}}}},
                               {"devices", {{"type", "array"},
                                            {"items", loose_object("A compute device and whether it serves", {"device", "in_service"},
                                                                   {{"device", {{"type", "string"}}},
                                                                    {"in_service", {{"type", "boolean"}}},
                                                                    {"workers", {{"type", "array"}, {"items", {{"type", "integer"}}}}},
                                                                    {"fault", {{"type", "string"}}}})}}},
                               {"workers", {{"type", "array"}, {"items", loose_object("A worker (step loop)")}}},
                               {"device_team", loose_object("Sequence parallelism over the devices", {"in_use"},
                                                            {{"in_use", {{"type", "boolean"}}},
                                                             {"why", {{"type", "string"}}}})},
                               {"live_edits", {{"type", "integer"}}}})},
      {"Models", loose_object("The loaded models, the default first", {"models"},
                              {{"models", {{"type", "array"}, {"items", loose_object("A model (docs/api.md)")}}}})},
      {"Template", loose_object("A template", {"id"},
                                {{"id", {{"type", "string"}}}, {"width", {{"type", "integer"}}},
                                 {"height", {{"type", "integer"}}}, {"state", {{"type", "string"}}}})},
      {"EditAccepted", loose_object("The queued edit", {"id", "state"},
                                    {{"id", {{"type", "integer"}}}, {"state", {{"type", "string"}}},
                                     {"status_url", {{"type", "string"}}}})},
      {"Edit", loose_object("An edit's state and, once ended, its metrics or error", {"id"},
                            {{"id", {{"type", "integer"}}}, {"state", {{"type", "string"}}}})},
      {"Adapter", loose_object("A LoRA file in the engine's adapter store", {"id"},
                               {{"id", {{"type", "string"}, {"description", "SHA-256 of the file's bytes"}}},
                                {"name", {{"type", "string"}}}, {"format", {{"type", "string"}}},
                                {"rank", {{"type", "integer"}}}, {"layers", {{"type", "integer"}}},
                                {"bytes", {{"type", "integer"}}}})},
      {"Adapters", loose_object("Every LoRA file in the adapter store", {"adapters"},
                                {{"adapters", {{"type", "array"}, {"items", {{"$ref", "#/components/schemas/Adapter"}}}}}})},
      {"AdapterDeleted",
       loose_object("A LoRA file removed from the store, with what was recorded with it", {"id", "state"},
                    {{"id", {{"type", "string"}}},
                     {"state", {{"type", "string"}, {"enum", {"deleted"}}}},
                     {"cache_entries_dropped",
                      {{"type", "integer"},
                       {"description", "activation cache entries recorded with the adapter, removed from every tier"}}}})},
      {"Object", loose_object("A JSON object (docs/api.md)")}};
  return {{"openapi", "3.1.0"},
          {"info",
           {{"title", "Infill engine API"},
            {"version", "1"},
            {"description",
             "infill-engine's HTTP/1.1 API (docs/api.md), on a Unix socket ($XDG_RUNTIME_DIR/infill/engine.sock) and, "
             "with --listen, on TCP with a bearer token. Generated from the engine's route and parameter tables."}}},
          {"servers", {{{"url", "http://localhost"}, {"description", "the Unix socket, or --listen's address"}}}},
          {"paths", paths},
          {"components",
           {{"schemas", schemas},
            {"parameters",
             {{"EditId", {{"name", "id"}, {"in", "path"}, {"required", true}, {"schema", {{"type", "integer"}, {"minimum", 1}}}}},
              {"TemplateId", {{"name", "id"}, {"in", "path"}, {"required", true}, {"schema", {{"type", "string"}}}}},
              {"AdapterId", {{"name", "id"}, {"in", "path"}, {"required", true}, {"schema", {{"type", "string"}}}}}}},
            {"securitySchemes", {{"bearer", {{"type", "http"}, {"scheme", "bearer"}}}}}}}};
}

}  // namespace infill
