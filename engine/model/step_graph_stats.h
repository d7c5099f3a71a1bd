#pragma once
/// What the step graphs of a model on a device did (model/flux2_graph_cache.h): the counters
/// the worker reports per model and /v1/metrics and /metrics render. Torch-free.
#include <cstdint>
#include <string>

namespace infill {

struct StepGraphStats {
  int64_t graphs = 0;             ///< held now
  int64_t bytes = 0;              ///< their device bytes (pools and buffers)
  int64_t budget_bytes = 0;       ///< 0: no graphs (the CPU, or turned off)
  int64_t recorded = 0;           ///< graphs recorded so far
  int64_t replayed = 0;           ///< rounds run through a graph already recorded
  int64_t evicted = 0;            ///< graphs dropped for the budget, or for a deleted adapter they held
  int64_t eager_rounds = 0;       ///< rounds run eagerly (a shape no graph takes, a failed recording)
  int64_t failed_recordings = 0;  ///< recordings that failed (out of device memory): their shapes then run eagerly
  std::string last_failure;       ///< the last failed recording's shape and error
};

}  // namespace infill
