#include "model/patch_pca_codec.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "model/safetensors.h"
#include "model/safetensors_torch.h"

namespace infill {

Result<PatchPcaCodec> PatchPcaCodec::from_tensors(int factor, const at::Tensor& mean, const at::Tensor& basis) {
  if (factor != 2 && factor != 4 && factor != 8 && factor != 16) {
    return invalid_argument("patch PCA codec: factor " + std::to_string(factor) + " is not 2, 4, 8 or 16");
  }
  const int64_t dim = 3LL * factor * factor;
  if (mean.dim() != 1 || mean.size(0) != dim) {
    return invalid_argument("patch PCA codec: mean has shape " + std::to_string(mean.numel()) +
                            " values, expected [" + std::to_string(dim) + "]");
  }
  if (basis.dim() != 2 || basis.size(1) != dim || basis.size(0) < 1 || basis.size(0) > dim) {
    return invalid_argument("patch PCA codec: basis must be [C, " + std::to_string(dim) + "] with 1 <= C <= " +
                            std::to_string(dim));
  }
  c10::InferenceMode guard;
  PatchPcaCodec codec;
  codec.factor_ = factor;
  codec.mean_ = mean.to(at::kFloat).contiguous();
  codec.basis_ = basis.to(at::kFloat).contiguous();
  if (!at::isfinite(codec.mean_).all().item<bool>() || !at::isfinite(codec.basis_).all().item<bool>()) {
    return corrupt_data("patch PCA codec holds NaN or infinite values");
  }
  const at::Tensor gram = at::mm(codec.basis_, codec.basis_.t());
  const double off = (gram - at::eye(basis.size(0), at::kFloat)).abs().max().item<double>();
  if (off > 1e-3) {
    return invalid_argument("patch PCA codec: basis rows are not orthonormal (max deviation " +
                            std::to_string(off) + ")");
  }
  return codec;
}

Result<PatchPcaCodec> PatchPcaCodec::load(const std::string& path) {
  INFILL_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(path));
  const auto& meta = file.metadata();
  auto it = meta.find("factor");
  if (it == meta.end()) return invalid_argument(path + ": metadata \"factor\" is missing");
  int factor = 0;
  try {
    factor = std::stoi(it->second);
  } catch (const std::exception&) {
    return invalid_argument(path + ": metadata factor \"" + it->second + "\" is not an integer");
  }
  c10::InferenceMode guard;
  INFILL_ASSIGN_OR_RETURN(at::Tensor mean, load_float_tensor(file, "mean"));
  INFILL_ASSIGN_OR_RETURN(at::Tensor basis, load_float_tensor(file, "basis"));
  auto codec = from_tensors(factor, mean, basis);
  if (!codec.ok()) return Status(codec.status().code(), path + ": " + codec.status().message());
  return codec;
}

Status PatchPcaCodec::save(const std::string& path) const {
  return write_safetensors(path, {{"mean", mean_}, {"basis", basis_}}, {{"factor", std::to_string(factor_)}});
}

at::Tensor PatchPcaCodec::encode(const at::Tensor& rgb) const {
  c10::InferenceMode guard;
  const int64_t f = factor_, b = rgb.size(0), h = rgb.size(2), w = rgb.size(3);
  TORCH_CHECK(rgb.dim() == 4 && rgb.size(1) == 3, "patch PCA encode needs [B, 3, H, W]");
  TORCH_CHECK(h % f == 0 && w % f == 0, "patch PCA encode: ", h, "x", w, " is not a multiple of ", f);
  // [B, 3, h, f, w, f] -> [B, h, w, 3, f, f] -> rows of (c, y, x)
  at::Tensor patches = rgb.to(at::kFloat).reshape({b, 3, h / f, f, w / f, f}).permute({0, 2, 4, 1, 3, 5})
                           .reshape({-1, 3 * f * f});
  at::Tensor z = at::mm(patches - mean_, basis_.t());  // [B h w, C]
  return z.reshape({b, h / f, w / f, -1}).permute({0, 3, 1, 2}).contiguous();
}

at::Tensor PatchPcaCodec::decode(const at::Tensor& latent) const {
  c10::InferenceMode guard;
  TORCH_CHECK(latent.dim() == 4 && latent.size(1) == basis_.size(0), "patch PCA decode needs [B, ",
              basis_.size(0), ", h, w]");
  const int64_t f = factor_, b = latent.size(0), h = latent.size(2), w = latent.size(3);
  at::Tensor rows = latent.to(at::kFloat).permute({0, 2, 3, 1}).reshape({-1, latent.size(1)});
  at::Tensor patches = at::addmm(mean_, rows, basis_);  // [B h w, 3 f f]
  return patches.reshape({b, h, w, 3, f, f}).permute({0, 3, 1, 4, 2, 5}).reshape({b, 3, h * f, w * f})
      .clamp(0.0, 1.0).contiguous();
}

at::Tensor PatchPcaCodec::decode_crop(const at::Tensor& latent, int x0, int y0, int w, int h, int /*margin*/) const {
  // Every patch decodes alone: no context is needed, whatever the margin.
  (void)latent_context_box(latent, x0, y0, w, h, 0, "patch PCA codec");
  return decode(latent.narrow(2, y0, h).narrow(3, x0, w));
}

}  // namespace infill
