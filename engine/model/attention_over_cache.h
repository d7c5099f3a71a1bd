#pragma once
/// A masked step's attention over a template's cached K/V held in the compute dtype on the
/// device (the device tier): the step's fresh rows are swapped into the cache's tensor for the
/// attention and the cached rows swapped back after, so the step reads and writes its own R
/// rows, not all L. The alternative, a converted copy of every cached row with the fresh rows
/// written into it, moved 4 x L x H elements per block per step: at klein 4B, 1024x1024 with a
/// reference image (8704 positions x 3072 channels x 25 blocks) about 5.3 GB per step, over a
/// millisecond of an H200's bandwidth, for a step whose target is 6 ms.

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace infill {

/// q [R, heads * d] attends over the L rows of `kv` [L, 2 * H] (cached K in columns [0, H),
/// V in [H, 2H)) with the rows `positions` (int64 [R] on kv's device, distinct) replaced by
/// the fresh k, v [R, H] -> [R, H] in q's dtype (row_attention's kernels).
/// `kv` is written during the call and holds its old rows again, in stream order, when the
/// call returns or throws; nobody else may read it meanwhile. k, v and kv share a dtype.
at::Tensor attention_with_rows_swapped_in(const at::Tensor& q, at::Tensor kv, const at::Tensor& positions,
                                          const at::Tensor& k, const at::Tensor& v, int64_t heads, double scale);

}  // namespace infill
