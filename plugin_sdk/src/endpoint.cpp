#include "endpoint.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace infill::sdk {
namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

Result<std::string> read_token_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(INFILL_ERROR_IO, "cannot read the token file " + path + ": " + std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  std::string t = ss.str();
  while (!t.empty() && (t.back() == '\n' || t.back() == '\r' || t.back() == ' ')) t.pop_back();
  if (t.empty()) return make_error(INFILL_ERROR_INVALID_ARGUMENT, "the token file " + path + " is empty");
  return t;
}

}  // namespace

std::string default_endpoint() {
  if (std::string e = env("INFILL_ENDPOINT"); !e.empty()) return e;
  const std::string runtime = env("XDG_RUNTIME_DIR");
  if (!runtime.empty()) return "unix:" + runtime + "/infill/engine.sock";
  return "unix:/tmp/infill-" + std::to_string(::getuid()) + "/engine.sock";
}

Result<Endpoint> parse_endpoint(std::string_view text_in) {
  const std::string text = text_in.empty() ? default_endpoint() : std::string(text_in);
  const std::string expected = " (expected \"unix:/path/to/engine.sock\" or \"http://HOST:PORT\")";
  Endpoint ep;
  if (text.rfind("unix:", 0) == 0) {
    std::string path = text.substr(5);
    if (path.rfind("//", 0) == 0) path = path.substr(2);  // unix:///abs/path
    if (path.empty()) return make_error(INFILL_ERROR_INVALID_ARGUMENT, "endpoint '" + text + "' has no socket path" + expected);
    // sockaddr_un::sun_path holds 108 bytes including the NUL.
    if (path.size() > 107)
      return make_error(INFILL_ERROR_INVALID_ARGUMENT, "endpoint '" + text + "': the socket path is " +
                                                           std::to_string(path.size()) + " bytes, the limit is 107");
    ep.unix_path = path;
    ep.text = "unix:" + path;
    return ep;
  }
  if (text.rfind("https://", 0) == 0)
    return make_error(INFILL_ERROR_INVALID_ARGUMENT,
                      "endpoint '" + text + "': https is not supported; reach a remote engine through an SSH tunnel or a TLS proxy and use http://");
  if (text.rfind("http://", 0) != 0) return make_error(INFILL_ERROR_INVALID_ARGUMENT, "endpoint '" + text + "' is not understood" + expected);
  std::string rest = text.substr(7);
  if (!rest.empty() && rest.back() == '/') rest.pop_back();
  if (rest.find('/') != std::string::npos)
    return make_error(INFILL_ERROR_INVALID_ARGUMENT, "endpoint '" + text + "' has a path; give only http://HOST:PORT");
  std::string host, port;
  if (!rest.empty() && rest.front() == '[') {
    const size_t close = rest.find(']');
    if (close == std::string::npos) return make_error(INFILL_ERROR_INVALID_ARGUMENT, "endpoint '" + text + "': unclosed '[' in the IPv6 address");
    host = rest.substr(1, close - 1);
    if (close + 1 < rest.size()) {
      if (rest[close + 1] != ':') return make_error(INFILL_ERROR_INVALID_ARGUMENT, "endpoint '" + text + "': expected ':' after ']'");
      port = rest.substr(close + 2);
    }
  } else {
    const size_t colon = rest.rfind(':');
    if (colon != std::string::npos) {
      host = rest.substr(0, colon);
      port = rest.substr(colon + 1);
    } else {
      host = rest;
    }
  }
  if (host.empty()) return make_error(INFILL_ERROR_INVALID_ARGUMENT, "endpoint '" + text + "' has no host" + expected);
  if (port.empty())
    return make_error(INFILL_ERROR_INVALID_ARGUMENT, "endpoint '" + text + "' has no port; the engine listens where its --listen HOST:PORT says");
  char* end = nullptr;
  const long p = std::strtol(port.c_str(), &end, 10);
  if (end == port.c_str() || *end != '\0' || p < 1 || p > 65535)
    return make_error(INFILL_ERROR_INVALID_ARGUMENT, "endpoint '" + text + "': port '" + port + "' is not a number in 1..65535");
  ep.host = host;
  ep.port = static_cast<uint16_t>(p);
  ep.text = "http://" + (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(p);
  return ep;
}

Result<std::string> resolve_token(const char* token, const char* token_file) {
  if (token && *token) return std::string(token);
  if (token_file && *token_file) return read_token_file(token_file);
  if (std::string t = env("INFILL_TOKEN"); !t.empty()) return t;
  std::string config = env("XDG_CONFIG_HOME");
  if (config.empty()) config = env("HOME").empty() ? std::string("/tmp/.config") : env("HOME") + "/.config";
  const std::string path = config + "/infill/token";
  if (::access(path.c_str(), R_OK) == 0) return read_token_file(path);
  return std::string();
}

bool valid_client_name(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    const bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

}  // namespace infill::sdk
