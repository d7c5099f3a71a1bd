#include "model/float8_linear.h"

#include <string>

#include <ATen/ATen.h>

#include "model/torch_compat.h"
#ifdef INFILL_TORCH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

namespace infill {

Status float8_compute_status(const ComputeDevice& device) {
  if (!device.cuda) {
    return invalid_argument(device.name() + ": FP8 weights are for CUDA devices (the CPU computes in float32)");
  }
  INFILL_RETURN_IF_ERROR(check_compute_device(device));
#if INFILL_TORCH_HAS_FLOAT8_MM && defined(INFILL_TORCH_CUDA)
  const auto* properties = at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(device.index));
  // _scaled_mm's rowwise kernel is built for sm_89 (Ada) and sm_90+ (Hopper, Blackwell).
  if (properties->major * 10 + properties->minor < 89) {
    return Status(ErrorCode::kUnimplemented,
                  device.name() + " (" + properties->name + ", compute capability " + std::to_string(properties->major) +
                      "." + std::to_string(properties->minor) +
                      "): FP8 weights need compute capability 8.9 or newer (Ada, Hopper, Blackwell)");
  }
  return {};
#else
  return Status(ErrorCode::kUnimplemented, device.name() + ": this build's libtorch (" + TORCH_VERSION +
                                               ") has no FP8 matrix product (2.5 or newer with CUDA)");
#endif
}

#if INFILL_TORCH_HAS_FLOAT8_MM

namespace {

// Per-row scales of x [M, K]: max |row| / 448 as [M, 1] float32 (1 for a row of zeros, whose
// codes are zeros whatever the scale), and x's codes: x / scale, clamped to the finite range
// (torch's float-to-E4M3FN cast turns values past it into NaN, and a quotient of the row's
// maximum may round just past 448).
std::pair<at::Tensor, at::Tensor> quantize_rows(const at::Tensor& x) {
  const at::Tensor xf = x.to(at::kFloat);
  at::Tensor scale = xf.abs().amax(1, /*keepdim=*/true).div_(kFloat8E4M3Max);
  scale.masked_fill_(scale == 0, 1.0);
  const at::Tensor codes =
      xf.div(scale).clamp_(-kFloat8E4M3Max, kFloat8E4M3Max).to(c10::ScalarType::Float8_e4m3fn);
  return {codes, scale};
}

}  // namespace

Float8Weight quantize_float8_rows(const at::Tensor& w) {
  TORCH_CHECK(w.dim() == 2, "quantize_float8_rows: the weight must be [out, in]");
  auto [codes, scale] = quantize_rows(w);
  return {codes.contiguous(), scale.reshape({1, -1}).contiguous()};
}

Float8Weight quantize_float8_rows(const at::Tensor& w, const at::Tensor& row_scale) {
  TORCH_CHECK(w.dim() == 2 && row_scale.dim() == 1 && row_scale.size(0) == w.size(0),
              "quantize_float8_rows: the weight must be [out, in] and its scales [out]");
  const at::Tensor scale = row_scale.to(w.device(), at::kFloat).reshape({-1, 1});
  // One float32 copy, divided and clamped in place: a layer's transients stay 2x its bf16
  // (Flux2Transformer::to_device_float8 counts on it).
  const at::Tensor codes = w.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true)
                               .div_(scale)
                               .clamp_(-kFloat8E4M3Max, kFloat8E4M3Max)
                               .to(c10::ScalarType::Float8_e4m3fn);
  return {codes.contiguous(), scale.reshape({1, -1}).contiguous()};
}

at::Tensor dequantize_float8_rows(const Float8Weight& w, at::ScalarType dtype) {
  return w.codes.to(at::kFloat).mul_(w.scale.reshape({-1, 1})).to(dtype);
}

at::Tensor float8_linear(const at::Tensor& x, const Float8Weight& w) {
  const bool vector = x.dim() == 1;
  const at::Tensor x2 = vector ? x.unsqueeze(0) : x;
  TORCH_CHECK(x2.dim() == 2 && x2.size(1) == w.codes.size(1), "float8_linear: x must be [M, ", w.codes.size(1), "]");
  if (x2.size(0) == 0) return at::empty({0, w.codes.size(0)}, x.options().dtype(at::kBFloat16));
  auto [codes, scale] = quantize_rows(x2.contiguous());
  // mat2 column-major ([in, out] as the transpose of the row-major codes): the layout the
  // rowwise kernel takes; the scales as [M, 1] and [1, out].
  at::Tensor y = at::_scaled_mm(codes, w.codes.t(), scale, w.scale, /*bias=*/std::nullopt, /*scale_result=*/std::nullopt,
                                at::kBFloat16, /*use_fast_accum=*/false);
  return vector ? y.squeeze(0) : y;
}

#else

Float8Weight quantize_float8_rows(const at::Tensor&) {
  TORCH_CHECK(false, "quantize_float8_rows: this build's libtorch has no FP8 types");
}

Float8Weight quantize_float8_rows(const at::Tensor&, const at::Tensor&) {
  TORCH_CHECK(false, "quantize_float8_rows: this build's libtorch has no FP8 types");
}

at::Tensor dequantize_float8_rows(const Float8Weight&, at::ScalarType) {
  TORCH_CHECK(false, "dequantize_float8_rows: this build's libtorch has no FP8 types");
}

at::Tensor float8_linear(const at::Tensor&, const Float8Weight&) {
  TORCH_CHECK(false, "float8_linear: this build's libtorch has no FP8 matrix product");
}

#endif

}  // namespace infill
