#pragma once
/// A running infill-engine as the render backend: `--engine unix:PATH` or
/// `--engine http://HOST:PORT --token-file F`. Torch-free.

#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "render_backend.h"

namespace infill::render {

struct EngineAddress {
  std::string unix_path;  ///< set for unix:PATH
  std::string host;       ///< set for http://HOST:PORT
  uint16_t port = 0;
  std::string text;       ///< as given
};

/// Parses "unix:PATH" or "http://HOST:PORT". Errors name the text and the expected forms.
Result<EngineAddress> parse_engine_address(const std::string& text);

struct RemoteOptions {
  EngineAddress address;
  std::string token_file;  ///< required for http://
};

/// Connects and reads the engine's model. Errors (all mean exit 3): unreachable, token
/// refused, no model loaded; unimplemented while the client SDK is not part of the build.
Result<std::unique_ptr<RenderBackend>> open_remote_backend(const RemoteOptions& options);

}  // namespace infill::render
