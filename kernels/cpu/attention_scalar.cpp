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
  static Reg exp(Reg x) { return std::exp(x); }
};

}  // namespace
}  // namespace infill::kernels::cpu

#include "kernels/cpu/attention_tile_impl.h"

namespace infill::kernels::cpu {

void attend_tile_scalar(const AttentionProblem& p, int64_t head, int64_t q_begin,
                        int64_t q_end, float* scratch) {
  attend_tile<Scalar>(p, head, q_begin, q_end, scratch);
}

}  // namespace infill::kernels::cpu
