#pragma once
/// A training run's loss curves, as the training loop records them and the model card plots
/// them (torch-free).

#include <vector>

namespace infill::train {

/// One logged point of a loss curve.
struct LossPoint {
  int step = 0;
  double loss = 0.0;     ///< mean over the steps since the previous point
  double seconds = 0.0;  ///< wall time of the run so far (this process and earlier ones)
};

/// What a finished (or resumed and finished) run recorded.
struct TrainResult {
  std::vector<LossPoint> curve;
  std::vector<LossPoint> held_out_curve;  ///< loss of the EMA weights on fixed held-out data
  double seconds = 0.0;
};

}  // namespace infill::train
