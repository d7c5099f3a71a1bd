#pragma once
/// FLUX.2's row-wise normalisations as one CUDA kernel each (kernels/cuda/fused_norms.cu;
/// issue 39 item 3): a masked step on a GPU computes a few hundred rows, where libtorch's
/// composition of these norms is a dozen launches of tiny kernels per call and the step is
/// bound by launches. Both run on the current CUDA stream (so CUDA graphs capture them),
/// asynchronously, and compute in float32 with upstream FLUX.2's rounding points (the .cu file
/// says where). The engine uses them only where they measure faster than libtorch
/// (Flux2Transformer::with_fused_norms, bench_flux2's `fused_norms` section).
///
/// Inputs that break the contract (device, dtype, shapes, strides) throw c10::Error naming the
/// input and what was expected. Threading: as any CUDA op (the caller's current stream).

#include <string>

#include <ATen/core/Tensor.h>

namespace infill::kernels {

/// Why the fused norms cannot run on `device` ("" when they can): a CPU device, or a build
/// against a libtorch without CUDA.
std::string fused_norms_unavailable(const at::Device& device);

/// out = RoPE(RMSNorm(x) * scale) per head, as FLUX.2's QK norm followed by its rotary
/// embedding: x [R, heads * d] (float32, fp16 or bf16 on a CUDA device; rows may be strided, as
/// a q slice of a qkv projection is; channels contiguous), scale [d] of x's dtype, cos and sin
/// [R, d / 2] of x's dtype or float32 (channel pair i of every head rotated by angle i), out
/// [R, heads * d] of x's dtype and device (rows may be strided, e.g. one segment's rows of a
/// round's buffer; it must not overlap x).
void fused_rms_norm_rope(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& cos,
                         const at::Tensor& sin, int64_t heads, double eps, at::Tensor out);

/// out = LayerNorm(x) * (1 + scale) + shift row by row (LayerNorm without affine weights, as
/// FLUX.2's pre-norms, then its modulation): x and out [R, W] of one dtype on one CUDA device
/// (rows may be strided, e.g. one segment's rows of a packed round; out may be x), shift and
/// scale W values of x's dtype ([W] or [1, W], contiguous).
void fused_layer_norm_modulate(const at::Tensor& x, const at::Tensor& shift,
                               const at::Tensor& scale, at::Tensor out, double eps);

}  // namespace infill::kernels
