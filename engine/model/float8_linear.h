#pragma once
/// FP8 weights on a GPU (issue 39, an option: `float8_weights`): a linear layer's weight held
/// as E4M3 codes with one float32 scale per output row, and multiplied by at::_scaled_mm with
/// the activations quantized per row at every call (dynamic scaling, as torchao's and vLLM's
/// FP8 rowwise linears do). Halves the bytes a masked step reads, where few rows make the
/// step bound by reading weights; each product is rounded to E4M3 (3 mantissa bits) twice,
/// so the result differs from bf16's (bench_flux2 measures by how much and how fast).
///
/// Needs a CUDA libtorch with FP8 (2.5 or newer, model/torch_compat.h) and a GPU of compute
/// capability 8.9 or newer (Ada, Hopper, Blackwell); everything else is refused by
/// float8_compute_status, naming the device.

#include <ATen/core/Tensor.h>

#include "common/status.h"
#include "model/compute_device.h"

namespace infill {

/// The largest finite E4M3FN value: a row's largest magnitude maps onto it.
inline constexpr float kFloat8E4M3Max = 448.0f;

/// Ok when `device` can multiply FP8 weights; otherwise why not, naming the device: the CPU
/// (it computes in float32), a libtorch without FP8, a GPU older than compute capability 8.9.
Status float8_compute_status(const ComputeDevice& device);

/// A weight as FP8 codes and per-row scales: row i of the weight is codes[i] * scale[0, i].
struct Float8Weight {
  at::Tensor codes;  ///< [out, in] float8_e4m3fn, on the weight's device
  at::Tensor scale;  ///< [1, out] float32
};

/// Quantizes w [out, in] (any float dtype, on a device float8_compute_status accepts): each
/// row's scale is max |row| / 448 (1 for a row of zeros), its codes w / scale rounded to
/// nearest E4M3.
Float8Weight quantize_float8_rows(const at::Tensor& w);
/// Quantizes w [out, in] with the given scale of each row (`row_scale` [out] float32, on w's
/// device): codes w / scale rounded to nearest E4M3. With an E4M3 file's own scales this gives
/// back the file's codes (model/float8_checkpoint.h: float8_e4m3_row_scales).
Float8Weight quantize_float8_rows(const at::Tensor& w, const at::Tensor& row_scale);

/// The weight the codes stand for, codes * scale, in `dtype`: for merging adapters and checks.
at::Tensor dequantize_float8_rows(const Float8Weight& w, at::ScalarType dtype);

/// x [M, in] or [in] (bf16) times w^T -> [M, out] or [out] in bf16: x is quantized per row as w
/// is (max |row| / 448), then one at::_scaled_mm with both scale vectors, accumulating in
/// float32 (no fast accumulation). `in` and `out` must be multiples of 16 (_scaled_mm's rule).
at::Tensor float8_linear(const at::Tensor& x, const Float8Weight& w);

}  // namespace infill
