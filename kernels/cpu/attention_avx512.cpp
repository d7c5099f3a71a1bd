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

  // Cephes-style expf: x = n ln2 + r, |r| <= ln2 / 2, degree-6 polynomial, 2^n by scalef.
  // Relative error about 2e-7 on the range used here (x <= 0).
  static Reg exp(Reg x) {
    const Reg lo = _mm512_set1_ps(-87.33654f);
    const __mmask16 underflow = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    // max(lo, x) returns x when x is NaN, so NaN propagates.
    x = _mm512_min_ps(_mm512_set1_ps(88.37626f), _mm512_max_ps(lo, x));
    const Reg n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    Reg r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    Reg y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_maskz_scalef_ps(static_cast<__mmask16>(~underflow), y, n);
  }
};

}  // namespace
}  // namespace infill::kernels::cpu

#include "kernels/cpu/attention_tile_impl.h"

namespace infill::kernels::cpu {

void attend_tile_avx512(const AttentionProblem& p, int64_t head, int64_t q_begin,
                        int64_t q_end, float* scratch) {
  attend_tile<Avx512>(p, head, q_begin, q_end, scratch);
}

}  // namespace infill::kernels::cpu

#pragma GCC pop_options
