#pragma once
/// The differences between the libtorch versions the engine builds against, in one place:
/// Debian's CPU libtorch 1.13 (the default build) and a CUDA libtorch 2.x (the `cuda` preset,
/// pytorch.org's libtorch or the one inside a pip torch).

#include <torch/version.h>

/// at::scaled_dot_product_attention exists (2.0) and takes an explicit scale (2.1): on a GPU
/// it dispatches to flash or memory-efficient attention.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
#define INFILL_TORCH_HAS_SDPA 1
#else
#define INFILL_TORCH_HAS_SDPA 0
#endif

/// FP8 tensors (at::kFloat8_e4m3fn) and at::_scaled_mm with a scale per row of each operand
/// (2.5; the rowwise kernel runs on compute capability 8.9 and newer). Debian's 1.13 has
/// neither: there FP8 weights are decoded to bf16 when read (model/float8.h).
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5)
#define INFILL_TORCH_HAS_FLOAT8_MM 1
#else
#define INFILL_TORCH_HAS_FLOAT8_MM 0
#endif
