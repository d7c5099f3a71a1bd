#pragma once
/// A loaded model: the manifest, its DiT and (optionally) its autoencoder, immutable and
/// shared by every pipeline and worker that uses it.

#include <memory>
#include <optional>
#include <string>

#include "common/status.h"
#include "model/autoencoder.h"
#include "model/latent_codec.h"
#include "model/dit.h"
#include "model/manifest.h"

namespace infill {

struct Model {
  ModelManifest manifest;
  Dit dit;
  /// The pixel <-> latent codec (TAESD autoencoder or patch PCA); null for a DiT alone.
  std::shared_ptr<const LatentCodec> autoencoder;
  /// Name plus a digest of the weight files' headers and sizes: part of every cache key, so
  /// activations of one set of weights are never served to another.
  std::string id;
};

/// Loads manifest.json (a file or its folder) and every network it names.
Result<std::shared_ptr<const Model>> load_model(const std::string& path);

/// Writes a small random-weight model (DiT + autoencoder + manifest) into `folder`: the
/// stand-in used until a trained model is bundled, and by tests and benchmarks.
Status write_random_model(const std::string& folder, const DitConfig& dit, int ae_width, uint64_t seed);

}  // namespace infill
