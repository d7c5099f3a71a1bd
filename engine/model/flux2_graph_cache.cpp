#include "model/flux2_graph_cache.h"

#include <algorithm>
#include <exception>
#include <map>

#include <c10/util/Exception.h>

#include "model/lora_adapter.h"

namespace infill {

Flux2GraphCache::Flux2GraphCache(const Flux2Transformer& model, int64_t budget_bytes, CaptureFactory make_capture)
    : model_(model), make_capture_(std::move(make_capture)) {
  if (!make_capture_) make_capture_ = [device = model.device()] { return make_work_capture(device); };
  stats_.budget_bytes = budget_bytes;
}

Flux2GraphCache::~Flux2GraphCache() = default;

StepGraphStats Flux2GraphCache::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

int Flux2GraphCache::drop_released_adapters() {
  std::lock_guard running(run_mu_);
  return drop_released_adapters_locked();
}

int Flux2GraphCache::drop_released_adapters_locked() {
  // An adapter is released when every holder of it is a graph's set: count the graphs' uses.
  std::map<const LoraAdapter*, long> graph_uses;
  for (const auto& g : graphs_)
    for (const AdapterSet& set : g->adapter_sets())
      for (const AdapterUse& use : set) graph_uses[use.adapter.get()] += 1;
  if (graph_uses.empty()) return 0;
  // Judged for every graph before any is dropped: dropping one lowers the counts of the
  // adapters it shares with the others.
  std::vector<decltype(graphs_)::iterator> released;
  for (auto g = graphs_.begin(); g != graphs_.end(); ++g) {
    bool holds_released = false;
    for (const AdapterSet& set : (*g)->adapter_sets())
      for (const AdapterUse& use : set) holds_released |= use.adapter.use_count() <= graph_uses[use.adapter.get()];
    if (holds_released) released.push_back(g);
  }
  for (const auto& g : released) graphs_.erase(g);
  if (!released.empty()) count_evictions(static_cast<int64_t>(released.size()));
  return static_cast<int>(released.size());
}

void Flux2GraphCache::evict_to_fit(int64_t keep_bytes) {
  int64_t held = 0, evicted = 0;
  for (const auto& g : graphs_) held += g->bytes();
  // The front graph (the one just used) stays; the least recently used go first.
  while (held > keep_bytes && graphs_.size() > 1) {
    held -= graphs_.back()->bytes();
    graphs_.pop_back();
    ++evicted;
  }
  count_evictions(evicted);
}

void Flux2GraphCache::count_evictions(int64_t evicted) {
  int64_t held = 0;
  for (const auto& g : graphs_) held += g->bytes();
  std::lock_guard lock(mu_);
  stats_.evicted += evicted;
  stats_.graphs = static_cast<int64_t>(graphs_.size());
  stats_.bytes = held;
}

at::Tensor Flux2GraphCache::run(std::span<Flux2Segment> segments) {
  auto eager = [&] {
    std::lock_guard lock(mu_);
    stats_.eager_rounds += 1;
    return at::Tensor();
  };
  if (!flux2_graph_refusal(segments, model_.config()).empty()) return eager();
  std::unique_lock running(run_mu_, std::try_to_lock);
  if (!running.owns_lock()) return eager();
  drop_released_adapters_locked();
  const Flux2GraphKey key = flux2_graph_key(segments);
  if (std::find(eager_only_.begin(), eager_only_.end(), key) != eager_only_.end()) return eager();
  auto it = std::find_if(graphs_.begin(), graphs_.end(), [&](const auto& g) { return g->key() == key; });
  if (it != graphs_.end()) {
    graphs_.splice(graphs_.begin(), graphs_, it);  // most recently used
    at::Tensor rows = graphs_.front()->run(segments);
    std::lock_guard lock(mu_);
    stats_.replayed += 1;
    return rows;
  }
  auto graph = std::make_unique<Flux2StepGraph>(model_, key, make_capture_());
  at::Tensor rows;
  try {
    rows = graph->run(segments);
  } catch (const std::exception& e) {
    // Out of device memory while recording, or an operation a graph cannot hold: this shape
    // runs eagerly from now on; the round itself is run again eagerly by the caller.
    eager_only_.push_back(key);
    std::lock_guard lock(mu_);
    stats_.failed_recordings += 1;
    const auto* error = dynamic_cast<const c10::Error*>(&e);
    stats_.last_failure = key.text() + ": " + (error != nullptr ? error->what_without_backtrace() : e.what());
    stats_.eager_rounds += 1;
    return {};
  }
  {
    std::lock_guard lock(mu_);
    stats_.recorded += 1;
  }
  if (graph->bytes() > stats_.budget_bytes) {
    // Larger than the whole budget: this round's result stands, the graph is not kept.
    eager_only_.push_back(key);
    std::lock_guard lock(mu_);
    stats_.evicted += 1;
    return rows;
  }
  graphs_.push_front(std::move(graph));
  evict_to_fit(stats_.budget_bytes);
  return rows;
}

}  // namespace infill
