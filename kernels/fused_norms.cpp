#include "kernels/fused_norms.h"

#include <utility>

#include <c10/util/Exception.h>

#if INFILL_WITH_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "kernels/cuda/fused_norms_launch.h"
#endif

namespace infill::kernels {
namespace {

#if INFILL_WITH_CUDA_KERNELS
cuda::RowType row_type(const at::Tensor& t, const char* name) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return cuda::RowType::kFloat;
    case at::kHalf:
      return cuda::RowType::kHalf;
    case at::kBFloat16:
      return cuda::RowType::kBFloat16;
    default:
      TORCH_CHECK(false, name, " must be float32, float16 or bfloat16, not ", t.scalar_type());
  }
}

void check_launch(cudaError_t error, const char* kernel) {
  TORCH_CHECK(error == cudaSuccess, kernel,
              ": the CUDA launch failed: ", cudaGetErrorString(error));
}
#endif

void check_on_gpu(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.defined(), name, " is undefined");
  const std::string why = fused_norms_unavailable(t.device());
  TORCH_CHECK(why.empty(), name, ": ", why);
}

// A [R, W] tensor whose channels are contiguous (rows may be strided).
void check_rows(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.dim() == 2, name, " must be [rows, channels], not ", t.sizes());
  TORCH_CHECK(t.size(1) <= 1 || t.stride(1) == 1, name, "'s channels must be contiguous (stride ",
              t.stride(1), ")");
}

// `n` values of `dtype` on `device`, contiguous, as [n] or [1, n].
void check_vector(const at::Tensor& t, const char* name, int64_t n, const at::Tensor& like) {
  TORCH_CHECK(t.defined() && t.numel() == n && (t.dim() == 1 || (t.dim() == 2 && t.size(0) == 1)),
              name, " must hold ", n, " values ([", n, "] or [1, ", n, "]), not ", t.sizes());
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK(t.scalar_type() == like.scalar_type() && t.device() == like.device(), name,
              " must be ", like.scalar_type(), " on ", like.device(), " as the rows are, not ",
              t.scalar_type(), " on ", t.device());
}

// out [R, W] as x, of its dtype on its device, channels contiguous.
void check_out(const at::Tensor& out, const at::Tensor& x) {
  TORCH_CHECK(out.defined() && out.sizes() == x.sizes(), "out must be ", x.sizes(),
              " as x is, not ", out.defined() ? out.sizes() : at::IntArrayRef{});
  check_rows(out, "out");
  TORCH_CHECK(out.scalar_type() == x.scalar_type() && out.device() == x.device(), "out must be ",
              x.scalar_type(), " on ", x.device(), " as x is, not ", out.scalar_type(), " on ",
              out.device());
}

}  // namespace

std::string fused_norms_unavailable(const at::Device& device) {
  if (!device.is_cuda())
    return device.str() + ": the fused norms are CUDA kernels (on the CPU libtorch's ops run)";
#if INFILL_WITH_CUDA_KERNELS
  return "";
#else
  return device.str() +
         ": this build has no CUDA kernels (a libtorch without CUDA, or no nvcc at the build)";
#endif
}

void fused_rms_norm_rope(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& cos,
                         const at::Tensor& sin, int64_t heads, double eps, at::Tensor out) {
  check_on_gpu(x, "x");
  check_rows(x, "x");
  TORCH_CHECK(heads > 0 && x.size(1) % heads == 0, "x's ", x.size(1),
              " channels do not split into ", heads, " heads");
  const int64_t d = x.size(1) / heads;
  TORCH_CHECK(d % 2 == 0, "the head width ", d, " must be even (RoPE rotates channel pairs)");
  check_vector(scale, "scale", d, x);
  for (const auto& [table, name] : {std::pair{&cos, "cos"}, std::pair{&sin, "sin"}}) {
    TORCH_CHECK(table->defined() && table->dim() == 2 && table->size(0) == x.size(0) &&
                    table->size(1) == d / 2,
                name, " must be [", x.size(0), ", ", d / 2, "], not ",
                table->defined() ? table->sizes() : at::IntArrayRef{});
    TORCH_CHECK(table->stride(1) == 1 || d == 2, name, "'s columns must be contiguous");
    TORCH_CHECK(table->device() == x.device(), name, " must be on ", x.device(), ", not ",
                table->device());
    TORCH_CHECK(table->scalar_type() == x.scalar_type() || table->scalar_type() == at::kFloat, name,
                " must be ", x.scalar_type(), " or float32, not ", table->scalar_type());
  }
  TORCH_CHECK(cos.scalar_type() == sin.scalar_type() && cos.stride(0) == sin.stride(0),
              "cos and sin must share their dtype and row stride");
  check_out(out, x);
#if INFILL_WITH_CUDA_KERNELS
  const c10::cuda::CUDAGuard guard(x.device());
  check_launch(cuda::launch_rms_norm_rope(
                   row_type(x, "x"), x.const_data_ptr(), x.stride(0), scale.const_data_ptr(),
                   cos.const_data_ptr(), sin.const_data_ptr(),
                   cos.scalar_type() == at::kFloat && x.scalar_type() != at::kFloat, cos.stride(0),
                   out.mutable_data_ptr(), out.stride(0), x.size(0), static_cast<int>(heads),
                   static_cast<int>(d), static_cast<float>(eps),
                   c10::cuda::getCurrentCUDAStream(x.device().index()).stream()),
               "fused_rms_norm_rope");
#endif
}

void fused_layer_norm_modulate(const at::Tensor& x, const at::Tensor& shift,
                               const at::Tensor& scale, at::Tensor out, double eps) {
  check_on_gpu(x, "x");
  check_rows(x, "x");
  check_out(out, x);
  check_vector(shift, "shift", x.size(1), x);
  check_vector(scale, "scale", x.size(1), x);
  TORCH_CHECK(x.size(1) > 0, "x has no channels");
#if INFILL_WITH_CUDA_KERNELS
  const c10::cuda::CUDAGuard guard(x.device());
  check_launch(cuda::launch_layer_norm_modulate(
                   row_type(x, "x"), x.const_data_ptr(), x.stride(0), shift.const_data_ptr(),
                   scale.const_data_ptr(), out.mutable_data_ptr(), out.stride(0), x.size(0),
                   static_cast<int>(x.size(1)), static_cast<float>(eps),
                   c10::cuda::getCurrentCUDAStream(x.device().index()).stream()),
               "fused_layer_norm_modulate");
#endif
}

}  // namespace infill::kernels
