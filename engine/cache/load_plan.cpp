#include "cache/load_plan.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace infill {

namespace {

void check_inputs(const std::vector<double>& load_ms, const std::vector<double>& masked_ms,
                  const std::vector<double>& full_ms) {
  if (load_ms.size() != masked_ms.size() || load_ms.size() != full_ms.size()) {
    throw std::invalid_argument("plan_loads: load_ms, masked_ms and full_ms have " +
                                std::to_string(load_ms.size()) + ", " +
                                std::to_string(masked_ms.size()) + " and " +
                                std::to_string(full_ms.size()) +
                                " entries; expected one per block in each");
  }
  auto check = [](const std::vector<double>& v, const char* name) {
    for (size_t i = 0; i < v.size(); ++i) {
      if (!std::isfinite(v[i]) || v[i] < 0.0) {
        throw std::invalid_argument(std::string("plan_loads: ") + name + "[" + std::to_string(i) +
                                    "] is " + std::to_string(v[i]) +
                                    "; expected a finite time >= 0");
      }
    }
  };
  check(load_ms, "load_ms");
  check(masked_ms, "masked_ms");
  check(full_ms, "full_ms");
}

// One Pareto state after a prefix of blocks; `parent` indexes the previous layer's front.
struct State {
  double load_end;     // cumulative I/O time
  double compute_end;  // end of the last block so far
  int parent;
  BlockLoadChoice choice;
  bool loaded;  // some block so far loaded: under kRecomputePrefix no recompute may follow
};

// Keeps the states not dominated in (load_end, compute_end); equal pairs keep one. States
// that differ in `loaded` have different futures, so each flag keeps its own front.
std::vector<State> pareto_front(std::vector<State> states) {
  std::sort(states.begin(), states.end(), [](const State& a, const State& b) {
    if (a.loaded != b.loaded) return a.loaded < b.loaded;
    if (a.load_end != b.load_end) return a.load_end < b.load_end;
    return a.compute_end < b.compute_end;
  });
  std::vector<State> front;
  double best_end = std::numeric_limits<double>::infinity();
  bool group = false;
  for (const State& s : states) {
    if (s.loaded != group) {
      group = s.loaded;
      best_end = std::numeric_limits<double>::infinity();
    }
    // Sorted by load_end within a group, so s is dominated iff an earlier kept state of its
    // group ends no later.
    if (s.compute_end < best_end) {
      front.push_back(s);
      best_end = s.compute_end;
    }
  }
  return front;
}

bool allowed(const std::vector<BlockLoadChoice>& choices, LoadPlanShape shape) {
  if (shape == LoadPlanShape::kAny) return true;
  bool loaded = false;
  for (BlockLoadChoice c : choices) {
    if (c == BlockLoadChoice::kLoadCached) loaded = true;
    else if (loaded) return false;
  }
  return true;
}

}  // namespace

LoadPlan simulate_plan(const std::vector<double>& load_ms, const std::vector<double>& masked_ms,
                       const std::vector<double>& full_ms,
                       const std::vector<BlockLoadChoice>& choices) {
  check_inputs(load_ms, masked_ms, full_ms);
  if (choices.size() != load_ms.size()) {
    throw std::invalid_argument("simulate_plan: choices has " + std::to_string(choices.size()) +
                                " entries; expected " + std::to_string(load_ms.size()) +
                                " (one per block)");
  }
  LoadPlan plan;
  plan.choices = choices;
  plan.block_end_ms.resize(choices.size());
  double load_end = 0.0, end = 0.0;
  for (size_t i = 0; i < choices.size(); ++i) {
    if (choices[i] == BlockLoadChoice::kLoadCached) {
      load_end += load_ms[i];
      end = std::max(end, load_end) + masked_ms[i];
    } else {
      end += full_ms[i];
    }
    plan.block_end_ms[i] = end;
  }
  plan.latency_ms = end;
  plan.load_ms = load_end;
  return plan;
}

LoadPlan plan_loads(const std::vector<double>& load_ms, const std::vector<double>& masked_ms,
                    const std::vector<double>& full_ms, LoadPlanShape shape) {
  check_inputs(load_ms, masked_ms, full_ms);
  const size_t n = load_ms.size();
  std::vector<std::vector<State>> layers;
  layers.reserve(n + 1);
  layers.push_back({State{0.0, 0.0, -1, BlockLoadChoice::kRecompute, false}});
  for (size_t i = 0; i < n; ++i) {
    const std::vector<State>& prev = layers.back();
    std::vector<State> next;
    next.reserve(prev.size() * 2);
    for (size_t p = 0; p < prev.size(); ++p) {
      const State& s = prev[p];
      const double load_end = s.load_end + load_ms[i];
      next.push_back(State{load_end, std::max(s.compute_end, load_end) + masked_ms[i],
                           static_cast<int>(p), BlockLoadChoice::kLoadCached, true});
      if (shape == LoadPlanShape::kAny || !s.loaded) {
        next.push_back(State{s.load_end, s.compute_end + full_ms[i], static_cast<int>(p),
                             BlockLoadChoice::kRecompute, s.loaded});
      }
    }
    layers.push_back(pareto_front(std::move(next)));
  }

  // Minimal end; ties go to the least load time.
  const std::vector<State>& last = layers.back();
  size_t best = 0;
  for (size_t k = 1; k < last.size(); ++k) {
    if (last[k].compute_end < last[best].compute_end ||
        (last[k].compute_end == last[best].compute_end && last[k].load_end < last[best].load_end)) {
      best = k;
    }
  }
  std::vector<BlockLoadChoice> choices(n);
  int index = static_cast<int>(best);
  for (size_t i = n; i > 0; --i) {
    const State& s = layers[i][index];
    choices[i - 1] = s.choice;
    index = s.parent;
  }
  // Recomputed from the choices so that every reported time follows the one model.
  return simulate_plan(load_ms, masked_ms, full_ms, choices);
}

LoadPlan plan_loads_brute_force(const std::vector<double>& load_ms,
                                const std::vector<double>& masked_ms,
                                const std::vector<double>& full_ms, LoadPlanShape shape) {
  check_inputs(load_ms, masked_ms, full_ms);
  const size_t n = load_ms.size();
  if (n > 16) {
    throw std::invalid_argument("plan_loads_brute_force: " + std::to_string(n) +
                                " blocks; expected at most 16");
  }
  LoadPlan best;
  best.latency_ms = std::numeric_limits<double>::infinity();
  std::vector<BlockLoadChoice> choices(n);
  for (uint32_t mask = 0; mask < (1u << n); ++mask) {
    for (size_t i = 0; i < n; ++i) {
      choices[i] = (mask >> i) & 1u ? BlockLoadChoice::kLoadCached : BlockLoadChoice::kRecompute;
    }
    if (!allowed(choices, shape)) continue;
    LoadPlan plan = simulate_plan(load_ms, masked_ms, full_ms, choices);
    if (plan.latency_ms < best.latency_ms ||
        (plan.latency_ms == best.latency_ms && plan.load_ms < best.load_ms)) {
      best = std::move(plan);
    }
  }
  return best;
}

}  // namespace infill
