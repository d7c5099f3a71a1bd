#pragma once
// Byte codecs the client needs without extra libraries: base64 (previews and masks travel as
// base64 in JSON) and a minimal PNG writer for 8-bit grey masks (stored deflate blocks, no
// compression: masks are sent once and the engine limits bodies, not pixels per byte).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace infill::sdk {

std::string base64_encode(std::string_view bytes);
/// nullopt when `text` is not base64.
std::optional<std::string> base64_decode(std::string_view text);

/// A PNG (8-bit grey) of `width` x `height` pixels, rows `stride` bytes apart.
std::string encode_grey_png(const uint8_t* pixels, uint32_t width, uint32_t height, size_t stride);

}  // namespace infill::sdk
