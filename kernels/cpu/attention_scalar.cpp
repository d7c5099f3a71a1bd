// Portable instantiation of the attention tile kernel (one float per "vector"), for CPUs
// without AVX2/FMA; the compiler's baseline vectorisation is all it gets.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/cpu/attention_kernel.h"

namespace infill::kernels::cpu {
namespace {

struct Scalar {
  using Reg = float;
  static constexpr int kWidth = 1;
  static constexpr int kScoreVecs = 4;
  static constexpr int kPvVecs = 4;

  static Reg zero() { return 0.0f; }
  static Reg set1(float x) { return x; }
  static Reg load(const float* p) { return *p; }
  static void store(float* p, Reg v) { *p = v; }
  static Reg add(Reg a, Reg b) { return a + b; }
  static Reg sub(Reg a, Reg b) { return a - b; }
  static Reg mul(Reg a, Reg b) { return a * b; }
  static Reg max(Reg a, Reg b) { return a < b ? b : a; }
  static Reg fma(Reg a, Reg b, Reg c) { return a * b + c; }
  static float reduce_max(Reg v) { return v; }
  static float reduce_add(Reg v) { return v; }
  static Reg load_first(const float* p, int n) { return n > 0 ? *p : 0.0f; }
  static Reg exp(Reg x) { return x < kExpCutoff ? 0.0f : std::exp(x); }
};

}  // namespace
}  // namespace infill::kernels::cpu

#include "kernels/cpu/attention_tile_impl.h"

namespace infill::kernels::cpu {

void attend_tile_scalar(const AttentionProblem& p, int64_t head, int64_t q_begin, int64_t q_end,
                        float* scratch) {
  attend_tile<Scalar>(p, head, q_begin, q_end, scratch);
}

void pack_k_panel_scalar(const float* k, int64_t k_row_stride, int64_t keys, int64_t d,
                         float* panel) {
  for (int64_t j = 0; j < keys; ++j) {
    const float* row = k + j * k_row_stride;
    for (int64_t c = 0; c < d; ++c) panel[c * kKeyPanel + j] = row[c];
  }
  if (keys < kKeyPanel) {
    for (int64_t c = 0; c < d; ++c) {
      std::fill(panel + c * kKeyPanel + keys, panel + (c + 1) * kKeyPanel, 0.0f);
    }
  }
}

}  // namespace infill::kernels::cpu
