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
  uint32_t ready_timeout_ms = 60000;  ///< wait this long for an engine still loading its model
};

/// Connects through the client SDK (plugin_sdk, libinfill_client) and reads the engine's
/// model. Errors (all mean exit 3): unreachable, token refused, no model. Edits run as class
/// `batch` (journaled by the engine); each template, LoRA (for the engine's model) and reference
/// image is uploaded once per run; the engine's
/// progress and results come back through the SDK's callbacks. --no-cache has no effect here.
Result<std::unique_ptr<RenderBackend>> open_remote_backend(const RemoteOptions& options);

}  // namespace infill::render
