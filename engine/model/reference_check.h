#pragma once
/// Runs the call recorded in a reference tensor file and compares the result with the
/// recorded output: how the engine's FLUX.2 networks are checked against the upstream code
/// (../shared/testdata/flux2/, written by black-forest-labs/flux2 run unmodified).
///
/// A reference file is a safetensors file holding `weights.*` (the network under its
/// checkpoint names), `input.*`, `output.*` and optionally `trace.*` (per-block
/// intermediates), all without the batch dimension, and `__metadata__` with "model"
/// ("flux2-transformer" or "flux2-autoencoder"), and for a transformer optionally "loras": the
/// LoRA files beside it applied in order, each with its "strength"
/// (../shared/testdata/flux2_lora/). The errors compared are
/// max |ours - reference| and that divided by max |reference|.

#include <string>
#include <vector>

#include "common/status.h"
#include "model/compute_device.h"

namespace infill {

/// One compared tensor.
struct ReferenceComparison {
  std::string name;  ///< "output.prediction", "trace.single_blocks.2", ...
  double max_abs_err = 0.0;
  double max_rel_err = 0.0;  ///< max_abs_err / max |reference|
};

struct ReferenceCheck {
  std::string file;
  std::string model;  ///< the file's metadata "model"
  /// LoRAs applied from the file's metadata "loras" (files beside it, in order).
  size_t loras = 0;
  /// Outputs first, then every trace tensor in block order.
  std::vector<ReferenceComparison> comparisons;
  /// The worst of all comparisons.
  double max_abs_err = 0.0;
  double max_rel_err = 0.0;
  /// max_rel_err <= tolerance.
  bool ok = false;
};

/// The tolerance of every check in float32 (on the CPU or a GPU): max |diff| / max |reference|.
inline constexpr double kReferenceTolerance = 1e-4;
/// The tolerance of a transformer computing in bf16 on a GPU (8 significant bits: each
/// rounding is up to 2^-9 relative, and a few blocks of them add up).
inline constexpr double kReferenceToleranceBf16 = 3e-2;
/// The tolerance with FP8 block projections (Flux2Transformer::with_float8_weights): E4M3
/// rounds each weight and each activation to within 2^-4 relative, so a product is within
/// about 2^-3 of its exact value; the blocks' sums and residual stream keep the output's
/// error below that share of its largest magnitude.
inline constexpr double kReferenceToleranceFloat8 = 0.125;

struct ReferenceCheckOptions {
  /// Where the network runs. The autoencoder runs on the CPU only.
  ComputeDevice device;
  /// On a CUDA device, the transformer computes in bf16 (kReferenceToleranceBf16) instead of
  /// float32.
  bool bfloat16 = false;
  /// With bfloat16: the block projections in FP8 (kReferenceToleranceFloat8).
  bool float8 = false;
  /// On a CUDA device, the row norms as the project's fused kernels
  /// (Flux2Transformer::with_fused_norms), at the tolerance of the dtype computed in.
  bool fused_norms = false;
  double tolerance() const {
    return float8 ? kReferenceToleranceFloat8 : bfloat16 ? kReferenceToleranceBf16 : kReferenceTolerance;
  }
};

/// Loads `path`, builds the network from its weights, runs the recorded call and compares.
/// Errors: the file cannot be read, has no or an unknown "model", or lacks an input or
/// output the call needs (naming it); the device cannot run (naming it).
Result<ReferenceCheck> run_reference_check(const std::string& path, const ReferenceCheckOptions& options = {});

}  // namespace infill
