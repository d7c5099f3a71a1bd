#include "image_metrics.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

namespace infill::train {

double ssim(const at::Tensor& a, const at::Tensor& b) {
  c10::InferenceMode guard;
  const int64_t size = std::min<int64_t>({11, a.size(1), a.size(2)});
  at::Tensor coords = at::arange(size, at::kDouble) - (size - 1) / 2.0;
  at::Tensor g = at::exp(-(coords * coords) / (2 * 1.5 * 1.5));
  g = g / g.sum();
  const at::Tensor window = at::outer(g, g).to(at::kFloat).view({1, 1, size, size}).repeat({3, 1, 1, 1});
  auto blur = [&](const at::Tensor& x) { return at::conv2d(x.unsqueeze(0), window, at::Tensor(), std::vector<int64_t>{1, 1}, std::vector<int64_t>{0, 0}, std::vector<int64_t>{1, 1}, 3)[0]; };
  const at::Tensor x = a.to(at::kFloat), y = b.to(at::kFloat);
  const at::Tensor mx = blur(x), my = blur(y);
  const at::Tensor sxx = blur(x * x) - mx * mx, syy = blur(y * y) - my * my, sxy = blur(x * y) - mx * my;
  constexpr double c1 = 0.01 * 0.01, c2 = 0.03 * 0.03;
  const at::Tensor map = ((2 * mx * my + c1) * (2 * sxy + c2)) / ((mx * mx + my * my + c1) * (sxx + syy + c2));
  return map.mean().item<double>();
}

double psnr(const at::Tensor& a, const at::Tensor& b) {
  c10::InferenceMode guard;
  const double mse = (a.to(at::kFloat) - b.to(at::kFloat)).pow(2).mean().item<double>();
  return mse <= 1e-10 ? 100.0 : -10.0 * std::log10(mse);
}

double blockiness(const at::Tensor& image, int period) {
  TORCH_CHECK(image.dim() == 3 && image.size(1) > period && image.size(2) > period && period >= 2,
              "blockiness: image is ", image.sizes(), ", expected [C, H, W] with H and W above the period ", period);
  c10::InferenceMode guard;
  const at::Tensor x = image.to(at::kFloat);
  const at::Tensor dx = (x.narrow(2, 1, x.size(2) - 1) - x.narrow(2, 0, x.size(2) - 1)).abs();  // [C, H, W-1]
  const at::Tensor dy = (x.narrow(1, 1, x.size(1) - 1) - x.narrow(1, 0, x.size(1) - 1)).abs();  // [C, H-1, W]
  // Difference j lies between pixels j and j + 1: on a boundary when j + 1 is a multiple of period.
  const auto on_boundary = [&](int64_t n) { return ((at::arange(n, at::kLong) + 1) % period) == 0; };
  const at::Tensor bx = on_boundary(dx.size(2)).to(at::kFloat).view({1, 1, -1}).expand_as(dx);
  const at::Tensor by = on_boundary(dy.size(1)).to(at::kFloat).view({1, -1, 1}).expand_as(dy);
  const double boundary_sum = (dx * bx).sum().item<double>() + (dy * by).sum().item<double>();
  const double boundary_count = bx.sum().item<double>() + by.sum().item<double>();
  const double inside_sum = dx.sum().item<double>() + dy.sum().item<double>() - boundary_sum;
  const double inside_count = static_cast<double>(dx.numel() + dy.numel()) - boundary_count;
  // The small constant makes a constant image score 1 rather than 0/0.
  constexpr double kEps = 1e-8;
  return (boundary_sum / boundary_count + kEps) / (inside_sum / inside_count + kEps);
}

}  // namespace infill::train
