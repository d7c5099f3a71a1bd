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

}  // namespace infill::train
