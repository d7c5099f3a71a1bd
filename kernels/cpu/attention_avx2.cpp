// AVX2 + FMA instantiation of the attention tile kernel; selected at run time on CPUs
// without AVX-512.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/cpu/attention_kernel.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma")

namespace infill::kernels::cpu {
namespace {

struct Avx2 {
  using Reg = __m256;
  static constexpr int kWidth = 8;
  static constexpr int kScoreVecs = 2;  // 6 rows x 2 vectors = 12 accumulators of 16 ymm
  static constexpr int kPvVecs = 2;

  static Reg zero() { return _mm256_setzero_ps(); }
  static Reg set1(float x) { return _mm256_set1_ps(x); }
  static Reg load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, Reg v) { _mm256_storeu_ps(p, v); }
  static Reg add(Reg a, Reg b) { return _mm256_add_ps(a, b); }
  static Reg sub(Reg a, Reg b) { return _mm256_sub_ps(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm256_mul_ps(a, b); }
  static Reg max(Reg a, Reg b) { return _mm256_max_ps(a, b); }
  static Reg fma(Reg a, Reg b, Reg c) { return _mm256_fmadd_ps(a, b, c); }
  static float reduce_max(Reg v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
  }
  static float reduce_add(Reg v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
  }

  static Reg load_first(const float* p, int n) {
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_maskload_ps(p, _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lanes));
  }

  // Same polynomial as the AVX-512 variant; 2^n is built in the exponent bits, which is exact
  // for the n >= -87 log2 e > -126 that survive the cutoff.
  static Reg exp(Reg x) {
    const Reg keep = _mm256_cmp_ps(x, _mm256_set1_ps(kExpCutoff), _CMP_NLT_UQ);
    const Reg log2e = _mm256_set1_ps(1.44269504088896341f);
    const Reg n =
        _mm256_round_ps(_mm256_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const Reg f = _mm256_fmsub_ps(x, log2e, n);
    Reg y = _mm256_set1_ps(1.5403530393381606e-4f);
    y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(1.3333558146428443e-3f));
    y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(9.618129107628477e-3f));
    y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(5.550410866482158e-2f));
    y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(0.2402265069591007f));
    y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(0.6931471805599453f));
    y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(1.0f));
    const __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(keep, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
  }
};

}  // namespace
}  // namespace infill::kernels::cpu

#include "kernels/cpu/attention_tile_impl.h"

namespace infill::kernels::cpu {

void attend_tile_avx2(const AttentionProblem& p, int64_t head, int64_t q_begin, int64_t q_end,
                      float* scratch) {
  attend_tile<Avx2>(p, head, q_begin, q_end, scratch);
}

}  // namespace infill::kernels::cpu

#pragma GCC pop_options
