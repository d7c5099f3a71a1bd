#pragma once
/// multipart/form-data bodies (RFC 7578) as sent by curl -F and browsers' FormData.
///
/// Pure functions; thread-safe.

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace infill {

struct FormPart {
  std::string name;          ///< form field name
  std::string filename;      ///< "" when the part is not a file
  std::string content_type;  ///< "" when absent
  std::string data;          ///< the raw bytes
};

/// The boundary parameter of a multipart/form-data content type. Errors: another media type,
/// a missing or over-long (> 70 characters) boundary.
Result<std::string> multipart_boundary(std::string_view content_type);

/// Splits `body` into its parts. Errors (invalid_argument, naming what is wrong): no opening
/// boundary, a part without headers or without a name, no closing boundary, more than
/// `max_parts` parts.
Result<std::vector<FormPart>> parse_multipart(std::string_view body, std::string_view boundary, size_t max_parts = 64);

/// Standard base64 (RFC 4648, padding optional, whitespace ignored). Errors name the offset
/// of the first character outside the alphabet.
Result<std::string> base64_decode(std::string_view text);
std::string base64_encode(std::string_view bytes);

}  // namespace infill
