#include "server/multipart.h"

#include <algorithm>
#include <cctype>

namespace infill {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

// Value of `param` in a header value such as `form-data; name="mask"; filename="m.png"`.
// Items are split at ';' outside double quotes.
std::string header_param(std::string_view value, std::string_view param) {
  size_t start = 0;
  bool quoted = false;
  for (size_t i = 0; i <= value.size(); ++i) {
    if (i < value.size() && value[i] == '"') quoted = !quoted;
    if (i < value.size() && (quoted || value[i] != ';')) continue;
    const std::string_view item = value.substr(start, i - start);
    start = i + 1;
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) continue;
    if (lower(trim(item.substr(0, eq))) != param) continue;
    std::string_view v = trim(item.substr(eq + 1));
    if (v.size() >= 2 && v.front() == '"' && v.back() == '"') v = v.substr(1, v.size() - 2);
    return std::string(v);
  }
  return {};
}

}  // namespace

Result<std::string> multipart_boundary(std::string_view content_type) {
  const std::string ct = lower(content_type);
  if (ct.rfind("multipart/form-data", 0) != 0)
    return invalid_argument("content type " + std::string(content_type) + " is not multipart/form-data");
  std::string b = header_param(content_type, "boundary");
  if (b.empty()) return invalid_argument("multipart/form-data content type has no boundary parameter");
  if (b.size() > 70) return invalid_argument("multipart boundary is longer than 70 characters");
  return b;
}

Result<std::vector<FormPart>> parse_multipart(std::string_view body, std::string_view boundary, size_t max_parts) {
  const std::string delim = "--" + std::string(boundary);
  std::vector<FormPart> parts;
  size_t pos = body.find(delim);
  if (pos == std::string_view::npos) return invalid_argument("multipart body has no opening boundary");
  pos += delim.size();
  for (;;) {
    if (body.substr(pos, 2) == "--") return parts;  // closing boundary
    if (body.substr(pos, 2) != "\r\n") return invalid_argument("multipart boundary is not followed by CRLF");
    pos += 2;
    const size_t header_end = body.find("\r\n\r\n", pos);
    if (header_end == std::string_view::npos)
      return invalid_argument("multipart part " + std::to_string(parts.size() + 1) + " has no end of headers");
    FormPart part;
    std::string_view headers = body.substr(pos, header_end - pos);
    while (!headers.empty()) {
      const size_t eol = headers.find("\r\n");
      const std::string_view line = headers.substr(0, eol);
      headers = eol == std::string_view::npos ? std::string_view() : headers.substr(eol + 2);
      const size_t colon = line.find(':');
      if (colon == std::string_view::npos)
        return invalid_argument("multipart part " + std::to_string(parts.size() + 1) + " has a header line without ':'");
      const std::string key = lower(trim(line.substr(0, colon)));
      const std::string_view value = trim(line.substr(colon + 1));
      if (key == "content-disposition") {
        part.name = header_param(value, "name");
        part.filename = header_param(value, "filename");
      } else if (key == "content-type") {
        part.content_type = std::string(value);
      }
    }
    if (part.name.empty())
      return invalid_argument("multipart part " + std::to_string(parts.size() + 1) +
                              " has no Content-Disposition name");
    const size_t data_start = header_end + 4;
    const size_t next = body.find("\r\n" + delim, data_start);
    if (next == std::string_view::npos)
      return invalid_argument("multipart part '" + part.name + "' has no closing boundary (body truncated?)");
    part.data = std::string(body.substr(data_start, next - data_start));
    parts.push_back(std::move(part));
    if (parts.size() > max_parts) return invalid_argument("multipart body has more than " + std::to_string(max_parts) + " parts");
    pos = next + 2 + delim.size();
  }
}

Result<std::string> base64_decode(std::string_view text) {
  std::string out;
  out.reserve(text.size() / 4 * 3);
  uint32_t acc = 0;
  int bits = 0;
  size_t pad = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    int v;
    if (c >= 'A' && c <= 'Z') v = c - 'A';
    else if (c >= 'a' && c <= 'z') v = c - 'a' + 26;
    else if (c >= '0' && c <= '9') v = c - '0' + 52;
    else if (c == '+') v = 62;
    else if (c == '/') v = 63;
    else if (c == '=') { ++pad; continue; }
    else if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
    else return invalid_argument("base64 text has an invalid character at offset " + std::to_string(i));
    if (pad > 0) return invalid_argument("base64 text has data after '=' padding at offset " + std::to_string(i));
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  return out;
}

std::string base64_encode(std::string_view bytes) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t n = (uint32_t(uint8_t(bytes[i])) << 16) | (uint32_t(uint8_t(bytes[i + 1])) << 8) | uint8_t(bytes[i + 2]);
    out += kAlphabet[n >> 18];
    out += kAlphabet[(n >> 12) & 63];
    out += kAlphabet[(n >> 6) & 63];
    out += kAlphabet[n & 63];
  }
  if (i < bytes.size()) {
    uint32_t n = uint32_t(uint8_t(bytes[i])) << 16;
    if (i + 1 < bytes.size()) n |= uint32_t(uint8_t(bytes[i + 1])) << 8;
    out += kAlphabet[n >> 18];
    out += kAlphabet[(n >> 12) & 63];
    out += i + 1 < bytes.size() ? kAlphabet[(n >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

}  // namespace infill
