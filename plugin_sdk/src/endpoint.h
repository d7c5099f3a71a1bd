#pragma once
// Endpoint strings ("unix:/path", "http://host:port"), the engine's default socket and the
// token lookup for TCP.
#include <cstdint>
#include <string>
#include <string_view>

#include "status.h"

namespace infill::sdk {

struct Endpoint {
  std::string unix_path;  // non-empty: a Unix socket
  std::string host;       // otherwise TCP
  uint16_t port = 0;
  std::string text;  // canonical form, for messages
  bool is_unix() const { return !unix_path.empty(); }
};

/// Parses an endpoint string; "" means the default endpoint.
Result<Endpoint> parse_endpoint(std::string_view text);

/// $INFILL_ENDPOINT, else unix:$XDG_RUNTIME_DIR/infill/engine.sock (as infill-engine uses),
/// else unix:/tmp/infill-<uid>/engine.sock.
std::string default_endpoint();

/// The token for a TCP endpoint: `token`, else the contents of `token_file`, else $INFILL_TOKEN,
/// else $XDG_CONFIG_HOME/infill/token when it exists; "" when none.
Result<std::string> resolve_token(const char* token, const char* token_file);

/// 1-64 characters of A-Z a-z 0-9 . _ - (the engine's rule).
bool valid_client_name(std::string_view name);

}  // namespace infill::sdk
