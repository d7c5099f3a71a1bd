#pragma once
/// The step cost of one model on one worker's device, kept true by the worker's own steps.
///
/// It starts from a given model (a start-up calibration, or the plausible coefficients for a
/// family nobody calibrated, such as FLUX.2) and collects the worker's timed steps of that
/// model: single-model rounds (packed tokens, batch size, attention work, the round's
/// step-loop time) and prepare slices (a full forward). Every kRefitEvery samples it refits
/// on the recent ones (StepCostModel::fit) and adopts the refit only where it predicts those
/// samples better (lower MAPE) than the model in use, so a noisy or degenerate window never
/// makes it worse. The scheduler, the router's backlog and the load plan then use measured
/// costs of this model on this device.
///
/// Threading: add() from the step loop only; current() and report() from any thread.

#include <array>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>

#include "serving/cost_model.h"

namespace infill {

class LiveCostModel {
 public:
  static constexpr size_t kRefitEvery = 32;
  static constexpr size_t kWindow = 512;

  explicit LiveCostModel(std::shared_ptr<const StepCostModel> initial);

  /// The model in use now.
  std::shared_ptr<const StepCostModel> current() const;
  /// One timed step of this model on this device.
  void add(const StepSample& sample);

  struct Report {
    std::array<double, 4> coefficients{};  ///< of the model in use
    size_t samples = 0;                     ///< steps timed so far
    size_t refits_adopted = 0;              ///< refits that replaced the model in use
    double mape = 0.0;                      ///< of the model in use on the recent samples, in percent
  };
  Report report() const;

 private:
  void refit();

  mutable std::mutex mu_;
  std::shared_ptr<const StepCostModel> current_;  // guarded by mu_
  Report report_;                                 // guarded by mu_
  std::deque<StepSample> window_;                 // the loop's
  size_t since_refit_ = 0;                        // the loop's
};

}  // namespace infill
