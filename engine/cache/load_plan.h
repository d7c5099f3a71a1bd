#pragma once
/// Bubble-free per-block load planning (after FlashPS): for each transformer block of one
/// denoising step, decide whether to load its cached K/V from a slower tier or to recompute
/// the block on all tokens, so that loads overlap compute and the step ends as early as possible.
///
/// Model (all times in milliseconds, one denoising step):
/// - Blocks 0..n-1 run in order on one compute stream.
/// - A block marked kLoadCached needs its cached K/V first. Loads run on a separate I/O stream,
///   one after another in block order, starting at time 0 and never waiting for compute (the
///   prefetch buffers are assumed large enough). The load of the j-th loading block therefore
///   ends at the sum of load_ms over the loading blocks up to and including it.
///   Its compute then covers only the masked tokens and costs masked_ms[i].
/// - A block marked kRecompute loads nothing and runs on all tokens (producing its own K/V);
///   its compute costs full_ms[i].
/// - Block i starts at max(end of block i-1, end of its own load if it loads) and ends
///   compute-cost later. The plan minimises the end of the last block.
///
/// Threading: pure functions, callable from any thread.

#include <cstdint>
#include <vector>

namespace infill {

enum class BlockLoadChoice : uint8_t {
  kLoadCached = 1,  ///< load cached K/V, compute masked tokens only
  kRecompute = 2,   ///< no load, compute all tokens
};

/// Which plans are allowed. A block can run on all tokens only if the hidden states of all
/// tokens reach it; the engine caches K/V but not hidden states, so once a block has run on
/// the masked tokens alone, later blocks cannot return to all tokens: recomputed blocks form
/// a prefix. kAny is the unconstrained problem (a cache that also keeps hidden states).
enum class LoadPlanShape : uint8_t {
  kAny = 1,
  kRecomputePrefix = 2,
};

struct LoadPlan {
  std::vector<BlockLoadChoice> choices;  ///< one per block
  double latency_ms = 0.0;               ///< predicted end of the last block (0 for no blocks)
  double load_ms = 0.0;                  ///< total time the I/O stream is busy
  std::vector<double> block_end_ms;      ///< predicted end of each block's compute
};

/// Optimal plan by an exact dynamic program over blocks that keeps, per prefix, the Pareto
/// front of (cumulative load time, compute end time): both transitions are monotone in both
/// coordinates, so a dominated state can never lead to a better end. Among plans of equal
/// latency it prefers the one with less total load time. Cost: O(n * front size); the front
/// is small in practice (bounded by the number of distinct load sums).
/// Throws std::invalid_argument if the vectors differ in length or hold a negative or
/// non-finite time (a programming error of the caller's cost model).
LoadPlan plan_loads(const std::vector<double>& load_ms, const std::vector<double>& masked_ms,
                    const std::vector<double>& full_ms, LoadPlanShape shape = LoadPlanShape::kAny);

/// Reference: enumerates all 2^n plans (n <= 16, else std::invalid_argument). For tests.
LoadPlan plan_loads_brute_force(const std::vector<double>& load_ms,
                                const std::vector<double>& masked_ms,
                                const std::vector<double>& full_ms,
                                LoadPlanShape shape = LoadPlanShape::kAny);

/// Latency of a given plan under the model above; fills block_end_ms and load_ms of the result.
/// Throws std::invalid_argument on inconsistent sizes.
LoadPlan simulate_plan(const std::vector<double>& load_ms, const std::vector<double>& masked_ms,
                       const std::vector<double>& full_ms,
                       const std::vector<BlockLoadChoice>& choices);

}  // namespace infill
