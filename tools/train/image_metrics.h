#pragma once
/// Image similarity measures of the quality benchmark.

#include <ATen/core/Tensor.h>

namespace infill::train {

/// SSIM (Wang et al. 2004: 11x11 Gaussian window, sigma 1.5, K1 0.01, K2 0.03, peak 1) of two
/// images [3, H, W] in [0, 1], averaged over channels and valid window positions. Images
/// smaller than the window are compared with a window of their own size.
double ssim(const at::Tensor& a, const at::Tensor& b);

/// PSNR in dB (peak 1) of two images of the same shape; 100 for identical images.
double psnr(const at::Tensor& a, const at::Tensor& b);

/// How much block edges show in an image [3, H, W]: the mean absolute difference between
/// horizontally and vertically neighbouring pixels across the boundaries of a `period`-pixel
/// grid (between pixels period*k - 1 and period*k) divided by the same mean between the other
/// neighbours. About 1 for smooth or natural images, > 1 when a patch codec's blocks show
/// (the patch PCA's decode of a noisy latent: period 8; a 2x2-patchified latent: period 16).
/// 1 for a constant image. Needs H and W > period.
double blockiness(const at::Tensor& image, int period);

}  // namespace infill::train
