#pragma once
/// Output path patterns of job files: "renders/{name}_{seed}_{item:04}.png".
///
/// Tokens: {item} (the item number, from 1), {seed}, {name} (the edit's name); a number after
/// a colon zero-pads: {item:04} -> 0007. Nothing else may appear in braces. Pure functions.

#include <cstdint>
#include <optional>
#include <string>

#include "common/status.h"

namespace infill::render {

struct OutputTokens {
  int item = 0;
  uint64_t seed = 0;
  std::string name;
};

/// Checks a pattern's syntax; the message says what is wrong ("unknown token {frame}").
Status check_output_pattern(const std::string& pattern);
/// Expands a pattern that passed check_output_pattern.
std::string expand_output_pattern(const std::string& pattern, const OutputTokens& tokens);

/// The result format an output path asks for by its extension, in any case: "png" (.png),
/// "tiff" (.tif, .tiff) or "exr" (.exr); nullopt for any other.
std::optional<std::string> output_file_format(const std::string& path);

}  // namespace infill::render
