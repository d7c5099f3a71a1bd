#pragma once
/// The job stamp inside an output file: infill-render writes the hash of the job item that
/// produced each output into the file itself, so that a re-run skips outputs that are up to
/// date. PNG: tEXt chunks (png_text.h, byte-level); OpenEXR: string header attributes; TIFF:
/// the ImageDescription tag as a JSON object (TIFF keeps no other free-form text).

#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace infill::render {

/// `file` (an encoded PNG, TIFF or OpenEXR, told apart by its signature) with every
/// (keyword, text) stored in it; pixels, depth and ICC profile untouched (TIFF and OpenEXR
/// are rewritten through OpenImageIO with the samples in their stored type).
/// Errors: another format, an undecodable file, a bad PNG keyword or text.
Result<std::vector<std::byte>> stamp_output(const std::vector<std::byte>& file,
                                            const std::vector<std::pair<std::string, std::string>>& texts);

/// The text stored under `keyword` in the output file at `path` (any of the three formats);
/// nullopt when the file is missing, unreadable or has no such text.
std::optional<std::string> read_output_stamp(const std::string& path, const std::string& keyword);

}  // namespace infill::render
