#include "output_stamp.h"

#include <cstring>
#include <filesystem>

#include <OpenImageIO/filesystem.h>
#include <OpenImageIO/imageio.h>
#include <nlohmann/json.hpp>

#include "pipeline/image_file_format.h"
#include "png_text.h"

namespace infill::render {
namespace {

constexpr const char* kDescription = "ImageDescription";

// OIIO joins several errors with newlines; messages here are one line.
std::string one_line(std::string text) {
  for (char& c : text)
    if (c == '\n') c = ' ';
  return text;
}

}  // namespace

Result<std::vector<std::byte>> stamp_output(const std::vector<std::byte>& file,
                                            const std::vector<std::pair<std::string, std::string>>& texts) {
  const auto format = sniff_image_file_format(file);
  if (!format) return invalid_argument("stamp_output: the result is not a PNG, TIFF or OpenEXR file");
  if (*format == ImageFileFormat::kPng) return add_png_text(file, texts);

  OIIO::Filesystem::IOMemReader reader(file.data(), file.size());
  const bool exr = *format == ImageFileFormat::kExr;
  auto input = OIIO::ImageInput::open(exr ? "result.exr" : "result.tif", nullptr, &reader);
  if (!input) return corrupt_data("stamp_output: the result cannot be read: " + one_line(OIIO::geterror()));
  OIIO::ImageSpec spec = input->spec();
  std::vector<std::byte> pixels(spec.image_bytes(true));
  // Samples in their stored type (half stays half), so the rewrite changes no pixel.
  if (!input->read_image(0, 0, 0, spec.nchannels, spec.format, pixels.data()))
    return corrupt_data("stamp_output: the result cannot be decoded: " + one_line(input->geterror()));
  input->close();
  if (exr) {
    for (const auto& [keyword, text] : texts) spec.attribute(keyword, text);
  } else {
    nlohmann::json description = nlohmann::json::object();
    for (const auto& [keyword, text] : texts) description[keyword] = text;
    spec.attribute(kDescription, description.dump());
  }
  OIIO::Filesystem::IOVecOutput sink;
  auto output = OIIO::ImageOutput::create(exr ? "openexr" : "tiff", &sink);
  if (!output) return Status(ErrorCode::kInternal, "stamp_output: no writer: " + one_line(OIIO::geterror()));
  bool ok = output->open(exr ? "stamped.exr" : "stamped.tif", spec) && output->write_image(spec.format, pixels.data());
  ok = output->close() && ok;
  if (!ok) return Status(ErrorCode::kInternal, "stamp_output: " + one_line(output->geterror()));
  const auto& buffer = sink.buffer();
  std::vector<std::byte> out(buffer.size());
  std::memcpy(out.data(), buffer.data(), buffer.size());
  return out;
}

std::optional<std::string> read_output_stamp(const std::string& path, const std::string& keyword) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return std::nullopt;
  const std::string extension = std::filesystem::path(path).extension().string();
  if (extension == ".png" || extension == ".PNG") return read_png_text(path, keyword);
  auto input = OIIO::ImageInput::open(path);
  if (!input) {
    OIIO::geterror();  // an unreadable output is simply not up to date
    return std::nullopt;
  }
  const OIIO::ImageSpec& spec = input->spec();
  if (input->format_name() == std::string("openexr")) {
    const OIIO::ParamValue* p = spec.find_attribute(keyword, OIIO::TypeDesc::STRING);
    if (!p) return std::nullopt;
    return spec.get_string_attribute(keyword);
  }
  const nlohmann::json description = nlohmann::json::parse(spec.get_string_attribute(kDescription), nullptr, false);
  if (!description.is_object() || !description.contains(keyword) || !description[keyword].is_string()) return std::nullopt;
  return description[keyword].get<std::string>();
}

}  // namespace infill::render
