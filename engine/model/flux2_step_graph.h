#pragma once
/// A masked FLUX.2 round as pieces of recorded device work (CUDA graphs on a GPU; issue 39):
/// the launch-bound part of a step, replayed per (model, round shape) instead of issued kernel
/// by kernel from the host.
///
/// Shape: per segment its text rows, its image rows rounded up to a row bucket (64, 128, 192,
/// 256, 384, 512, 768, 1024) and its sequence length; the key of a graph. A round whose
/// segments fit is run as depth + 1 recorded pieces with the attention of each block between
/// them, run eagerly (as vLLM's piecewise graphs do): the attention reads each segment's cached
/// K/V from its source, whose tensors change from step to step, and it needs only the real
/// rows' counts, which change within a bucket. Everything else (input projections, the
/// modulation from the timestep embedding, norms, the QKV and output projections, RoPE from the
/// segment's tables, the MLPs, the final layer) is row-wise over static buffers.
///
/// Padding: a segment's image rows are padded to its bucket with zero rows (zero RoPE tables).
/// They pass through the row-wise pieces like any row, which mixes nothing between rows; the
/// attention takes only the real rows (queries, and the fresh K/V that replace cached ones), so
/// a padding row is neither attended to nor written anywhere a real row reads; its prediction
/// is dropped. So padded rows equal unpadded ones (tested on the CPU).
///
/// Inputs are copied into the graph's buffers before each replay (the text and image rows,
/// RoPE tables, the timestep and guidance embeddings); nothing a piece reads changes address.
///
/// Adapters (LoRAs): each segment's set, with its strengths, is part of the key. The graph
/// stacks the round's adapters (model/lora_round.h) and each packed row's coefficients at its
/// first run and keeps them, with the sets, for its life; every replay multiplies those same
/// tensors, as the eager forward would. Another set or strength is another graph, so an edit
/// with a LoRA replays like one without.
/// Threading: one thread at a time.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "model/flux2_transformer.h"
#include "model/work_capture.h"

namespace infill {

/// The row buckets, ascending.
std::span<const int64_t> flux2_row_buckets();
/// The smallest bucket holding `rows`; 0 when `rows` exceeds the largest (run eagerly).
int64_t flux2_row_bucket(int64_t rows);

/// One segment's place in a graph's shape.
struct Flux2GraphSegmentShape {
  int64_t text_rows = 0;   ///< text rows computed (template-keyed) or 0 (prompt-keyed)
  int64_t image_rows = 0;  ///< the bucket of its image rows
  int64_t sequence = 0;    ///< positions in its sequence
  std::string adapters;    ///< adapter_set_key of its adapters: "" for none
  bool operator==(const Flux2GraphSegmentShape&) const = default;
};

/// The shape of a round: its segments' shapes in order.
struct Flux2GraphKey {
  std::vector<Flux2GraphSegmentShape> segments;
  bool operator==(const Flux2GraphKey&) const = default;
  /// "t0+128/2577,t5+64/2577": text rows, bucket, sequence per segment; a segment with
  /// adapters gains "@" and its adapters' ids' first 8 digits ("t0+128/2577@9c1f03ab").
  std::string text() const;
};

/// The key of `segments`, or why they cannot run as a graph (an empty string when they can):
/// each segment must compute some of its positions reading the others from a KvSource, with no
/// recomputed prefix, sink or sequence group, and its image rows within a bucket.
std::string flux2_graph_refusal(std::span<const Flux2Segment> segments, const Flux2Config& config);
Flux2GraphKey flux2_graph_key(std::span<const Flux2Segment> segments);

class Flux2StepGraph {
 public:
  /// The graph of rounds of shape `key` on `model` (which must outlive it), recorded through
  /// `capture` on the first run. Allocates its input buffers on the model's device.
  Flux2StepGraph(const Flux2Transformer& model, Flux2GraphKey key, std::unique_ptr<WorkCapture> capture);
  ~Flux2StepGraph();

  /// The prediction rows of a round of this shape, as Flux2Transformer::forward_on_device
  /// gives them: [sum of real image rows, in_channels] float32 on the device (a tensor of its
  /// own, not a buffer of the graph). The first run records; later ones replay. Precondition:
  /// flux2_graph_key(segments) == key(), and the refusal is empty.
  at::Tensor run(std::span<Flux2Segment> segments);

  const Flux2GraphKey& key() const { return key_; }
  bool recorded() const { return !pieces_.empty(); }
  /// Device bytes of the recorded pieces (their pool), of the input buffers and of the
  /// adapters' stacked tensors it keeps.
  int64_t bytes() const;
  /// Each segment's adapter set, which it holds for its stacked factors (those may be views of
  /// the adapters' tensors); empty before the first run.
  const std::vector<AdapterSet>& adapter_sets() const;

 private:
  struct Round;  // the buffers and activations the pieces share
  void stage_inputs(std::span<Flux2Segment> segments);
  // The round's adapters and each packed row's coefficients, at the first run.
  void stack_adapters(std::span<const Flux2Segment> segments);
  // Piece p: the post-attention part of block p - 1 (none for p = 0) and the pre-attention part
  // of block p (the final layer for p = depth).
  void piece(int p);
  void attention(int block, std::span<Flux2Segment> segments);

  const Flux2Transformer& model_;
  Flux2GraphKey key_;
  std::unique_ptr<WorkCapture> capture_;
  std::unique_ptr<Round> round_;
  std::vector<std::unique_ptr<CapturedWork>> pieces_;
};

}  // namespace infill
