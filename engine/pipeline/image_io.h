#pragma once
/// Image files in and out of the engine, through OpenImageIO (PNG, JPEG, TIFF, EXR, PSD, ...).
///
/// Pixels stay in the file's own representation (PixelImage) from upload to the final
/// composite, so pixels outside the mask come back bit-identical; only the model sees float
/// RGB (to_rgb_tensor). All functions are thread-safe and keep no state.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/core/Tensor.h>

#include "common/status.h"
#include "pipeline/image_file_format.h"

namespace infill {

/// Sample type of a PixelImage. Values only grow; 0 is never a real format.
enum class PixelFormat {
  kU8 = 1,   ///< uint8, 0..255 maps to 0..1
  kU16 = 2,  ///< uint16, 0..65535 maps to 0..1
  kF32 = 3,  ///< float32, as is (may exceed [0, 1] in HDR files)
  kF16 = 4,  ///< IEEE 754 half (as OpenEXR stores it), as is
};

/// Bytes per sample of `format` (1, 2 or 4).
size_t bytes_per_sample(PixelFormat format);
/// "u8", "u16", "f32", "f16".
const char* pixel_format_name(PixelFormat format);

/// Decoded pixels, interleaved row-major: sample (y, x, c) is at index (y * width + x) *
/// channels + c, each sample bytes_per_sample(format) bytes in native byte order. Channels
/// 1 = grey, 2 = grey + alpha, 3 = RGB, 4 = RGBA.
struct PixelImage {
  int width = 0;
  int height = 0;
  int channels = 0;
  PixelFormat format = PixelFormat::kU8;
  std::vector<std::byte> data;
  // What the source file said of itself, kept so that a result goes back as the input came.
  std::string file_format;             ///< OIIO's name of the source's format ("png", "tiff", "openexr",
                                       ///< "jpeg", ...); "" = made in memory
  std::vector<std::byte> icc_profile;  ///< the source's embedded ICC profile, byte for byte; empty = none
  /// Samples are scene-linear (OpenEXR, Radiance HDR: OIIO's colour space "Linear"), not the
  /// display-referred sRGB encoding of 8/16-bit files. The model sees them through
  /// linear_to_display (colour_transfer.h).
  bool scene_linear = false;

  int64_t pixel_count() const { return static_cast<int64_t>(width) * height; }
  /// width * height * channels * bytes_per_sample(format): what `data.size()` must be.
  size_t expected_bytes() const;
  /// A zero-filled image of the given shape.
  static PixelImage allocate(int width, int height, int channels, PixelFormat format);
};

/// The format a result of `image` takes unless asked otherwise: the source's own when it is
/// PNG, TIFF or OpenEXR; else (JPEG, WebP, PSD, ...) PNG for u8/u16 and OpenEXR for float,
/// so that nothing is lost to a lossy or lower-depth format.
ImageFileFormat native_file_format(const PixelImage& image);

/// Reads the first subimage of an image file. u8, u16 and half files keep their format;
/// everything else (float, u32, signed, ...) is converted to f32 by OIIO. Up to 4 channels are kept
/// (extra channels of e.g. multi-layer EXRs are dropped). The pixels are the file's data window.
/// Errors: missing file -> not_found; unreadable or corrupt -> corrupt_data with OIIO's message;
/// zero size -> corrupt_data; more than `max_pixels` pixels -> out_of_range naming both numbers
/// (checked from the header, before the pixels are decoded).
Result<PixelImage> load_image(const std::string& path, int64_t max_pixels);

/// As load_image, from an encoded file in memory (an upload). The format is detected from the
/// content; `name_for_errors` only labels messages. Formats whose OIIO reader cannot read
/// from memory (e.g. HEIF, SGI, camera raw) are decoded through a temporary file.
Result<PixelImage> decode_image(std::span<const std::byte> bytes,
                                const std::string& name_for_errors, int64_t max_pixels);

/// Writes `image` to `path`, the format chosen by the extension (".png", ".tif", ".exr", ...).
/// PNG, TIFF and OpenEXR get encode_image's conversions; other formats get OIIO's nearest
/// sample type (e.g. u8 for JPEG). The ICC profile is written where the format stores one. Atomic: the file is written to a temporary name in the same
/// directory and renamed over `path`, so readers never see a partial file and nothing is
/// created on failure. Errors: invalid_argument (unknown extension, inconsistent image),
/// not_found (directory missing), io_error (write or rename refused).
Status save_image(const std::string& path, const PixelImage& image);

/// zlib level encode_png uses by default: level 1 encodes a 2048^2 photo about 4x faster than
/// libpng's default 6 for files about 20% larger, the right trade for interactive previews
/// and results sent to a local client.
constexpr int kDefaultPngCompression = 1;

/// libpng row filter encode_png uses: "up" alone. libpng's default tries all five filters on
/// every row; at level 1 that search costs as much as the deflate itself. Measured here
/// (OIIO 2.4, level 1): a 512^2 photo 22.2 -> 11.0 ms for a file 2.3% larger, 384^2 noise
/// 16.3 -> 8.5 ms. Value as libpng's PNG_FILTER_UP.
constexpr int kPngFilterUp = 0x20;

/// PNG encoding in memory (previews, results over the wire). u8 and u16 are stored as is;
/// f32 is clamped to [0, 1] and stored as u16. `compression_level` is zlib's 0 (none) to 9
/// (smallest); out-of-range values are clamped. Rows are filtered with kPngFilterUp.
Result<std::vector<std::byte>> encode_png(const PixelImage& image,
                                          int compression_level = kDefaultPngCompression);

/// Encodes `image` as `format` in memory, keeping everything the format can hold: samples
/// keep their type where the format stores it (PNG: u8, u16; TIFF: u8, u16, float, with half
/// widened to float exactly; OpenEXR: half, float) and the ICC profile goes along (PNG, TIFF). Otherwise: float into PNG becomes u16
/// (scene-linear samples through linear_to_display first, then clamped to [0, 1]); u8/u16 into
/// OpenEXR become float through display_to_linear, as EXR readers expect linear light.
/// Errors: invalid_argument for an inconsistent image, internal when OIIO refuses.
Result<std::vector<std::byte>> encode_image(const PixelImage& image, ImageFileFormat format);

/// The model's view of an image: float [3, H, W] in [0, 1]. Grey is replicated to RGB, alpha
/// is dropped, u8 / 255, u16 / 65535, f16 and f32 converted by linear_to_display when
/// scene_linear, then clamped to [0, 1] (NaN -> 0).
at::Tensor to_rgb_tensor(const PixelImage& image);

}  // namespace infill
