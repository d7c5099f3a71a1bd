#include "pipeline/flux2_sequence.h"

#include <ATen/ATen.h>

namespace infill {

at::Tensor flux2_text_ids(int64_t length) {
  at::Tensor ids = at::zeros({length, 4}, at::kFloat);
  ids.select(1, 3).copy_(at::arange(length, at::kFloat));
  return ids;
}

at::Tensor flux2_grid_ids(int64_t h, int64_t w, int t) {
  at::Tensor ids = at::zeros({h * w, 4}, at::kFloat);
  const at::Tensor index = at::arange(h * w, at::kLong);
  ids.select(1, 0).fill_(static_cast<double>(t));
  ids.select(1, 1).copy_(at::floor_divide(index, w));
  ids.select(1, 2).copy_(at::remainder(index, w));
  return ids;
}

at::Tensor latent_to_tokens(const at::Tensor& chw) {
  return chw.reshape({chw.size(0), chw.size(1) * chw.size(2)}).t().contiguous();
}

at::Tensor tokens_to_latent(const at::Tensor& rows, int64_t h, int64_t w) {
  return rows.t().reshape({rows.size(1), h, w}).contiguous();
}

}  // namespace infill
