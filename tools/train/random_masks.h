#pragma once
/// Random edit masks for training and evaluation: brush strokes, rectangles and blobs, with
/// a mask ratio drawn from a range, as a designer would paint them.

#include <ATen/core/Tensor.h>

namespace infill::train {

struct MaskOptions {
  int size = 256;            ///< square mask side in pixels
  double min_ratio = 0.02;   ///< masked pixel fraction, drawn uniformly in [min, max]
  double max_ratio = 0.6;
};

/// float [size, size] of 0 / 1 whose masked fraction lies in [min_ratio, max_ratio]
/// (retrying shapes until it does). Deterministic given `gen`.
at::Tensor random_mask(const MaskOptions& options, at::Generator& gen);

/// `n` masks drawn one after another with random_mask: float [n, size, size].
at::Tensor random_masks(const MaskOptions& options, int n, at::Generator& gen);

}  // namespace infill::train
