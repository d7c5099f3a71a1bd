#include "pipeline/cached_kv.h"

#include <ATen/ATen.h>

namespace infill {

void fp16_slab_to_float(const uint16_t* slab, at::Tensor& out) {
  // from_blob does not take ownership; the slab outlives the copy.
  at::Tensor half = at::from_blob(const_cast<uint16_t*>(slab), out.sizes(), at::kHalf);
  out.copy_(half);
}

void float_to_fp16_slab(const at::Tensor& in, uint16_t* slab) {
  at::Tensor half = at::from_blob(slab, in.sizes(), at::kHalf);
  half.copy_(in);
}

void EntryKvSource::fetch(int block, at::Tensor& k, at::Tensor& v) {
  fp16_slab_to_float(entry_->k(step_, block), k);
  fp16_slab_to_float(entry_->v(step_, block), v);
}

void EntryKvSink::store(int block, const at::Tensor& k, const at::Tensor& v) {
  float_to_fp16_slab(k, entry_.k(step_, block));
  float_to_fp16_slab(v, entry_.v(step_, block));
}

}  // namespace infill
