#pragma once
/// PNG tEXt chunks: how infill-render stamps each output with the hash of the job item that
/// produced it, so a re-run can skip outputs that are up to date. Byte-level, no decoder.

#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace infill::render {

/// Returns `png` with one tEXt chunk per (keyword, text) inserted right after IHDR.
/// Keywords: 1-79 printable Latin-1 characters; text: Latin-1 without NUL.
/// Errors: `png` is not a PNG (signature or IHDR missing), a bad keyword or text.
Result<std::vector<std::byte>> add_png_text(const std::vector<std::byte>& png,
                                            const std::vector<std::pair<std::string, std::string>>& texts);

/// The text of the first tEXt chunk named `keyword` before the image data of the PNG file at
/// `path`; nullopt when the file is missing, is not a PNG or has no such chunk. Reads only
/// the chunks before IDAT.
std::optional<std::string> read_png_text(const std::string& path, const std::string& keyword);

}  // namespace infill::render
