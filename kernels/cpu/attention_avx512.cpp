// AVX-512 (F/BW/VL/DQ) instantiation of the attention tile kernel; selected at run time only
// on CPUs that report these features.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/cpu/attention_kernel.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
// GCC 12's own AVX-512 intrinsics self-initialise an "undefined" register (__m512 __Y = __Y)
// and then warn about it once inlined here.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace infill::kernels::cpu {
namespace {

struct Avx512 {
  using Reg = __m512;
  static constexpr int kWidth = 16;
  static constexpr int kScoreVecs = 4;  // 6 rows x 4 vectors = 24 accumulators of 32 zmm
  static constexpr int kPvVecs = 4;

  static Reg zero() { return _mm512_setzero_ps(); }
  static Reg set1(float x) { return _mm512_set1_ps(x); }
  static Reg load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, Reg v) { _mm512_storeu_ps(p, v); }
  static Reg add(Reg a, Reg b) { return _mm512_add_ps(a, b); }
  static Reg sub(Reg a, Reg b) { return _mm512_sub_ps(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm512_mul_ps(a, b); }
  static Reg max(Reg a, Reg b) { return _mm512_max_ps(a, b); }
  static Reg fma(Reg a, Reg b, Reg c) { return _mm512_fmadd_ps(a, b, c); }
  static float reduce_max(Reg v) { return _mm512_reduce_max_ps(v); }
  static float reduce_add(Reg v) { return _mm512_reduce_add_ps(v); }

  static Reg load_first(const float* p, int n) {
    return _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1), p);
  }

  // e^x = 2^n * 2^f with n = round(x log2 e), |f| <= 1/2; 2^f by its degree-6 Taylor
  // polynomial (relative error < 2e-7), 2^n by scalef. Inputs below kExpCutoff give 0; NaN
  // propagates (the unordered compare keeps it).
  static Reg exp(Reg x) {
    const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kExpCutoff), _CMP_NLT_UQ);
    const Reg log2e = _mm512_set1_ps(1.44269504088896341f);
    const Reg n = _mm512_roundscale_ps(_mm512_mul_ps(x, log2e),
                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const Reg f = _mm512_fmsub_ps(x, log2e, n);
    Reg y = _mm512_set1_ps(1.5403530393381606e-4f);
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.3333558146428443e-3f));
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(9.618129107628477e-3f));
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(5.550410866482158e-2f));
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(0.2402265069591007f));
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(0.6931471805599453f));
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.0f));
    return _mm512_maskz_scalef_ps(keep, y, n);
  }
};

}  // namespace
}  // namespace infill::kernels::cpu

#include "kernels/cpu/attention_tile_impl.h"

namespace infill::kernels::cpu {

void attend_tile_avx512(const AttentionProblem& p, int64_t head, int64_t q_begin, int64_t q_end,
                        float* scratch) {
  attend_tile<Avx512>(p, head, q_begin, q_end, scratch);
}

namespace {

// In-register transpose of a 16 x 16 block: r[i] lane j becomes r[j] lane i.
inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  // u[4g + x], 128-bit lane k: column 4k + x of rows 4g .. 4g + 3.
  __m512 u[16];
  for (int g = 0; g < 4; ++g) {
    u[4 * g + 0] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
    u[4 * g + 1] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], 0xEE);
    u[4 * g + 2] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
    u[4 * g + 3] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xEE);
  }
  // For each x, a 4 x 4 transpose of 128-bit lanes across the row groups g.
  for (int x = 0; x < 4; ++x) {
    const __m512 v0 = _mm512_shuffle_f32x4(u[x], u[4 + x], 0x88);
    const __m512 v1 = _mm512_shuffle_f32x4(u[x], u[4 + x], 0xDD);
    const __m512 v2 = _mm512_shuffle_f32x4(u[8 + x], u[12 + x], 0x88);
    const __m512 v3 = _mm512_shuffle_f32x4(u[8 + x], u[12 + x], 0xDD);
    r[x] = _mm512_shuffle_f32x4(v0, v2, 0x88);
    r[4 + x] = _mm512_shuffle_f32x4(v1, v3, 0x88);
    r[8 + x] = _mm512_shuffle_f32x4(v0, v2, 0xDD);
    r[12 + x] = _mm512_shuffle_f32x4(v1, v3, 0xDD);
  }
}

}  // namespace

void pack_k_panel_avx512(const float* k, int64_t k_row_stride, int64_t keys, int64_t d,
                         float* panel) {
  for (int64_t j0 = 0; j0 < kKeyPanel; j0 += 16) {
    // K rows are strided (all heads side by side) and each is read only in part, which the
    // hardware prefetchers follow poorly: request the next 16 rows' slices ahead.
    for (int64_t i = j0 + 16; i < std::min(j0 + 32, keys + 16); ++i) {
      for (int64_t c0 = 0; c0 < d; c0 += 16) __builtin_prefetch(k + i * k_row_stride + c0);
    }
    for (int64_t c0 = 0; c0 < d; c0 += 16) {
      const int cols = static_cast<int>(std::min<int64_t>(16, d - c0));
      const __mmask16 mask = static_cast<__mmask16>((1u << cols) - 1);
      __m512 r[16];
      for (int i = 0; i < 16; ++i) {
        r[i] = j0 + i < keys ? _mm512_maskz_loadu_ps(mask, k + (j0 + i) * k_row_stride + c0)
                             : _mm512_setzero_ps();
      }
      transpose16(r);
      for (int i = 0; i < cols; ++i) _mm512_storeu_ps(panel + (c0 + i) * kKeyPanel + j0, r[i]);
    }
  }
}

void pack_k_panel_half_avx512(const uint16_t* k, int64_t k_row_stride, int64_t keys, int64_t d, float* panel) {
  for (int64_t j0 = 0; j0 < kKeyPanel; j0 += 16) {
    for (int64_t i = j0 + 16; i < std::min(j0 + 32, keys + 16); ++i) {
      for (int64_t c0 = 0; c0 < d; c0 += 32) __builtin_prefetch(k + i * k_row_stride + c0);
    }
    for (int64_t c0 = 0; c0 < d; c0 += 16) {
      const int cols = static_cast<int>(std::min<int64_t>(16, d - c0));
      const __mmask16 mask = static_cast<__mmask16>((1u << cols) - 1);
      __m512 r[16];
      for (int i = 0; i < 16; ++i) {
        r[i] = j0 + i < keys ? _mm512_mask_cvtph_ps(_mm512_setzero_ps(), 0xFFFF,
                                                    _mm256_maskz_loadu_epi16(mask, k + (j0 + i) * k_row_stride + c0))
                             : _mm512_setzero_ps();
      }
      transpose16(r);
      for (int i = 0; i < cols; ++i) _mm512_storeu_ps(panel + (c0 + i) * kKeyPanel + j0, r[i]);
    }
  }
}

void convert_half_rows_avx512(const uint16_t* src, int64_t src_row_stride, int64_t rows, int64_t d, float* dst,
                              int64_t dst_row_stride) {
  for (int64_t j = 0; j < rows; ++j) {
    const uint16_t* in = src + j * src_row_stride;
    float* out = dst + j * dst_row_stride;
    for (int64_t c0 = 0; c0 < d; c0 += 16) {
      const int cols = static_cast<int>(std::min<int64_t>(16, d - c0));
      const __mmask16 mask = static_cast<__mmask16>((1u << cols) - 1);
      _mm512_mask_storeu_ps(out + c0, mask,
                            _mm512_mask_cvtph_ps(_mm512_setzero_ps(), 0xFFFF, _mm256_maskz_loadu_epi16(mask, in + c0)));
    }
  }
}

}  // namespace infill::kernels::cpu

#pragma GCC diagnostic pop
#pragma GCC pop_options
