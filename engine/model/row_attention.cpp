#include "model/row_attention.h"

#include <ATen/ATen.h>

#include "kernels/masked_attention.h"
#include "model/torch_compat.h"

namespace infill {

at::Tensor row_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t heads,
                         double scale) {
  if (q.device().is_cpu() && q.scalar_type() == at::kFloat) return kernels::masked_attention(q, k, v, heads, scale);
#if INFILL_TORCH_HAS_SDPA
  if (q.device().is_cuda()) {
    // [1, heads, rows, d] views: no copies; the kernels need the last dimension contiguous.
    const int64_t m = q.size(0), l = k.size(0), d = q.size(1) / heads;
    auto heads_view = [&](const at::Tensor& x, int64_t rows) {
      return x.reshape({rows, heads, d}).transpose(0, 1).unsqueeze(0);
    };
    const at::Tensor out = at::scaled_dot_product_attention(heads_view(q, m), heads_view(k, l), heads_view(v, l), {},
                                                            0.0, false, scale);
    return out.squeeze(0).transpose(0, 1).reshape({m, heads * d});
  }
#endif
  return kernels::masked_attention_reference(q, k, v, heads, scale);
}

}  // namespace infill
