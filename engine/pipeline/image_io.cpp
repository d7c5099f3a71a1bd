#include "pipeline/image_io.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <span>
#include <stdexcept>

#include <ATen/ATen.h>
#include <c10/util/Half.h>

#include "pipeline/colour_transfer.h"
#ifdef INFILL_HAVE_OIIO
#include <OpenImageIO/filesystem.h>
#include <OpenImageIO/imageio.h>
#endif

namespace infill {
namespace {

namespace fs = std::filesystem;

constexpr int kMaxChannels = 4;

#ifdef INFILL_HAVE_OIIO
OIIO::TypeDesc oiio_type(PixelFormat format) {
  switch (format) {
    case PixelFormat::kU8:
      return OIIO::TypeDesc::UINT8;
    case PixelFormat::kU16:
      return OIIO::TypeDesc::UINT16;
    case PixelFormat::kF32:
      return OIIO::TypeDesc::FLOAT;
    case PixelFormat::kF16:
      return OIIO::TypeDesc::HALF;
  }
  throw std::invalid_argument("unknown PixelFormat");
}

// The file extension of the format the leading bytes announce, or "" when unknown. OIIO
// picks its reader by the name's extension; without one it probes every reader. Measured
// with 32 threads decoding at once (test_image_io, "[threads]"): now and then a decode then
// fails with no message (OIIO 2.4), while the same bytes under a .png name never do. Naming
// the content's format sends both the memory and the file path straight to the right reader.
std::string sniffed_extension(std::span<const std::byte> bytes) {
  auto starts = [&](std::initializer_list<int> magic, size_t at = 0) {
    if (bytes.size() < at + magic.size()) return false;
    size_t i = at;
    for (int b : magic)
      if (std::to_integer<int>(bytes[i++]) != b) return false;
    return true;
  };
  if (const auto format = sniff_image_file_format(bytes)) {
    return *format == ImageFileFormat::kPng ? ".png" : *format == ImageFileFormat::kTiff ? ".tif" : ".exr";
  }
  if (starts({0xFF, 0xD8, 0xFF})) return ".jpg";
  if (starts({'8', 'B', 'P', 'S'})) return ".psd";
  if (starts({'G', 'I', 'F', '8'})) return ".gif";
  if (starts({'R', 'I', 'F', 'F'}) && starts({'W', 'E', 'B', 'P'}, 8)) return ".webp";
  if (starts({'B', 'M'})) return ".bmp";
  return "";
}

#endif
std::string size_text(int64_t width, int64_t height) {
  return std::to_string(width) + "x" + std::to_string(height);
}

#ifdef INFILL_HAVE_OIIO
// OIIO joins several errors with newlines; messages here are single lines.
std::string one_line(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  for (size_t pos = text.find('\n'); pos != std::string::npos; pos = text.find('\n', pos)) {
    text.replace(pos, 1, "; ");
  }
  return text;
}

#endif
Status check_image(const PixelImage& image, const std::string& what) {
  if (image.width <= 0 || image.height <= 0) {
    return invalid_argument(what + ": image is " + size_text(image.width, image.height) +
                            ", expected a positive size");
  }
  if (image.channels < 1 || image.channels > kMaxChannels) {
    return invalid_argument(what + ": image has " + std::to_string(image.channels) +
                            " channels, expected 1 to 4");
  }
  if (image.format != PixelFormat::kU8 && image.format != PixelFormat::kU16 &&
      image.format != PixelFormat::kF32 && image.format != PixelFormat::kF16) {
    return invalid_argument(what + ": image has an unknown pixel format");
  }
  if (image.data.size() != image.expected_bytes()) {
    return invalid_argument(what + ": image data is " + std::to_string(image.data.size()) +
                            " bytes, expected " + std::to_string(image.expected_bytes()));
  }
  return Status::success();
}

#ifdef INFILL_HAVE_OIIO
// Pixels travel exactly as the file stores them. By default OIIO premultiplies colour by
// alpha when reading unassociated-alpha files (PNG, most TIFFs) and divides when writing them,
// which would change colour bytes under partial alpha (and zero them where alpha is 0), so
// both directions ask for the data untouched.
OIIO::ImageSpec make_spec(const PixelImage& image, OIIO::TypeDesc format) {
  OIIO::ImageSpec spec(image.width, image.height, image.channels, format);
  if (image.channels == 2) spec.alpha_channel = 1;
  if (image.channels == 4) spec.alpha_channel = 3;
  spec.attribute("oiio:UnassociatedAlpha", 1);
  return spec;
}

// The source's ICC profile, for writers that store one (PNG, TIFF, JPEG); OpenEXR has none.
void attach_icc_profile(OIIO::ImageSpec& spec, const PixelImage& image) {
  if (image.icc_profile.empty()) return;
  spec.attribute("ICCProfile", OIIO::TypeDesc(OIIO::TypeDesc::UINT8, static_cast<int>(image.icc_profile.size())),
                 image.icc_profile.data());
}

OIIO::ImageSpec read_config() {
  OIIO::ImageSpec config;
  config.attribute("oiio:UnassociatedAlpha", 1);
  return config;
}

// Reads the first subimage from an opened input. `what` names the source in messages.
Result<PixelImage> read_opened(OIIO::ImageInput& input, const std::string& what,
                               int64_t max_pixels) {
  const OIIO::ImageSpec& spec = input.spec();
  if (spec.width <= 0 || spec.height <= 0 || spec.depth > 1) {
    std::string size = size_text(spec.width, spec.height);
    if (spec.depth > 1) size.append("x").append(std::to_string(spec.depth));
    return corrupt_data("image " + what + " has size " + size + ", expected a positive 2-D size");
  }
  const int64_t pixels = static_cast<int64_t>(spec.width) * spec.height;
  if (pixels > max_pixels) {
    return out_of_range("image " + what + " has " + std::to_string(pixels) + " pixels (" +
                        size_text(spec.width, spec.height) + "), more than the limit of " +
                        std::to_string(max_pixels));
  }
  if (spec.deep) return corrupt_data("image " + what + " is a deep image, expected flat pixels");
  if (spec.nchannels < 1) return corrupt_data("image " + what + " has no channels");

  PixelFormat format = PixelFormat::kF32;
  if (spec.format.basetype == OIIO::TypeDesc::UINT8) format = PixelFormat::kU8;
  if (spec.format.basetype == OIIO::TypeDesc::UINT16) format = PixelFormat::kU16;
  if (spec.format.basetype == OIIO::TypeDesc::HALF) format = PixelFormat::kF16;
  const int channels = std::min(spec.nchannels, kMaxChannels);
  PixelImage image = PixelImage::allocate(spec.width, spec.height, channels, format);
  image.file_format = input.format_name();
  if (const OIIO::ParamValue* icc = spec.find_attribute("ICCProfile");
      icc && icc->type().basetype == OIIO::TypeDesc::UINT8 && icc->type().size() > 0) {
    const auto* bytes = static_cast<const std::byte*>(icc->data());
    image.icc_profile.assign(bytes, bytes + icc->type().size());
  }
  // OIIO names the colour space it assumes: "Linear" for OpenEXR and HDR, "sRGB" or nothing
  // for integer formats. Integer samples are display-referred whatever a file claims.
  const std::string colour_space = OIIO::Strutil::lower(spec.get_string_attribute("oiio:ColorSpace"));
  image.scene_linear = (format == PixelFormat::kF32 || format == PixelFormat::kF16) &&
                       (colour_space == "linear" || colour_space == "scene_linear" || colour_space == "lin_srgb");
  // One thread per read: callers decode on their own threads already, and OIIO 2.4's
  // internally parallel read_image fails now and then, with no message, when many threads
  // read at once.
  input.threads(1);
  if (!input.read_image(0, 0, 0, channels, oiio_type(format), image.data.data())) {
    return corrupt_data("image " + what + " cannot be decoded: " + one_line(input.geterror()));
  }
  return image;
}

#endif
// Interleaved samples -> three float planes; grey (1 or 2 channels) fills all three, alpha is
// skipped.
template <class T, class Convert>
void planarize(const T* src, const PixelImage& image, float* const planes[3], Convert convert) {
  const int64_t n = image.pixel_count();
  const int channels = image.channels;
  if (channels >= 3) {
    for (int64_t i = 0; i < n; ++i) {
      const T* px = src + i * channels;
      planes[0][i] = convert(px[0]);
      planes[1][i] = convert(px[1]);
      planes[2][i] = convert(px[2]);
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const float v = convert(src[i * channels]);
      planes[0][i] = v;
      planes[1][i] = v;
      planes[2][i] = v;
    }
  }
}

#ifdef INFILL_HAVE_OIIO
// Replaces every occurrence of `from` in `text` by `to`.
std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  if (from.empty()) return text;
  for (size_t pos = text.find(from); pos != std::string::npos;
       pos = text.find(from, pos + to.size())) {
    text.replace(pos, from.size(), to);
  }
  return text;
}

// A unique name beside `path`: "<dir>/.<name>.tmp-<pid>-<n><ext>", keeping the extension so
// writers that look at the name see the intended format.
fs::path temp_sibling(const fs::path& path) {
  static std::atomic<uint64_t> counter{0};
  std::string name = ".";
  name += path.stem().string();
  name += ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter.fetch_add(1));
  name += path.extension().string();
  return path.parent_path() / name;
}

#endif

}  // namespace

size_t bytes_per_sample(PixelFormat format) {
  switch (format) {
    case PixelFormat::kU8:
      return 1;
    case PixelFormat::kU16:
      return 2;
    case PixelFormat::kF32:
      return 4;
    case PixelFormat::kF16:
      return 2;
  }
  throw std::invalid_argument("unknown PixelFormat");
}

const char* pixel_format_name(PixelFormat format) {
  switch (format) {
    case PixelFormat::kU8:
      return "u8";
    case PixelFormat::kU16:
      return "u16";
    case PixelFormat::kF32:
      return "f32";
    case PixelFormat::kF16:
      return "f16";
  }
  return "unknown";
}

ImageFileFormat native_file_format(const PixelImage& image) {
  if (image.file_format == "png") return ImageFileFormat::kPng;
  if (image.file_format == "tiff") return ImageFileFormat::kTiff;
  if (image.file_format == "openexr") return ImageFileFormat::kExr;
  const bool is_float = image.format == PixelFormat::kF32 || image.format == PixelFormat::kF16;
  return is_float ? ImageFileFormat::kExr : ImageFileFormat::kPng;
}

size_t PixelImage::expected_bytes() const {
  if (width <= 0 || height <= 0 || channels <= 0) return 0;
  return static_cast<size_t>(width) * height * channels * bytes_per_sample(format);
}

PixelImage PixelImage::allocate(int width, int height, int channels, PixelFormat format) {
  PixelImage image;
  image.width = width;
  image.height = height;
  image.channels = channels;
  image.format = format;
  image.data.assign(image.expected_bytes(), std::byte{0});
  return image;
}

#ifdef INFILL_HAVE_OIIO
Result<PixelImage> load_image(const std::string& path, int64_t max_pixels) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return not_found("image " + path + " does not exist");
  if (fs::is_directory(path, ec))
    return invalid_argument("image " + path + " is a directory, expected a file");
  const OIIO::ImageSpec config = read_config();
  auto input = OIIO::ImageInput::open(path, &config);
  if (!input)
    return corrupt_data("image " + path + " cannot be read: " + one_line(OIIO::geterror()));
  return read_opened(*input, path, max_pixels);
}

Result<PixelImage> decode_image(std::span<const std::byte> bytes,
                                const std::string& name_for_errors, int64_t max_pixels) {
  if (bytes.empty()) return corrupt_data("image " + name_for_errors + " is empty (0 bytes)");
  {
    OIIO::Filesystem::IOMemReader reader(bytes.data(), bytes.size());
    const OIIO::ImageSpec config = read_config();
    // The reader is chosen by the content when it is recognised, not by the client's name.
    const std::string sniffed = sniffed_extension(bytes);
    auto input = OIIO::ImageInput::open(sniffed.empty() ? name_for_errors : "upload" + sniffed, &config, &reader);
    if (input) return read_opened(*input, name_for_errors, max_pixels);
    OIIO::geterror();  // clear: the file fallback reports its own, clearer message
  }
  // Some readers (HEIF, SGI, raw, ...) only read files: go through a private temporary file
  // named with the upload's extension so the right reader is tried first.
  std::string pattern = (fs::temp_directory_path() / "infill-decode-XXXXXX").string();
  // The content's extension when recognised: the file reader then needs no probing, which
  // fails now and then under many threads (see sniffed_extension).
  const std::string sniffed = sniffed_extension(bytes);
  const std::string extension = sniffed.empty() ? fs::path(name_for_errors).extension().string() : sniffed;
  pattern += extension;
  const int fd = ::mkstemps(pattern.data(), static_cast<int>(extension.size()));
  if (fd < 0) {
    return io_error("image " + name_for_errors +
                    ": cannot create a temporary file: " + std::strerror(errno));
  }
  const std::string temp_path = pattern;
  size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n <= 0) break;
    written += static_cast<size_t>(n);
  }
  ::close(fd);
  Result<PixelImage> result =
      io_error("image " + name_for_errors + ": cannot write a temporary file");
  if (written == bytes.size()) {
    const OIIO::ImageSpec config = read_config();
    auto input = OIIO::ImageInput::open(temp_path, &config);
    if (!input) {
      result = corrupt_data("image " + name_for_errors + " (" + std::to_string(bytes.size()) +
                            " bytes) cannot be decoded: " +
                            replace_all(one_line(OIIO::geterror()), temp_path, name_for_errors));
    } else {
      result = read_opened(*input, name_for_errors, max_pixels);
      if (!result.ok()) {
        result = Status(result.status().code(),
                        replace_all(result.status().message(), temp_path, name_for_errors));
      }
    }
  }
  std::error_code ec;
  fs::remove(temp_path, ec);
  return result;
}

namespace {

// Sample i of `image` as float (half and float as stored, integers scaled to [0, 1]).
std::vector<float> samples_as_float(const PixelImage& image) {
  const size_t n = static_cast<size_t>(image.pixel_count()) * image.channels;
  std::vector<float> out(n);
  const std::byte* src = image.data.data();
  for (size_t i = 0; i < n; ++i) {
    switch (image.format) {
      case PixelFormat::kU8:
        out[i] = static_cast<float>(reinterpret_cast<const uint8_t*>(src)[i]) / 255.0f;
        break;
      case PixelFormat::kU16:
        out[i] = static_cast<float>(reinterpret_cast<const uint16_t*>(src)[i]) / 65535.0f;
        break;
      case PixelFormat::kF32:
        out[i] = reinterpret_cast<const float*>(src)[i];
        break;
      case PixelFormat::kF16:
        out[i] = static_cast<float>(c10::Half(reinterpret_cast<const uint16_t*>(src)[i], c10::Half::from_bits()));
        break;
    }
  }
  return out;
}

// Applies `convert` (linear_to_display or display_to_linear) to the colour of interleaved
// float samples; grey goes through as R = G = B.
void convert_colour(std::vector<float>& samples, const PixelImage& image,
                    void (*convert)(float*, int64_t, int64_t, int64_t)) {
  const int64_t pixels = image.pixel_count();
  if (image.channels >= 3) {
    convert(samples.data(), pixels, image.channels, 1);
    return;
  }
  std::vector<float> rgb(static_cast<size_t>(pixels) * 3);
  for (int64_t i = 0; i < pixels; ++i) rgb[3 * i] = rgb[3 * i + 1] = rgb[3 * i + 2] = samples[i * image.channels];
  convert(rgb.data(), pixels, 3, 1);
  for (int64_t i = 0; i < pixels; ++i) samples[i * image.channels] = rgb[3 * i];
}

bool is_float(PixelFormat format) { return format == PixelFormat::kF32 || format == PixelFormat::kF16; }

// `image` in the samples `format` stores: nullopt when it can take them as they are.
std::optional<PixelImage> converted_for(const PixelImage& image, ImageFileFormat format) {
  if (format == ImageFileFormat::kTiff && image.format == PixelFormat::kF16) {
    // OIIO 2.4's TIFF writer stores no half: float, which holds every half value exactly.
    const std::vector<float> samples = samples_as_float(image);
    PixelImage out = image;
    out.format = PixelFormat::kF32;
    out.data.resize(samples.size() * sizeof(float));
    std::memcpy(out.data.data(), samples.data(), out.data.size());
    return out;
  }
  if (format == ImageFileFormat::kTiff) return std::nullopt;
  if (format == ImageFileFormat::kPng && !is_float(image.format)) return std::nullopt;
  if (format == ImageFileFormat::kExr && is_float(image.format)) return std::nullopt;
  std::vector<float> samples = samples_as_float(image);
  PixelImage out = image;
  if (format == ImageFileFormat::kPng) {
    // Float into PNG: through the view transform when linear, then clamped to u16.
    if (image.scene_linear) convert_colour(samples, image, linear_to_display);
    out.format = PixelFormat::kU16;
    out.scene_linear = false;
    out.data.assign(out.expected_bytes(), std::byte{0});
    auto* dst = reinterpret_cast<uint16_t*>(out.data.data());
    for (size_t i = 0; i < samples.size(); ++i) {
      const float v = samples[i] > 0.0f ? std::min(samples[i], 1.0f) : 0.0f;  // NaN -> 0
      dst[i] = static_cast<uint16_t>(std::floor(v * 65535.0f + 0.5f));
    }
    return out;
  }
  // Integers into OpenEXR: linear light, as EXR readers expect (alpha is not a colour).
  convert_colour(samples, image, display_to_linear);
  out.format = PixelFormat::kF32;
  out.scene_linear = true;
  out.icc_profile.clear();
  out.data.resize(samples.size() * sizeof(float));
  std::memcpy(out.data.data(), samples.data(), out.data.size());
  return out;
}

// Writes `image` through an opened-to-be `output` at `name`; OIIO's message on failure.
bool write_through(OIIO::ImageOutput& output, const std::string& name, const PixelImage& image,
                   const OIIO::ImageSpec& spec) {
  bool ok = output.open(name, spec) && output.write_image(oiio_type(image.format), image.data.data());
  return output.close() && ok;
}

OIIO::ImageSpec file_spec(const PixelImage& image) {
  OIIO::ImageSpec spec = make_spec(image, oiio_type(image.format));
  attach_icc_profile(spec, image);
  return spec;
}

}  // namespace

Status save_image(const std::string& path, const PixelImage& image) {
  INFILL_RETURN_IF_ERROR(check_image(image, "save " + path));
  const fs::path target(path);
  const fs::path dir = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return not_found("cannot save " + path + ": directory " + dir.string() + " does not exist");
  }
  auto output = OIIO::ImageOutput::create(path);
  if (!output) {
    return invalid_argument("cannot save " + path + ": no image writer for extension \"" +
                            target.extension().string() + "\" (" + OIIO::geterror() + ")");
  }
  std::optional<PixelImage> converted;
  const std::string writer = output->format_name();
  if (auto format = parse_image_file_format(writer == "openexr" ? "exr" : writer)) converted = converted_for(image, *format);
  const PixelImage& stored = converted ? *converted : image;
  const fs::path temp = temp_sibling(target);
  const bool ok = write_through(*output, temp.string(), stored, file_spec(stored));
  if (!ok) {
    std::string message = replace_all(one_line(output->geterror()), temp.string(), path);
    output.reset();
    fs::remove(temp, ec);
    return io_error("cannot save " + path + ": " + message);
  }
  output.reset();
  fs::rename(temp, target, ec);
  if (ec) {
    fs::remove(temp, ec);
    return io_error("cannot save " + path + ": rename failed: " + ec.message());
  }
  return Status::success();
}

Result<std::vector<std::byte>> encode_image(const PixelImage& image, ImageFileFormat format) {
  const std::string what = std::string("encode ") + image_file_format_name(format);
  INFILL_RETURN_IF_ERROR(check_image(image, what));
  if (format == ImageFileFormat::kPng) return encode_png(image);
  OIIO::Filesystem::IOVecOutput sink;
  const char* writer = format == ImageFileFormat::kExr ? "openexr" : "tiff";
  auto output = OIIO::ImageOutput::create(writer, &sink);
  if (!output) return Status(ErrorCode::kInternal, what + ": no writer: " + OIIO::geterror());
  const std::optional<PixelImage> converted = converted_for(image, format);
  const PixelImage& stored = converted ? *converted : image;
  OIIO::ImageSpec spec = file_spec(stored);
  // zip for TIFF (lossless, widely read); OpenEXR's default zip as well.
  if (format == ImageFileFormat::kTiff) spec.attribute("compression", "zip");
  const std::string name = format == ImageFileFormat::kExr ? "memory.exr" : "memory.tif";
  if (!write_through(*output, name, stored, spec))
    return Status(ErrorCode::kInternal, what + ": " + one_line(output->geterror()));
  const auto& buffer = sink.buffer();
  std::vector<std::byte> bytes(buffer.size());
  std::memcpy(bytes.data(), buffer.data(), buffer.size());
  return bytes;
}

Result<std::vector<std::byte>> encode_png(const PixelImage& image, int compression_level) {
  INFILL_RETURN_IF_ERROR(check_image(image, "encode png"));
  OIIO::Filesystem::IOVecOutput sink;
  auto output = OIIO::ImageOutput::create("png", &sink);
  if (!output)
    return Status(ErrorCode::kInternal, "encode png: no PNG writer: " + OIIO::geterror());
  // PNG stores u8 or u16: float samples become u16 (converted_for).
  const std::optional<PixelImage> converted = converted_for(image, ImageFileFormat::kPng);
  const PixelImage& stored = converted ? *converted : image;
  OIIO::ImageSpec spec = file_spec(stored);
  spec.attribute("png:compressionLevel", std::clamp(compression_level, 0, 9));
  spec.attribute("png:filter", kPngFilterUp);
  if (!write_through(*output, "memory.png", stored, spec))
    return Status(ErrorCode::kInternal, "encode png: " + one_line(output->geterror()));
  const auto& buffer = sink.buffer();
  std::vector<std::byte> bytes(buffer.size());
  std::memcpy(bytes.data(), buffer.data(), buffer.size());
  return bytes;
}

#else
// Built without OpenImageIO (INFILL_WITH_OIIO=OFF, the engine core of scripts/gpu_check.sh):
// every image file is refused, naming it.
namespace {
Status no_image_files(const std::string& what) {
  return Status(ErrorCode::kUnimplemented, what + ": this build reads and writes no image files (INFILL_WITH_OIIO=OFF)");
}
}  // namespace

Result<PixelImage> load_image(const std::string& path, int64_t) { return no_image_files("image " + path); }

Result<PixelImage> decode_image(std::span<const std::byte>, const std::string& name_for_errors, int64_t) {
  return no_image_files("image " + name_for_errors);
}

Status save_image(const std::string& path, const PixelImage&) { return no_image_files("image " + path); }

Result<std::vector<std::byte>> encode_png(const PixelImage&, int) { return no_image_files("encode png"); }

Result<std::vector<std::byte>> encode_image(const PixelImage&, ImageFileFormat format) {
  return no_image_files(std::string("encode ") + image_file_format_name(format));
}
#endif

at::Tensor to_rgb_tensor(const PixelImage& image) {
  const Status status = check_image(image, "to_rgb_tensor");
  if (!status.ok()) throw std::invalid_argument(status.message());
  at::Tensor rgb = at::empty({3, image.height, image.width}, at::kFloat);
  float* planes[3];
  for (int c = 0; c < 3; ++c) planes[c] = rgb.data_ptr<float>() + c * image.pixel_count();
  switch (image.format) {
    case PixelFormat::kU8:
      planarize(reinterpret_cast<const uint8_t*>(image.data.data()), image, planes,
                [](uint8_t v) { return static_cast<float>(v) / 255.0f; });
      break;
    case PixelFormat::kU16:
      planarize(reinterpret_cast<const uint16_t*>(image.data.data()), image, planes,
                [](uint16_t v) { return static_cast<float>(v) / 65535.0f; });
      break;
    case PixelFormat::kF32:
      planarize(reinterpret_cast<const float*>(image.data.data()), image, planes, [](float v) { return v; });
      break;
    case PixelFormat::kF16:
      planarize(reinterpret_cast<const uint16_t*>(image.data.data()), image, planes,
                [](uint16_t v) { return static_cast<float>(c10::Half(v, c10::Half::from_bits())); });
      break;
  }
  if (image.format == PixelFormat::kF32 || image.format == PixelFormat::kF16) {
    if (image.scene_linear) linear_to_display(rgb.data_ptr<float>(), image.pixel_count(), 1, image.pixel_count());
    rgb.nan_to_num_(0.0f).clamp_(0.0f, 1.0f);
  }
  return rgb;
}

}  // namespace infill
