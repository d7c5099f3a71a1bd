#pragma once
/// FLUX.2 forwards over several devices at once (issue 41), for steps that compute many rows:
/// prepare runs, full steps, and masked steps of large masks.
/// - Ulysses sequence parallelism (DeepSpeed-Ulysses, as xDiT runs FLUX): each rank computes a
///   share of the sequence's rows through every linear layer, and at each attention trades
///   rows for heads with the others (all-to-all), so that it attends over the whole sequence
///   for heads / P of the heads (klein's 24 heads split over 2, 3, 4, 6 or 8 ranks). A sink's
///   K/V arrive rank by rank, each rank writing its own rows of the one entry. A masked step
///   shares its masked rows the same way; each rank reads its heads' columns of the cached K/V
///   of every position and puts every rank's fresh rows in place before attending.
/// - Guidance on two devices (Katz's latent parallelism): a guided step's conditional and
///   unconditional segments, each on its own rank at once.
/// Every rank runs the same call at once on its own thread, with the same inputs.

#include <cstdint>
#include <span>
#include <vector>

#include <ATen/core/Tensor.h>

#include "model/flux2_transformer.h"
#include "model/sequence_group.h"

namespace infill {

/// One rank's rows of a sequence of text rows then image (and reference) rows: the text and
/// the image rows are each split into `ranks` consecutive runs as even as possible (the first
/// runs one row longer), so each rank holds a share of both streams.
struct Flux2SequenceShare {
  int64_t text_begin = 0, text_rows = 0;
  int64_t image_begin = 0, image_rows = 0;  ///< within the image rows
  int64_t rows() const { return text_rows + image_rows; }
};
std::vector<Flux2SequenceShare> flux2_sequence_shares(int64_t text_rows, int64_t image_rows, int ranks);

/// This rank's share of `whole`, a segment for one device: its text and image rows, their ids
/// and positions, the group and every rank's rows; timestep, guidance, sink and adapters as
/// `whole`'s. `whole` is either
/// - a full forward (every row of its sequence in order, no KvSource), whose shares attend
///   among themselves, or
/// - a masked forward (the rows of `positions` computed, the others' K/V read from `kv`, no
///   sink): the share reads `whole.kv`, which must be this rank's own source of the same K/V
///   (sources are read by one thread), and carries every rank's positions (group_positions).
/// Neither may have a recomputed prefix. invalid_argument otherwise, or when `whole` has fewer
/// image rows than ranks.
Result<Flux2Segment> flux2_sequence_share(const Flux2Segment& whole, SequenceGroup& group);

/// `whole` in sequence parallel over `group`: every rank calls it at once with the same
/// segment (a masked one with a KvSource of its own) and gets the whole prediction
/// [R_i, in_channels] float32 on the CPU, equal to Flux2Transformer::forward of `whole` on one
/// device up to float rounding. Throws c10::Error when a collective fails (the group is then
/// out of use).
at::Tensor flux2_forward_sequence_parallel(const Flux2Transformer& model, const Flux2Segment& whole,
                                           SequenceGroup& group);

/// One segment per rank, each on its own device at once (a guided step's two halves on two
/// devices); every rank gets the prediction of all of them in segment order, as one
/// Flux2Transformer::forward of the packed segments gives it. Precondition: as many segments
/// as ranks, none with a recomputed prefix; each segment's KvSource, if any, is read by its rank
/// alone.
at::Tensor flux2_forward_segment_per_rank(const Flux2Transformer& model, std::span<Flux2Segment> segments,
                                          SequenceGroup& group);

/// Both: a guided step's two segments at once, each in Ulysses sequence parallel over its own
/// half of the ranks (xDiT's CFG parallelism times Ulysses). `whole` holds every rank, the
/// prompted half's first: its ranks [0, P/2) run segments[0] over `half` (their own group),
/// ranks [P/2, P) run segments[1]; then each rank trades its half's prediction with its peer
/// in the other half (rank i with i + P/2, over `whole`), so every rank gets both halves' rows
/// in segment order, as flux2_forward_segment_per_rank gives them. Each segment is as
/// flux2_forward_sequence_parallel takes it (a masked one with this rank's own KvSource).
/// Precondition: two segments, `whole` of an even size, `half` of half its size.
at::Tensor flux2_forward_halves_sequence_parallel(const Flux2Transformer& model, std::span<const Flux2Segment> segments,
                                                  SequenceGroup& whole, SequenceGroup& half);

}  // namespace infill
