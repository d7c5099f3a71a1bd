#include "pipeline/image_file_format.h"

#include <initializer_list>

namespace infill {

const char* image_file_format_name(ImageFileFormat format) {
  switch (format) {
    case ImageFileFormat::kPng:
      return "png";
    case ImageFileFormat::kTiff:
      return "tiff";
    case ImageFileFormat::kExr:
      return "exr";
  }
  return "unknown";
}

std::optional<ImageFileFormat> parse_image_file_format(std::string_view name) {
  if (name == "png") return ImageFileFormat::kPng;
  if (name == "tiff" || name == "tif") return ImageFileFormat::kTiff;
  if (name == "exr") return ImageFileFormat::kExr;
  return std::nullopt;
}

const char* image_media_type(ImageFileFormat format) {
  switch (format) {
    case ImageFileFormat::kPng:
      return "image/png";
    case ImageFileFormat::kTiff:
      return "image/tiff";
    case ImageFileFormat::kExr:
      return "image/x-exr";
  }
  return "application/octet-stream";
}

std::optional<ImageFileFormat> sniff_image_file_format(std::span<const std::byte> bytes) {
  auto starts = [&](std::initializer_list<int> magic) {
    if (bytes.size() < magic.size()) return false;
    size_t i = 0;
    for (int b : magic)
      if (std::to_integer<int>(bytes[i++]) != b) return false;
    return true;
  };
  if (starts({0x89, 'P', 'N', 'G'})) return ImageFileFormat::kPng;
  if (starts({'I', 'I', 0x2A, 0x00}) || starts({'M', 'M', 0x00, 0x2A})) return ImageFileFormat::kTiff;
  if (starts({0x76, 0x2F, 0x31, 0x01})) return ImageFileFormat::kExr;
  return std::nullopt;
}

}  // namespace infill
