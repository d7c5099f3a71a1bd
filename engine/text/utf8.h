#pragma once
/// UTF-8 helpers shared by the tokenizer and the prompt checks. Pure functions.

#include <cstddef>
#include <string>
#include <string_view>

namespace infill {

/// `bytes` with every maximal invalid UTF-8 sequence replaced by U+FFFD, as Rust's
/// `String::from_utf8_lossy` (and so the `tokenizers` library) does.
std::string utf8_lossy(std::string_view bytes);

/// The UTF-8 encoding of one code point (<= 0x10FFFF).
std::string utf8_encode(char32_t code_point);

/// Length in bytes of the UTF-8 sequence starting with `lead` (1 for an invalid lead byte).
size_t utf8_sequence_length(unsigned char lead);

}  // namespace infill
