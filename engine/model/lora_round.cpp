#include "model/lora_round.h"

#include <algorithm>

#include <ATen/ATen.h>

namespace infill {

LoraRound LoraRound::build(std::span<const AdapterSet* const> sets, const at::TensorOptions& options) {
  LoraRound round;
  for (const AdapterSet* set : sets) {
    if (set == nullptr) continue;
    for (const AdapterUse& use : *set) {
      if (std::find(round.adapters_.begin(), round.adapters_.end(), use.adapter.get()) == round.adapters_.end()) {
        round.adapters_.push_back(use.adapter.get());
      }
    }
  }
  if (round.adapters_.empty()) return round;
  const int64_t k = static_cast<int64_t>(round.adapters_.size());
  // A set naming one adapter twice gets the sum of its strengths.
  at::Tensor coef = at::zeros({static_cast<int64_t>(sets.size()), k}, at::kDouble);
  for (size_t i = 0; i < sets.size(); ++i) {
    if (sets[i] == nullptr) continue;
    for (const AdapterUse& use : *sets[i]) {
      const auto j = std::find(round.adapters_.begin(), round.adapters_.end(), use.adapter.get()) - round.adapters_.begin();
      coef[static_cast<int64_t>(i)][j] += use.strength;
    }
  }
  round.segment_coef_ = coef.to(options);

  std::map<std::string, std::vector<std::pair<int64_t, const LoraLayer*>>> by_weight;
  for (int64_t j = 0; j < k; ++j) {
    for (const auto& [weight, layer] : round.adapters_[j]->layers) by_weight[weight].emplace_back(j, &layer);
  }
  for (const auto& [weight, parts] : by_weight) {
    std::vector<at::Tensor> downs, ups;
    std::vector<int64_t> owner;
    for (const auto& [j, layer] : parts) {
      downs.push_back(layer->down);
      ups.push_back(layer->up);
      owner.insert(owner.end(), layer->rank(), j);
    }
    Stacked s;
    s.down = (downs.size() == 1 ? downs[0] : at::cat(downs, 0)).to(options).contiguous();
    // A transposed view: the GEMM reads it as is, so a one-adapter round copies nothing.
    s.up_t = (ups.size() == 1 ? ups[0] : at::cat(ups, 1)).to(options).t();
    s.owner = at::tensor(owner, at::kLong).to(options.device());
    round.layers_.emplace(weight, std::move(s));
  }
  return round;
}

int64_t LoraRound::bytes() const {
  int64_t total = segment_coef_.defined() ? static_cast<int64_t>(segment_coef_.nbytes()) : 0;
  for (const auto& [_, s] : layers_) total += static_cast<int64_t>(s.down.nbytes() + s.up_t.nbytes() + s.owner.nbytes());
  return total;
}

at::Tensor LoraRound::row_coefficients(std::span<const int64_t> rows) const {
  if (empty()) return {};
  const at::Tensor counts = at::tensor(std::vector<int64_t>(rows.begin(), rows.end()), at::kLong);
  return segment_coef_.repeat_interleave(counts.to(segment_coef_.device()), 0);
}

at::Tensor LoraRound::segment_coefficients(size_t segment) const {
  if (empty()) return {};
  return segment_coef_.narrow(0, static_cast<int64_t>(segment), 1);
}

void LoraRound::add(const std::string& weight, const at::Tensor& x, const at::Tensor& coef, at::Tensor& y) const {
  const auto it = layers_.find(weight);
  if (it == layers_.end()) return;
  const Stacked& s = it->second;
  const at::Tensor rows = x.dim() == 1 ? x.unsqueeze(0) : x;
  at::Tensor out = y.dim() == 1 ? y.unsqueeze(0) : y;
  if (rows.size(0) == 0) return;
  at::Tensor low = at::mm(rows.to(s.down.scalar_type()), s.down.t());  // [R, sum r]
  low.mul_(coef.index_select(1, s.owner));
  out.addmm_(low.to(out.scalar_type()), s.up_t.to(out.scalar_type()));
}

}  // namespace infill
