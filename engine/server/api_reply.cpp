#include "server/api_reply.h"

namespace infill {

ApiReply json_reply(int status, const nlohmann::json& body) {
  ApiReply r;
  r.status = status;
  // Replace invalid UTF-8 instead of throwing: messages may quote client input.
  r.body = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return r;
}

const char* error_type_for(int http_status) {
  switch (http_status) {
    case 401: return "authentication";
    case 403: return "permission";
    case 404: return "not_found";
    case 409: return "conflict";
    case 429: return "rate_limit";
    case 503: return "unavailable";
    default: return http_status >= 500 ? "server" : "invalid_request";
  }
}

ApiReply error_reply(int http_status, std::string_view code, std::string_view message) {
  nlohmann::json body = {{"error",
                          {{"code", std::string(code)},
                           {"message", std::string(message)},
                           {"type", error_type_for(http_status)}}}};
  return json_reply(http_status, body);
}

ApiReply status_reply(const Status& status, bool too_large_is_413) {
  switch (status.code()) {
    case ErrorCode::kOk: return json_reply(200, nlohmann::json::object());
    case ErrorCode::kInvalidArgument: return error_reply(400, "invalid_argument", status.message());
    case ErrorCode::kCorruptData: return error_reply(400, "corrupt_data", status.message());
    case ErrorCode::kOutOfRange:
      return error_reply(too_large_is_413 ? 413 : 400, "out_of_range", status.message());
    case ErrorCode::kNotFound: return error_reply(404, "not_found", status.message());
    case ErrorCode::kResourceExhausted: return error_reply(429, "resource_exhausted", status.message());
    case ErrorCode::kCancelled: return error_reply(409, "cancelled", status.message());
    case ErrorCode::kUnimplemented: return error_reply(501, "unimplemented", status.message());
    case ErrorCode::kUnavailable: return error_reply(503, "unavailable", status.message());
    default: return error_reply(500, error_code_name(status.code()), status.message());
  }
}

}  // namespace infill
