#pragma once
/// The step graphs of one FLUX.2 transformer (model/flux2_step_graph.h), one per round shape,
/// recorded on first use within a byte budget and evicted least recently used first (issue
/// 39). A round it does not hold runs eagerly: a shape a graph cannot take (a full step, a
/// prepare run, rows above the largest bucket), a shape whose recording failed (out of
/// device memory, say: never retried, counted in the stats, the edit unaffected), or a graph
/// larger than the whole budget.
/// A graph of a round with adapters holds them (its stacked factors are views of their device
/// tensors where a layer has one adapter). Once nothing else holds one of them (the user
/// deleted it, or the adapter store's device tier evicted it, and no edit runs with it), the
/// graph is dropped: at the next round, or at once through drop_released_adapters(), so that
/// an adapter's device memory goes with it rather than when the budget next needs the room.
/// Should it come back (the same bytes uploaded again), its rounds record a graph anew.
/// Threading: run() from any thread, one round at a time: a round that finds another running
/// (two workers sharing a model on one device) runs eagerly rather than wait.
/// drop_released_adapters() waits for a running round. stats() from any thread.
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "model/flux2_step_graph.h"
#include "model/step_graph_stats.h"
#include "model/work_capture.h"

namespace infill {

class Flux2GraphCache {
 public:
  /// Makes a WorkCapture per graph (make_work_capture on the model's device by default; tests
  /// pass one that fails, the fault seam of a recording out of device memory).
  using CaptureFactory = std::function<std::unique_ptr<WorkCapture>()>;
  Flux2GraphCache(const Flux2Transformer& model, int64_t budget_bytes, CaptureFactory make_capture = {});
  ~Flux2GraphCache();

  /// The round's prediction (as Flux2Transformer::forward_on_device) through its graph, or an
  /// undefined tensor when the round is to run eagerly (the caller runs it).
  at::Tensor run(std::span<Flux2Segment> segments);
  StepGraphStats stats() const;
  /// Drops every graph holding an adapter that nothing but the graphs holds; counted as
  /// evicted. Returns how many it dropped.
  int drop_released_adapters();

 private:
  void evict_to_fit(int64_t keep_bytes);
  // drop_released_adapters() with run_mu_ held.
  int drop_released_adapters_locked();
  // Adds `evicted` to the stats and sets the graphs held and their bytes (run_mu_ held).
  void count_evictions(int64_t evicted);

  const Flux2Transformer& model_;
  CaptureFactory make_capture_;
  std::list<std::unique_ptr<Flux2StepGraph>> graphs_;  // most recently used first
  std::vector<Flux2GraphKey> eager_only_;              // shapes whose recording failed or was too big
  std::mutex run_mu_;                                  // one round at a time
  mutable std::mutex mu_;                              // guards stats_
  StepGraphStats stats_;
};

}  // namespace infill
