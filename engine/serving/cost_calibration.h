#pragma once
/// Start-up calibration of the step cost model on the real model: timed packed forwards over
/// a spread of masked-token counts and batch sizes, an OLS fit (StepCostModel), its R² and
/// MAPE on held-out points, and the cost of reading cached K/V per tier. The result is
/// persisted as JSON and reused while the model and thread count stay the same.
///
/// Threading: runs on the calling thread and times it; call it before starting workers (it
/// sets the calling thread's libtorch thread count to `threads` and restores it).

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/model.h"
#include "serving/cost_model.h"

namespace infill {

struct CalibrationOptions {
  int latent_width = 48;   ///< latent grid of the timed forwards (a typical template)
  int latent_height = 48;
  std::vector<double> mask_ratios = {0.02, 0.05, 0.1, 0.15, 0.25, 0.4};
  int max_batch = 6;
  int points = 48;         ///< timed configurations (train + held out)
  int repeats = 3;         ///< timing passes over all configurations; each one's latency is its median
  double held_out_fraction = 0.25;
  int threads = 1;         ///< compute threads of the worker the model is for
  uint64_t seed = 1;
  /// JSON file to reuse and refresh; "" = calibrate every time, persist nothing.
  std::string cache_path;
  /// Measure the disk tier's slab read cost through a store here; "" = skip (reported -1).
  std::string disk_dir;
};

/// Cost of getting one block's cached K and V (both [tokens, hidden]) into a step.
struct TierCosts {
  double ram_ms_per_block = 0.0;    ///< fp16 -> fp32 conversion from a RAM-resident entry
  double disk_ms_per_block = -1.0;  ///< read + verify from the disk tier; -1 = not measured
};

struct Calibration {
  StepCostModel model;
  StepCostModel::FitReport held_out;  ///< R² and MAPE on points the fit never saw
  TierCosts tiers;
  double full_step_ms = 0.0;  ///< one full forward of the grid (a prepare slice)
  bool loaded = false;        ///< read from cache_path instead of measured
  std::vector<StepSample> train, test;  ///< empty when loaded
};

/// The fingerprint a calibration is valid for: model id, grid and thread count.
std::string calibration_fingerprint(const Model& model, const CalibrationOptions& options);

/// Measures and fits (never reads the cache file; writes it when cache_path is set).
Result<Calibration> calibrate_step_cost(const Model& model, const CalibrationOptions& options);

/// Reads cache_path when its fingerprint matches, else calibrates and rewrites it. A missing,
/// corrupt or stale file is not an error: it is replaced.
Result<Calibration> load_or_calibrate(const Model& model, const CalibrationOptions& options);

}  // namespace infill
