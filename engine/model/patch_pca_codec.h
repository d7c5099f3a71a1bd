#pragma once
/// A linear latent codec: every f x f RGB patch is projected onto C principal components of
/// the training patches (encode) and rebuilt from them (decode).
///
/// Why a fixed transform: the bundled model is trained on a 2-core CPU in a fixed budget, and
/// the images it learns from (desktop wallpapers) are smooth enough that 8 components of an
/// 8x8 patch keep > 30 dB. The transform is fitted in closed form (no training time), decodes
/// any latent crop exactly without context (patches are independent), and costs one small
/// matrix product. See resources/models/infill-tiny/MODEL_CARD.md for the measured PSNR.
///
/// File (safetensors): "mean" [3 f f] and "basis" [C, 3 f f] with orthonormal rows, both in
/// (channel, y, x) order of the patch; metadata "factor".
/// Threading: immutable after load; all methods may run concurrently.

#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

#include "common/status.h"
#include "model/latent_codec.h"

namespace infill {

class PatchPcaCodec final : public LatentCodec {
 public:
  /// Loads and validates (shapes, finite values, factor metadata in {2, 4, 8, 16}).
  static Result<PatchPcaCodec> load(const std::string& path);
  /// `mean` [3 f f], `basis` [C, 3 f f] float32; rows must be orthonormal (checked, 1e-3).
  static Result<PatchPcaCodec> from_tensors(int factor, const at::Tensor& mean, const at::Tensor& basis);
  /// Writes the codec as F32 safetensors, atomically.
  Status save(const std::string& path) const;

  int factor() const override { return factor_; }
  int latent_channels() const override { return static_cast<int>(basis_.size(0)); }
  const at::Tensor& mean() const { return mean_; }
  const at::Tensor& basis() const { return basis_; }

  at::Tensor encode(const at::Tensor& rgb) const override;
  at::Tensor decode(const at::Tensor& latent) const override;
  /// Patches are independent, so the crop is exact and `margin` is not needed.
  at::Tensor decode_crop(const at::Tensor& latent, int x0, int y0, int w, int h, int margin) const override;

 private:
  PatchPcaCodec() = default;
  int factor_ = 8;
  at::Tensor mean_;   // [3 f f]
  at::Tensor basis_;  // [C, 3 f f]
};

}  // namespace infill
