#include "model/attention_over_cache.h"

#include <ATen/ATen.h>

#include "model/row_attention.h"

namespace infill {

at::Tensor attention_with_rows_swapped_in(const at::Tensor& q, at::Tensor kv, const at::Tensor& positions,
                                          const at::Tensor& k, const at::Tensor& v, int64_t heads, double scale) {
  const int64_t H = k.size(1);
  TORCH_CHECK(kv.dim() == 2 && kv.size(1) == 2 * H, "attention over cached K/V: the cache is ", kv.sizes(),
              ", expected [L, ", 2 * H, "]");
  TORCH_CHECK(kv.scalar_type() == k.scalar_type() && kv.scalar_type() == v.scalar_type(),
              "attention over cached K/V: the cache is ", kv.scalar_type(), ", the fresh rows ", k.scalar_type());
  TORCH_CHECK(positions.size(0) == k.size(0) && positions.size(0) == v.size(0),
              "attention over cached K/V: ", positions.size(0), " positions for ", k.size(0), " fresh rows");
  // One gather, one scatter in and one scatter back: K and V side by side cost what one does.
  const at::Tensor cached = kv.index_select(0, positions);
  kv.index_copy_(0, positions, at::cat({k, v}, 1));
  at::Tensor out;
  try {
    out = row_attention(q, kv.narrow(1, 0, H), kv.narrow(1, H, H), heads, scale);
  } catch (...) {
    kv.index_copy_(0, positions, cached);
    throw;
  }
  kv.index_copy_(0, positions, cached);
  return out;
}

}  // namespace infill
