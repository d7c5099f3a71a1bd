#include "kernels/half_convert.h"

#include <immintrin.h>

#include <algorithm>

#include <c10/util/Half.h>

#include "kernels/cpu/parallel.h"

namespace infill::kernels {

namespace {

// Elements per parallel chunk: big enough that a thread hand-off is worth it.
constexpr int64_t kGrain = 1 << 16;

__attribute__((target("avx512f"))) void half_to_float_avx512(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    // The masked forms: gcc 12 warns on the unmasked ones (their undefined pass-through).
    _mm512_storeu_ps(dst + i, _mm512_mask_cvtph_ps(_mm512_setzero_ps(), 0xFFFF, h));
  }
  for (; i < n; ++i) dst[i] = c10::detail::fp16_ieee_to_fp32_value(src[i]);
}

__attribute__((target("avx512f"))) void float_to_half_avx512(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256i h = _mm512_mask_cvtps_ph(_mm256_setzero_si256(), 0xFFFF, _mm512_loadu_ps(src + i),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), h);
  }
  for (; i < n; ++i) dst[i] = c10::detail::fp16_ieee_from_fp32_value(src[i]);
}

void half_to_float_scalar(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = c10::detail::fp16_ieee_to_fp32_value(src[i]);
}

void float_to_half_scalar(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = c10::detail::fp16_ieee_from_fp32_value(src[i]);
}

bool has_avx512() {
  static const bool yes = __builtin_cpu_supports("avx512f");
  return yes;
}

}  // namespace

void half_to_float(const uint16_t* src, float* dst, int64_t n) {
  auto convert = has_avx512() ? half_to_float_avx512 : half_to_float_scalar;
  cpu::parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) { convert(src + b, dst + b, e - b); });
}

void float_to_half(const float* src, uint16_t* dst, int64_t n) {
  auto convert = has_avx512() ? float_to_half_avx512 : float_to_half_scalar;
  cpu::parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) { convert(src + b, dst + b, e - b); });
}

}  // namespace infill::kernels
