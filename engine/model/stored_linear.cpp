#include "model/stored_linear.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

namespace infill {

at::Tensor stored_linear(const at::Tensor& x, const at::Tensor& w) {
  if (w.scalar_type() == x.scalar_type()) return at::linear(x, w);
  if (!x.device().is_cpu()) return at::linear(x, w.to(x.scalar_type()));
  // The scratch is written in place: it must be an inference tensor written in inference
  // mode, whichever mode the first caller of this thread was in.
  c10::InferenceMode guard;
  thread_local at::Tensor scratch;
  const int64_t elements = w.numel();
  if (!scratch.defined() || scratch.numel() < elements || scratch.scalar_type() != x.scalar_type()) {
    scratch = at::empty({elements}, x.options());
  }
  at::Tensor converted = scratch.narrow(0, 0, elements).view(w.sizes());
  converted.copy_(w);
  return at::linear(x, converted);
}

}  // namespace infill
