#pragma once
/// How a mask-aware forward reads and writes the per-block K/V of a request's tokens: shared
/// by every model family (the bundled DiT, the FLUX.2 transformer) and the activation cache.
/// A block index counts every attention layer of the network in execution order.

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace infill {

/// Supplies the cached K and V of all tokens of one request, block by block.
class KvSource {
 public:
  virtual ~KvSource() = default;
  /// Fills `k` and `v` ([L, H] float32, contiguous, owned by the caller) with the cached
  /// activations of `block`. Called on the step loop in increasing block order.
  virtual void fetch(int block, at::Tensor& k, at::Tensor& v) = 0;
  /// The cached K and V of `block` as fp16 slabs ([L, H] row-major IEEE binary16), valid
  /// until the next call on this source, when the source holds them in memory; false when
  /// it cannot (the caller then uses fetch). Lets the attention read the cache directly
  /// instead of through a float copy of all L rows.
  virtual bool fp16_slabs(int /*block*/, const uint16_t** /*k*/, const uint16_t** /*v*/) { return false; }
  /// The cached K and V of `block` as tensors [L, H] (fp16, or the resident tier's dtype;
  /// rows may be strided) already on `device` (a GPU's resident tier), valid until the next call on this source; false when the source holds
  /// none there (the caller then copies slabs or fetches). Spares a GPU forward the host to
  /// device copy of every block.
  virtual bool device_tensors(int /*block*/, const at::Device& /*device*/, at::Tensor* /*k*/, at::Tensor* /*v*/) {
    return false;
  }
  /// The cached K and V of `block` side by side, [L, 2 * H] (K in the first H columns), on
  /// `device` in the source's dtype, for a forward there to swap its fresh rows into: the
  /// caller may write rows of it if it writes back what it read before it returns (in stream
  /// order on a GPU; model/attention_over_cache.h), so that a masked step touches its own rows
  /// only instead of copying all L. Valid until the next call on this source; false when the
  /// source holds no such tensor there (the caller then uses device_tensors and copies).
  /// Only the thread that runs the forward on `device` reads these tensors meanwhile.
  virtual bool device_kv_rows(int /*block*/, const at::Device& /*device*/, at::Tensor* /*kv*/) { return false; }
};

/// Receives the fresh K and V of all tokens of a request computed in full (the prepare job).
class KvSink {
 public:
  virtual ~KvSink() = default;
  /// `k`, `v`: [L, H] float32, possibly strided views valid only during the call.
  virtual void store(int block, const at::Tensor& k, const at::Tensor& v) = 0;
  /// Some rows of the sequence: one rank's share of a sequence-parallel forward
  /// (model/flux2_sequence_parallel.h). `positions`: int64 [R] on the CPU, ascending; `k`, `v`:
  /// [R, H]. The ranks of one forward call it at once from their threads, on disjoint rows.
  /// Sinks that take whole sequences only refuse (c10::Error).
  virtual void store_rows(int block, const at::Tensor& positions, const at::Tensor& k, const at::Tensor& v);
};

inline void KvSink::store_rows(int, const at::Tensor&, const at::Tensor&, const at::Tensor&) {
  TORCH_CHECK(false, "this K/V sink takes whole sequences only, not a sequence-parallel rank's rows");
}

}  // namespace infill
