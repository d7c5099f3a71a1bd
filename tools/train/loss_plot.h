#pragma once
/// Draws the training loss curve (log scale) as a PNG for the model card.

#include <string>
#include <vector>

#include "common/status.h"
#include "loss_curve.h"

namespace infill::train {

/// Training loss (blue) and held-out loss (orange) against the step, log-scaled loss axis
/// with labelled ticks. Writes a PNG.
Status write_loss_plot(const std::string& path, const std::vector<LossPoint>& train,
                       const std::vector<LossPoint>& held_out);

}  // namespace infill::train
