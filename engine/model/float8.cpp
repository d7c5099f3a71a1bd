#include "model/float8.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>

namespace infill {
namespace {

// The float32 bit pattern of a code with `exp_bits` exponent bits (bias 2^(exp_bits-1) - 1)
// and `man_bits` mantissa bits: the fields are moved into float32's, re-biased; subnormal
// codes are normalised (every FP8 value is a normal float32).
uint32_t float_bits(uint8_t code, int exp_bits, int man_bits, bool ieee_specials) {
  const uint32_t sign = static_cast<uint32_t>(code >> 7) << 31;
  const uint32_t exp = (code >> man_bits) & ((1u << exp_bits) - 1);
  uint32_t man = code & ((1u << man_bits) - 1);
  const int bias = (1 << (exp_bits - 1)) - 1;
  const uint32_t exp_max = (1u << exp_bits) - 1;
  if (ieee_specials && exp == exp_max) return sign | 0x7F800000u | (man << (23 - man_bits));  // inf / NaN
  if (!ieee_specials && exp == exp_max && man == (1u << man_bits) - 1) return sign | 0x7FC00000u;  // NaN
  if (exp == 0) {
    if (man == 0) return sign;  // +-0
    // Subnormal: man * 2^(1 - bias - man_bits). Shift the leading one out to make it normal.
    int e = 1 - bias;
    while ((man & (1u << man_bits)) == 0) {
      man <<= 1;
      --e;
    }
    man &= (1u << man_bits) - 1;
    return sign | (static_cast<uint32_t>(e + 127) << 23) | (man << (23 - man_bits));
  }
  return sign | (static_cast<uint32_t>(static_cast<int>(exp) - bias + 127) << 23) | (man << (23 - man_bits));
}

using Table = std::array<float, 256>;

Table make_table(Float8Format format) {
  Table t{};
  for (int c = 0; c < 256; ++c) {
    const uint32_t bits = format == Float8Format::kE4M3FN ? float_bits(static_cast<uint8_t>(c), 4, 3, false)
                                                          : float_bits(static_cast<uint8_t>(c), 5, 2, true);
    t[c] = std::bit_cast<float>(bits);
  }
  return t;
}

const Table& table(Float8Format format) {
  static const Table e4m3 = make_table(Float8Format::kE4M3FN);
  static const Table e5m2 = make_table(Float8Format::kE5M2);
  return format == Float8Format::kE4M3FN ? e4m3 : e5m2;
}

}  // namespace

const char* float8_format_name(Float8Format format) {
  return format == Float8Format::kE4M3FN ? "float8_e4m3fn" : "float8_e5m2";
}

float float8_to_float(uint8_t code, Float8Format format) { return table(format)[code]; }

int64_t decode_float8_to_bf16(std::span<const uint8_t> codes, Float8Format format, std::span<const float> scales,
                              int64_t row_length, uint16_t* out) {
  const Table& t = table(format);
  const int64_t n = static_cast<int64_t>(codes.size());
  const int64_t run = scales.size() == 1 ? n : row_length;  // codes sharing one scale
  std::array<uint16_t, 256> lut{};
  std::array<bool, 256> finite{};
  for (int64_t begin = 0, row = 0; begin < n; begin += run, ++row) {
    const float scale = scales[scales.size() == 1 ? 0 : row];
    for (int c = 0; c < 256; ++c) {
      const uint32_t bits = std::bit_cast<uint32_t>(t[c] * scale);
      finite[c] = (bits & 0x7F800000u) != 0x7F800000u;
      // Round to nearest even on the 16 bits dropped; a finite value may round up to infinity.
      const uint16_t rounded = static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
      finite[c] = finite[c] && (rounded & 0x7F80u) != 0x7F80u;
      lut[c] = rounded;
    }
    const int64_t end = std::min(n, begin + run);
    for (int64_t i = begin; i < end; ++i) {
      if (!finite[codes[i]]) return i;
      out[i] = lut[codes[i]];
    }
  }
  return -1;
}

}  // namespace infill
