#pragma once
/// What one API call answers: an HTTP status, a content type and a body. The engine service
/// produces these; the HTTP server only frames them. Errors always carry the JSON body
/// {"error":{"code":...,"message":...,"type":...}}.
///
/// Value types, no state; every function is thread-safe.

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace infill {

struct ApiReply {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  /// Seconds a client should wait before retrying (Retry-After on 429 / 503); 0 = none.
  int retry_after_s = 0;
};

/// A JSON body with `status`.
ApiReply json_reply(int status, const nlohmann::json& body);

/// An error reply. `code` is a stable snake_case word ("invalid_json", "not_found", ...);
/// `message` names the input at fault; the error `type` is derived from the HTTP status
/// (invalid_request, authentication, permission, not_found, conflict, rate_limit,
/// unavailable, server).
ApiReply error_reply(int http_status, std::string_view code, std::string_view message);

/// Maps an engine Status to an error reply: invalid_argument / out_of_range / corrupt_data
/// -> 400 (out_of_range on image size -> 413 when `too_large_is_413`), not_found -> 404,
/// resource_exhausted -> 429, cancelled -> 409, others -> 500.
ApiReply status_reply(const Status& status, bool too_large_is_413 = false);

/// "invalid_request", "authentication", ... for an HTTP status.
const char* error_type_for(int http_status);

}  // namespace infill
