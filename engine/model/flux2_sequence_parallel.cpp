#include "model/flux2_sequence_parallel.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

namespace infill {

namespace {

// Splits `n` rows into `parts` consecutive runs, the first n % parts one row longer.
std::vector<std::pair<int64_t, int64_t>> runs(int64_t n, int parts) {
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t begin = 0;
  for (int p = 0; p < parts; ++p) {
    const int64_t rows = n / parts + (p < n % parts ? 1 : 0);
    out.emplace_back(begin, rows);
    begin += rows;
  }
  return out;
}

// Every rank sends `mine` [R, C] to every rank; each gets all ranks' rows in rank order.
at::Tensor all_gather_rows(SequenceGroup& group, const at::Tensor& mine, const std::vector<int64_t>& rank_rows) {
  const int P = group.size();
  const at::Tensor here = mine.to(group.device()).contiguous();
  const at::Tensor send = P == 1 ? here : here.repeat({P, 1});
  return group.all_to_all(send, std::vector<int64_t>(P, mine.size(0)), rank_rows);
}

}  // namespace

std::vector<Flux2SequenceShare> flux2_sequence_shares(int64_t text_rows, int64_t image_rows, int ranks) {
  const auto text = runs(text_rows, ranks), image = runs(image_rows, ranks);
  std::vector<Flux2SequenceShare> shares(ranks);
  for (int r = 0; r < ranks; ++r) shares[r] = {text[r].first, text[r].second, image[r].first, image[r].second};
  return shares;
}

Result<Flux2Segment> flux2_sequence_share(const Flux2Segment& whole, SequenceGroup& group) {
  const int64_t rt = whole.txt.defined() ? whole.txt.size(0) : 0;
  const int64_t ri = whole.img.defined() ? whole.img.size(0) : 0;
  const bool masked = whole.kv != nullptr;
  if (whole.full_blocks != 0 || whole.group != nullptr) {
    return invalid_argument("a sequence-parallel forward takes a one-device segment without a recomputed prefix");
  }
  if (!masked && (whole.positions.defined() || (whole.sequence_length != 0 && whole.sequence_length != rt + ri))) {
    return invalid_argument("a sequence-parallel forward without cached K/V takes a full forward's segment (every "
                            "row in order)");
  }
  at::Tensor positions;
  if (masked) {
    if (whole.sink != nullptr) return invalid_argument("a masked sequence-parallel forward records no K/V");
    if (!whole.positions.defined() || whole.positions.dim() != 1 || whole.positions.size(0) != rt + ri) {
      return invalid_argument("a masked sequence-parallel forward needs the positions of its " +
                              std::to_string(rt + ri) + " computed rows");
    }
    positions = whole.positions.to(at::kCPU, at::kLong).contiguous();
  }
  const int P = group.size();
  if (ri < P) {
    return invalid_argument("a sequence of " + std::to_string(ri) + " image rows does not split over " +
                            std::to_string(P) + " ranks");
  }
  const auto shares = flux2_sequence_shares(rt, ri, P);
  const Flux2SequenceShare& mine = shares[group.rank()];
  Flux2Segment s;
  if (rt > 0) {
    s.txt = whole.txt.narrow(0, mine.text_begin, mine.text_rows);
    s.txt_ids = whole.txt_ids.narrow(0, mine.text_begin, mine.text_rows);
  }
  s.img = whole.img.narrow(0, mine.image_begin, mine.image_rows);
  s.img_ids = whole.img_ids.narrow(0, mine.image_begin, mine.image_rows);
  // A rank's rows of the whole's: its text rows, then its image rows.
  auto rows_of = [&](const Flux2SequenceShare& share) {
    return at::cat({at::arange(share.text_begin, share.text_begin + share.text_rows, at::kLong),
                    at::arange(rt + share.image_begin, rt + share.image_begin + share.image_rows, at::kLong)});
  };
  if (masked) {
    s.positions = positions.index_select(0, rows_of(mine));
    s.sequence_length = whole.sequence_length;
    s.kv = whole.kv;
    std::vector<at::Tensor> every;
    for (const Flux2SequenceShare& share : shares) every.push_back(positions.index_select(0, rows_of(share)));
    s.group_positions = at::cat(every);
  } else {
    s.positions = rows_of(mine);
    s.sequence_length = rt + ri;
  }
  s.timestep = whole.timestep;
  s.guidance = whole.guidance;
  s.sink = whole.sink;
  s.adapters = whole.adapters;
  s.group = &group;
  for (const Flux2SequenceShare& share : shares) s.group_rows.push_back(share.rows());
  return s;
}

at::Tensor flux2_forward_sequence_parallel(const Flux2Transformer& model, const Flux2Segment& whole,
                                           SequenceGroup& group) {
  c10::InferenceMode guard;
  Result<Flux2Segment> share = flux2_sequence_share(whole, group);
  TORCH_CHECK(share.ok(), "FLUX.2 sequence-parallel forward: ", share.status().message());
  const at::Tensor mine = model.forward(std::span<Flux2Segment>(&*share, 1));  // [this rank's image rows, C]
  const int64_t rt = whole.txt.defined() ? whole.txt.size(0) : 0;
  std::vector<int64_t> image_rows;
  for (const Flux2SequenceShare& s : flux2_sequence_shares(rt, whole.img.size(0), group.size())) image_rows.push_back(s.image_rows);
  return all_gather_rows(group, mine, image_rows).to(at::kCPU, at::kFloat);
}

at::Tensor flux2_forward_segment_per_rank(const Flux2Transformer& model, std::span<Flux2Segment> segments,
                                          SequenceGroup& group) {
  c10::InferenceMode guard;
  TORCH_CHECK(static_cast<int>(segments.size()) == group.size(), "FLUX.2 forward over ", group.size(), " ranks: ",
              segments.size(), " segments, expected one per rank");
  for (const Flux2Segment& s : segments) {
    TORCH_CHECK(s.full_blocks == 0 && s.group == nullptr, "FLUX.2 forward over ", group.size(),
                " ranks: a segment per rank is computed on its rank alone, without a recomputed prefix");
  }
  const at::Tensor mine = model.forward(segments.subspan(group.rank(), 1));
  std::vector<int64_t> rows;
  for (const Flux2Segment& s : segments) rows.push_back(s.img.size(0));
  return all_gather_rows(group, mine, rows).to(at::kCPU, at::kFloat);
}

at::Tensor flux2_forward_halves_sequence_parallel(const Flux2Transformer& model, std::span<const Flux2Segment> segments,
                                                  SequenceGroup& whole, SequenceGroup& half) {
  c10::InferenceMode guard;
  const int P = whole.size(), d = P / 2;
  TORCH_CHECK(segments.size() == 2 && P >= 2 && P % 2 == 0 && half.size() == d, "FLUX.2 halves in sequence parallel: ",
              segments.size(), " segments over ", P, " ranks in halves of ", half.size(),
              ", expected 2 segments over an even number of ranks in two halves");
  const int mine = whole.rank() < d ? 0 : 1;
  TORCH_CHECK(half.rank() == whole.rank() - mine * d, "FLUX.2 halves in sequence parallel: rank ", whole.rank(),
              " of the whole is rank ", half.rank(), " of its half, expected ", whole.rank() - mine * d);
  const at::Tensor rows = flux2_forward_sequence_parallel(model, segments[static_cast<size_t>(mine)], half);
  // Every rank of a half holds the half's whole prediction: each trades it with its peer alone.
  const int peer = (whole.rank() + d) % P;
  std::vector<int64_t> send_rows(static_cast<size_t>(P), 0), recv_rows(static_cast<size_t>(P), 0);
  send_rows[static_cast<size_t>(peer)] = rows.size(0);
  recv_rows[static_cast<size_t>(peer)] = segments[static_cast<size_t>(1 - mine)].img.size(0);
  const at::Tensor other = whole.all_to_all(rows.to(whole.device()).contiguous(), send_rows, recv_rows).to(at::kCPU, at::kFloat);
  return mine == 0 ? at::cat({rows, other}, 0) : at::cat({other, rows}, 0);
}

}  // namespace infill
