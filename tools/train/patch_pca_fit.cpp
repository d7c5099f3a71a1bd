#include "patch_pca_fit.h"

#include <cmath>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

namespace infill::train {

Result<PatchPcaCodec> fit_patch_pca(const at::Tensor& crops, int factor, int channels) {
  c10::InferenceMode guard;
  const int64_t f = factor, n = crops.size(0), s = crops.size(2);
  if (crops.dim() != 4 || crops.size(1) != 3 || s % f != 0 || crops.size(3) % f != 0) {
    return invalid_argument("fit_patch_pca needs crops [N, 3, S, S] with S a multiple of " + std::to_string(factor));
  }
  at::Tensor patches = crops.reshape({n, 3, s / f, f, crops.size(3) / f, f}).permute({0, 2, 4, 1, 3, 5})
                           .reshape({-1, 3 * f * f}).to(at::kDouble);
  at::Tensor mean = patches.mean(0);
  at::Tensor centred = patches - mean;
  at::Tensor cov = at::mm(centred.t(), centred) / static_cast<double>(patches.size(0));
  auto [values, vectors] = at::linalg_eigh(cov);  // ascending
  at::Tensor basis = vectors.flip({1}).narrow(1, 0, channels).t().contiguous();  // [C, 3ff]
  // A deterministic sign per component (largest entry positive), so refits are identical.
  at::Tensor idx = basis.abs().argmax(1);
  at::Tensor signs = basis.gather(1, idx.unsqueeze(1)).sign();
  basis = basis * signs;
  return PatchPcaCodec::from_tensors(factor, mean.to(at::kFloat), basis.to(at::kFloat));
}

double round_trip_psnr(const LatentCodec& codec, const at::Tensor& crops) {
  c10::InferenceMode guard;
  at::Tensor back = codec.decode(codec.encode(crops));
  at::Tensor mse = (back - crops).pow(2).flatten(1).mean(1).clamp_min(1e-12);
  return (-10.0 * at::log10(mse)).mean().item<double>();
}

double latent_std(const LatentCodec& codec, const at::Tensor& crops) {
  c10::InferenceMode guard;
  return codec.encode(crops).std().item<double>();
}

}  // namespace infill::train
