#pragma once
/// The two 8-bit float formats of FP8 checkpoints (OCP 8-bit floating point specification,
/// as torch's float8_e4m3fn and float8_e5m2 implement it): a code's float32 value, and a
/// tensor's codes times their scales in bf16, the dtype the engine holds. Torch-free: the
/// Debian libtorch (1.13) has no float8 types, and a weight file's bytes are all that is
/// needed.
///
/// - E4M3FN: sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities; S.1111.111 is NaN;
///   largest 448, smallest subnormal 2^-9.
/// - E5M2: sign, 5 exponent bits (bias 15), 2 mantissa bits, IEEE-like (infinities and NaNs);
///   the upper byte of an IEEE half.

#include <cstdint>
#include <span>

namespace infill {

enum class Float8Format { kE4M3FN = 1, kE5M2 = 2 };

/// "float8_e4m3fn" / "float8_e5m2", the names torch and ComfyUI's metadata use.
const char* float8_format_name(Float8Format format);

/// The value of one code (NaN and, for E5M2, infinities included).
float float8_to_float(uint8_t code, Float8Format format);

/// out[i] = bf16(value(codes[i]) * scales[i / row_length]), the product in float32 rounded to
/// nearest even as torch converts float to bf16; `out` holds bf16 bit patterns. `scales` holds
/// one scale per tensor (size 1) or one per row of `row_length` codes. Each distinct scale
/// makes a 256-entry table, so decoding is one lookup per code. Returns the index of the first
/// code whose value is NaN or infinite, or whose scaled value is not finite in bf16 (nothing is
/// written past it), or -1 when all are finite.
int64_t decode_float8_to_bf16(std::span<const uint8_t> codes, Float8Format format, std::span<const float> scales,
                              int64_t row_length, uint16_t* out);

}  // namespace infill
