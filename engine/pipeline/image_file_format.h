#pragma once
/// The file formats an edit's result can take (PNG, TIFF, OpenEXR): names, media types and
/// signatures. Torch- and OIIO-free, for the server and infill-render.

#include <cstddef>
#include <optional>
#include <span>
#include <string_view>

namespace infill {

/// File formats an encoded result can take. Values only grow; 0 is never a real format.
enum class ImageFileFormat {
  kPng = 1,   ///< u8 or u16
  kTiff = 2,  ///< u8, u16 or float (half is written as float, which holds it exactly)
  kExr = 3,   ///< half or float, scene-linear by convention
};

/// "png", "tiff", "exr".
const char* image_file_format_name(ImageFileFormat format);
/// The format named "png", "tiff" (or "tif") or "exr"; nullopt for anything else.
std::optional<ImageFileFormat> parse_image_file_format(std::string_view name);
/// "image/png", "image/tiff", "image/x-exr".
const char* image_media_type(ImageFileFormat format);
/// The format whose signature `bytes` start with, or nullopt.
std::optional<ImageFileFormat> sniff_image_file_format(std::span<const std::byte> bytes);

}  // namespace infill
