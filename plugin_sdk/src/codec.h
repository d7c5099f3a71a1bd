#pragma once
// Byte codecs of the client: base64 (previews and masks travel as base64 in JSON) and a
// minimal PNG writer for 8-bit grey masks, deflated with zlib (the one library it needs; a
// mask's runs compress a hundredfold, which keeps big masks far below the engine's body limit).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace infill::sdk {

std::string base64_encode(std::string_view bytes);
/// nullopt when `text` is not base64.
std::optional<std::string> base64_decode(std::string_view text);

/// A PNG (8-bit grey) of `width` x `height` pixels, rows `stride` bytes apart; "" when zlib
/// runs out of memory.
std::string encode_grey_png(const uint8_t* pixels, uint32_t width, uint32_t height, size_t stride);

}  // namespace infill::sdk
