#pragma once
/// The adapters of one packed forward, stacked per layer so that a layer's low-rank terms cost
/// two GEMMs for every segment of the round, whatever their sets:
///
///   y += ((x down_all^T) * coef[:, owner]) up_all^T
///
/// down_all [sum r, in] and up_all [out, sum r] stack, along the rank, every distinct adapter
/// of the round that adapts the layer; owner [sum r] names each column's adapter; coef
/// [rows, K] holds each row's strength of each adapter (its segment's, 0 where the segment's
/// set lacks it). A row thus gets exactly its own set's terms, s * (x A^T) B^T per adapter,
/// and no row pays for padding: ranks may differ per adapter and per layer. (Padding every
/// set to the largest rank and batching per segment was the alternative; it needs rows
/// grouped per segment and padded too, where this needs neither.)
///
/// Base weights are never touched: a segment without adapters has zero coefficients (and a
/// round without adapters skips all of it), so its rows are exact.
/// Threading: built and used by the forward's thread.

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "model/lora_adapter.h"

namespace infill {

class LoraRound {
 public:
  LoraRound() = default;
  /// One set per segment (empty sets allowed); tensors are made on `options`' device and
  /// dtype.
  static LoraRound build(std::span<const AdapterSet* const> sets, const at::TensorOptions& options);

  bool empty() const { return adapters_.empty(); }
  /// Distinct adapters of the round.
  size_t adapters() const { return adapters_.size(); }
  /// Bytes of the tensors it holds (stacked factors, owners, coefficients; a factor that is a
  /// view of one adapter's is counted too).
  int64_t bytes() const;
  /// [sum rows, K]: the coefficients of rows packed segment after segment, `rows[i]` of
  /// segment i.
  at::Tensor row_coefficients(std::span<const int64_t> rows) const;
  /// Segment i's coefficients [1, K], for a per-segment layer (modulation, time embedding).
  at::Tensor segment_coefficients(size_t segment) const;
  /// y [R, out] (or [out] with x [in]) += the round's terms of `weight` for rows x [R, in]
  /// whose coefficients are `coef` [R, K]. Nothing when no adapter of the round adapts it.
  void add(const std::string& weight, const at::Tensor& x, const at::Tensor& coef, at::Tensor& y) const;

 private:
  struct Stacked {
    at::Tensor down;   // [sum r, in]
    at::Tensor up_t;   // [sum r, out], a view of up_all
    at::Tensor owner;  // int64 [sum r]: the adapter index of each column
  };
  std::vector<const LoraAdapter*> adapters_;
  at::Tensor segment_coef_;  // [segments, K]
  std::map<std::string, Stacked> layers_;
};

}  // namespace infill
