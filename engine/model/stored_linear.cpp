#include "model/stored_linear.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

namespace infill {

namespace {

// Output rows converted at a time on the few-rows path: 64 x 3072 floats = 768 KiB, within
// the L2 of a server core, so the chunk is multiplied while it is hot.
constexpr int64_t kChunkRows = 64;
// Above this many rows the whole-layer path wins: each chunk GEMM re-reads all of x, and
// the conversion is a small share of a GEMM this tall.
constexpr int64_t kWholeLayerRows = 384;

// A float buffer of at least `elements`, reused by the calling thread across calls.
at::Tensor thread_scratch(int64_t elements, const at::TensorOptions& options) {
  thread_local at::Tensor scratch;
  if (!scratch.defined() || scratch.numel() < elements || scratch.dtype() != options.dtype()) {
    scratch = at::empty({elements}, options);
  }
  return scratch.narrow(0, 0, elements);
}

}  // namespace

at::Tensor stored_linear(const at::Tensor& x, const at::Tensor& w) {
  if (w.scalar_type() == x.scalar_type() || !x.device().is_cpu()) {
    return at::linear(x, w.scalar_type() == x.scalar_type() ? w : w.to(x.scalar_type()));
  }
  if (x.dim() == 1) return stored_linear(x.unsqueeze(0), w).squeeze(0);
  // The scratch is written in place: it must be an inference tensor written in inference
  // mode, whichever mode the first caller of this thread was in.
  c10::InferenceMode guard;
  const int64_t m = x.size(0), out_features = w.size(0), in_features = w.size(1);
  TORCH_CHECK(x.dim() == 2 && x.size(1) == in_features, "stored_linear: x is ", x.sizes(), ", weight is ", w.sizes());
  if (m >= kWholeLayerRows) {
    at::Tensor converted = thread_scratch(out_features * in_features, x.options()).view({out_features, in_features});
    converted.copy_(w);
    return at::linear(x, converted);
  }
  at::Tensor y = at::empty({m, out_features}, x.options());
  const int64_t chunks = (out_features + kChunkRows - 1) / kChunkRows;
  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    at::Tensor buffer = thread_scratch(kChunkRows * in_features, x.options()).view({kChunkRows, in_features});
    for (int64_t c = begin; c < end; ++c) {
      const int64_t first = c * kChunkRows, rows = std::min(kChunkRows, out_features - first);
      at::Tensor chunk = buffer.narrow(0, 0, rows);
      chunk.copy_(w.narrow(0, first, rows));
      at::Tensor target = y.narrow(1, first, rows);
      at::mm_out(target, x, chunk.t());
    }
  });
  return y;
}

}  // namespace infill
