#pragma once
/// fp16 <-> fp32 conversion of cached K/V slabs (IEEE binary16 bit patterns), vectorised with
/// F16C where the CPU has it and split over the compute threads. It runs on every block of
/// every mask-aware step, where ATen's generic copy_ cost about as much as a small GEMM.

#include <cstdint>

namespace infill::kernels {

/// dst[i] = float(src[i]) for i < n. Exact (every fp16 value is a float).
void half_to_float(const uint16_t* src, float* dst, int64_t n);
/// dst[i] = fp16(src[i]), round to nearest even; overflow becomes infinity as in IEEE.
void float_to_half(const float* src, uint16_t* dst, int64_t n);

}  // namespace infill::kernels
