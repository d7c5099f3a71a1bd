#include "random_masks.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

namespace infill::train {

namespace {

struct Canvas {
  at::Tensor ys, xs;  // [size, size] pixel centre coordinates
  at::Tensor mask;    // bool [size, size]
};

double uniform(at::Generator& gen, double lo, double hi) {
  return at::empty({1}, at::kDouble).uniform_(lo, hi, gen).item<double>();
}

void add_stroke(Canvas& c, at::Generator& gen, double size) {
  // A polyline of 2-5 points with a round brush: pixels within `radius` of any segment.
  const int points = static_cast<int>(uniform(gen, 2.0, 6.0));
  const double radius = uniform(gen, 0.02, 0.1) * size;
  double px = uniform(gen, 0.0, size), py = uniform(gen, 0.0, size);
  for (int i = 1; i < points; ++i) {
    const double angle = uniform(gen, 0.0, 2.0 * M_PI), len = uniform(gen, 0.1, 0.5) * size;
    const double qx = std::clamp(px + std::cos(angle) * len, 0.0, size), qy = std::clamp(py + std::sin(angle) * len, 0.0, size);
    const double dx = qx - px, dy = qy - py, len2 = std::max(dx * dx + dy * dy, 1e-9);
    at::Tensor t = (((c.xs - px) * dx + (c.ys - py) * dy) / len2).clamp(0.0, 1.0);
    at::Tensor ex = c.xs - (px + t * dx), ey = c.ys - (py + t * dy);
    c.mask.logical_or_(ex * ex + ey * ey <= radius * radius);
    px = qx;
    py = qy;
  }
}

void add_rectangle(Canvas& c, at::Generator& gen, double size) {
  const double w = uniform(gen, 0.1, 0.6) * size, h = uniform(gen, 0.1, 0.6) * size;
  const double x = uniform(gen, 0.0, size - w), y = uniform(gen, 0.0, size - h);
  c.mask.logical_or_((c.xs >= x) & (c.xs < x + w) & (c.ys >= y) & (c.ys < y + h));
}

void add_blob(Canvas& c, at::Generator& gen, double size) {
  // A rotated ellipse with a wobbly outline (radius modulated by low harmonics of the angle).
  const double cx = uniform(gen, 0.0, size), cy = uniform(gen, 0.0, size);
  const double a = uniform(gen, 0.05, 0.3) * size, b = uniform(gen, 0.05, 0.3) * size;
  const double rot = uniform(gen, 0.0, M_PI), wobble = uniform(gen, 0.0, 0.25), phase = uniform(gen, 0.0, 2 * M_PI);
  at::Tensor dx = c.xs - cx, dy = c.ys - cy;
  at::Tensor u = dx * std::cos(rot) + dy * std::sin(rot), v = -dx * std::sin(rot) + dy * std::cos(rot);
  at::Tensor r = at::sqrt((u / a) * (u / a) + (v / b) * (v / b));
  at::Tensor theta = at::atan2(v, u);
  c.mask.logical_or_(r <= 1.0 + wobble * at::sin(theta * 3.0 + phase));
}

}  // namespace

at::Tensor random_mask(const MaskOptions& options, at::Generator& gen) {
  c10::InferenceMode guard;
  const double size = options.size;
  Canvas c;
  const at::Tensor coords = at::arange(options.size, at::kFloat) + 0.5f;
  c.ys = coords.unsqueeze(1).expand({options.size, options.size});
  c.xs = coords.unsqueeze(0).expand({options.size, options.size});
  for (int attempt = 0;; ++attempt) {
    const double target = uniform(gen, options.min_ratio, options.max_ratio);
    c.mask = at::zeros({options.size, options.size}, at::kBool);
    const int kind = static_cast<int>(uniform(gen, 0.0, 3.0));
    double ratio = 0.0;
    for (int shapes = 0; shapes < 12 && ratio < target; ++shapes) {
      if (kind == 0) add_stroke(c, gen, size);
      else if (kind == 1) add_rectangle(c, gen, size);
      else add_blob(c, gen, size);
      ratio = c.mask.to(at::kFloat).mean().item<double>();
    }
    if ((ratio >= options.min_ratio && ratio <= options.max_ratio) || attempt >= 50) return c.mask.to(at::kFloat);
  }
}

at::Tensor random_masks(const MaskOptions& options, int n, at::Generator& gen) {
  std::vector<at::Tensor> masks;
  for (int i = 0; i < n; ++i) masks.push_back(random_mask(options, gen));
  return at::stack(masks);
}

}  // namespace infill::train
