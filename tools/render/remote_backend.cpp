#include "remote_backend.h"

namespace infill::render {

Result<EngineAddress> parse_engine_address(const std::string& text) {
  const std::string expected = "; expected unix:PATH or http://HOST:PORT";
  EngineAddress a;
  a.text = text;
  if (text.rfind("unix:", 0) == 0) {
    a.unix_path = text.substr(5);
    if (a.unix_path.empty()) return invalid_argument("--engine " + text + ": the socket path is empty" + expected);
    return a;
  }
  if (text.rfind("http://", 0) == 0) {
    std::string rest = text.substr(7);
    if (!rest.empty() && rest.back() == '/') rest.pop_back();
    const size_t colon = rest.rfind(':');
    if (colon == std::string::npos || colon == 0)
      return invalid_argument("--engine " + text + ": no host or port" + expected);
    a.host = rest.substr(0, colon);
    const std::string port = rest.substr(colon + 1);
    if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
        std::stoi(port) < 1 || std::stoi(port) > 65535)
      return invalid_argument("--engine " + text + ": port '" + port + "' is not in 1..65535" + expected);
    a.port = static_cast<uint16_t>(std::stoi(port));
    return a;
  }
  return invalid_argument("--engine " + text + ": unknown scheme" + expected);
}

Result<std::unique_ptr<RenderBackend>> open_remote_backend(const RemoteOptions& options) {
  if (!options.address.host.empty() && options.token_file.empty())
    return invalid_argument("--engine " + options.address.text + " needs --token-file (TCP engines require a token)");
  return Status(ErrorCode::kUnimplemented,
                "--engine " + options.address.text +
                    ": this build has no remote backend yet (it needs the client SDK, plugin_sdk/infill_client); "
                    "run without --engine to use the embedded engine");
}

}  // namespace infill::render
