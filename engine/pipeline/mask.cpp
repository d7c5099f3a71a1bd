#include "pipeline/mask.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#ifdef INFILL_HAVE_OIIO
#include <OpenImageIO/imageio.h>
#endif

namespace infill {
namespace {

#ifdef INFILL_HAVE_OIIO
std::string size_text(int64_t width, int64_t height) {
  return std::to_string(width) + "x" + std::to_string(height);
}

// OIIO joins several errors with newlines; messages here are single lines.
std::string one_line(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  std::replace(text.begin(), text.end(), '\n', ';');
  return text;
}
#endif

void check_2d_mask(const at::Tensor& mask, const char* what) {
  TORCH_CHECK(mask.defined() && mask.dim() == 2, what, ": expected a mask [H, W], got ",
              mask.defined() ? mask.sizes() : at::IntArrayRef{});
}

// Zero-pads [H, W] on the right and bottom to multiples of `multiple`.
at::Tensor pad_zero_to_multiple(const at::Tensor& mask, int64_t multiple) {
  const int64_t pad_h = (multiple - mask.size(0) % multiple) % multiple;
  const int64_t pad_w = (multiple - mask.size(1) % multiple) % multiple;
  if (pad_h == 0 && pad_w == 0) return mask;
  return at::constant_pad_nd(mask, {0, pad_w, 0, pad_h}, 0);
}

// [H, W] -> bool [H / f, W / f]: any element of each f x f block > 0. H, W multiples of f.
at::Tensor any_positive_blocks(const at::Tensor& mask, int64_t f) {
  const int64_t h = mask.size(0) / f;
  const int64_t w = mask.size(1) / f;
  return (mask > 0).reshape({h, f, w, f}).any(3).any(1);
}

// Exact 1-D squared Euclidean distance transform (Felzenszwalb & Huttenlocher 2012) of
// f[0..n) in place; d, v, z are scratch of size n and n + 1.
void edt_1d(double* f, int64_t n, std::vector<double>& d, std::vector<int64_t>& v,
            std::vector<double>& z) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  int64_t k = 0;
  v[0] = 0;
  z[0] = -kInf;
  z[1] = kInf;
  // z[0] = -inf stops the backtracking at the first parabola.
  for (int64_t q = 1; q < n; ++q) {
    const double fq = f[q] + static_cast<double>(q * q);
    double s = 0;
    while (true) {
      const int64_t p = v[k];
      s = (fq - (f[p] + static_cast<double>(p * p))) / static_cast<double>(2 * (q - p));
      if (s > z[k]) break;
      --k;
    }
    ++k;
    v[k] = q;
    z[k] = s;
    z[k + 1] = kInf;
  }
  k = 0;
  for (int64_t q = 0; q < n; ++q) {
    while (z[k + 1] < static_cast<double>(q)) ++k;
    const int64_t p = v[k];
    d[q] = static_cast<double>((q - p) * (q - p)) + f[p];
  }
  for (int64_t q = 0; q < n; ++q) f[q] = d[q];
}

}  // namespace

#ifdef INFILL_HAVE_OIIO
Result<at::Tensor> load_mask(const std::string& path, int expected_width, int expected_height) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return not_found("mask " + path + " does not exist");
  // Colour must not be premultiplied by a mask file's alpha: the alpha is ignored.
  OIIO::ImageSpec config;
  config.attribute("oiio:UnassociatedAlpha", 1);
  auto input = OIIO::ImageInput::open(path, &config);
  if (!input) {
    return corrupt_data("mask " + path + " cannot be read: " + one_line(OIIO::geterror()));
  }
  const OIIO::ImageSpec& spec = input->spec();
  if (spec.width != expected_width || spec.height != expected_height) {
    return invalid_argument("mask " + path + " is " + size_text(spec.width, spec.height) +
                            ", template is " + size_text(expected_width, expected_height));
  }
  if (spec.nchannels < 1 || spec.deep) {
    return corrupt_data("mask " + path + " has no readable pixel channels");
  }
  const int channels = spec.nchannels >= 3 ? 3 : 1;
  at::Tensor pixels = at::empty({spec.height, spec.width, channels}, at::kFloat);
  if (!input->read_image(0, 0, 0, channels, OIIO::TypeDesc::FLOAT, pixels.data_ptr<float>())) {
    return corrupt_data("mask " + path + " cannot be read: " + one_line(input->geterror()));
  }
  at::Tensor mask = channels == 1 ? pixels.select(2, 0) : pixels.mean(2);
  return at::nan_to_num(mask, 0.0, 1.0, 0.0).clamp_(0.0, 1.0).contiguous();
}

#else
Result<at::Tensor> load_mask(const std::string& path, int, int) {
  return Status(ErrorCode::kUnimplemented,
                "mask " + path + ": this build reads no image files (INFILL_WITH_OIIO=OFF)");
}
#endif

at::Tensor latent_mask(const at::Tensor& pixel_mask, int factor) {
  check_2d_mask(pixel_mask, "latent_mask");
  TORCH_CHECK(factor >= 1, "latent_mask: factor ", factor, " must be >= 1");
  at::Tensor padded = pad_zero_to_multiple(pixel_mask, factor);
  return any_positive_blocks(padded, factor).to(at::kFloat);
}

at::Tensor masked_token_grid(const at::Tensor& latent_mask, int patch, int halo_tokens) {
  check_2d_mask(latent_mask, "masked_tokens");
  TORCH_CHECK(patch >= 1, "masked_tokens: patch ", patch, " must be >= 1");
  TORCH_CHECK(halo_tokens >= 0, "masked_tokens: halo_tokens ", halo_tokens, " must be >= 0");
  at::Tensor grid = any_positive_blocks(pad_zero_to_multiple(latent_mask, patch), patch);
  // A halo wider than the grid is the same as one exactly as wide.
  const int64_t halo = std::min<int64_t>(halo_tokens, std::max(grid.size(0), grid.size(1)));
  if (halo == 0 || grid.numel() == 0) return grid;
  // Chebyshev dilation = a square max filter, separable into rows then columns; max_pool
  // pads with -inf, so the window is clamped to the grid.
  at::Tensor g = grid.to(at::kFloat).unsqueeze(0);  // [1, gh, gw]
  g = at::max_pool2d(g, {2 * halo + 1, 1}, {1, 1}, {halo, 0});
  g = at::max_pool2d(g, {1, 2 * halo + 1}, {1, 1}, {0, halo});
  return g.squeeze(0) > 0;
}

TokenSet masked_tokens(const at::Tensor& latent_mask, int patch, int halo_tokens) {
  at::Tensor grid = masked_token_grid(latent_mask, patch, halo_tokens);
  TokenSet set;
  set.grid_h = static_cast<int>(grid.size(0));
  set.grid_w = static_cast<int>(grid.size(1));
  // nonzero() returns indices in ascending order.
  set.indices = grid.reshape({-1}).nonzero().reshape({-1}).to(at::kLong).contiguous();
  return set;
}

double TokenSet::ratio() const {
  const int64_t total = static_cast<int64_t>(grid_w) * grid_h;
  return total == 0 ? 0.0 : static_cast<double>(count()) / static_cast<double>(total);
}

int64_t TokenSet::count() const { return indices.defined() ? indices.numel() : 0; }

at::Tensor TokenSet::token_mask() const {
  at::Tensor m = at::zeros({static_cast<int64_t>(grid_h) * grid_w}, at::kBool);
  if (count() > 0) m.index_fill_(0, indices, true);
  return m;
}

at::Tensor feather(const at::Tensor& pixel_mask, float radius_px) {
  check_2d_mask(pixel_mask, "feather");
  at::Tensor mask = pixel_mask.to(at::kFloat).contiguous();
  if (!(radius_px > 0.0f)) return mask.clone();
  const int64_t h = mask.size(0);
  const int64_t w = mask.size(1);
  // Squared distances in double: exact for any realistic image size. Kept pixels (mask not
  // > 0) are the sources; a very large finite value marks "no source yet" so the parabola
  // arithmetic never sees inf - inf. Both passes run along contiguous rows (the column pass
  // on the transpose), which is several times faster than strided columns.
  constexpr double kFar = 1e30;
  const float* m = mask.data_ptr<float>();
  at::Tensor dist_t =
      at::where(mask > 0, at::full({}, kFar, at::kDouble), at::zeros({}, at::kDouble))
          .t()
          .contiguous();  // [w, h]
  const int64_t n = std::max(h, w);
  std::vector<double> scratch(n);
  std::vector<int64_t> v(n);
  std::vector<double> z(n + 1);
  double* dt = dist_t.data_ptr<double>();
  for (int64_t x = 0; x < w; ++x) edt_1d(dt + x * h, h, scratch, v, z);
  at::Tensor dist_tensor = dist_t.t().contiguous();  // [h, w]
  double* dist = dist_tensor.data_ptr<double>();
  for (int64_t y = 0; y < h; ++y) edt_1d(dist + y * w, w, scratch, v, z);

  at::Tensor alpha = at::empty({h, w}, at::kFloat);
  float* a = alpha.data_ptr<float>();
  const double inv_radius = 1.0 / radius_px;
  for (int64_t i = 0; i < h * w; ++i) {
    if (!(m[i] > 0.0f)) {
      a[i] = 0.0f;  // exact zero, also for negative or NaN input
      continue;
    }
    const double ramp = std::min(1.0, std::sqrt(dist[i]) * inv_radius);
    a[i] = static_cast<float>(m[i] * ramp);
  }
  return alpha;
}

at::Tensor feather_region(const at::Tensor& pixel_mask, float radius_px, const PixelRect& region) {
  check_2d_mask(pixel_mask, "feather_region");
  const int h = static_cast<int>(pixel_mask.size(0)), w = static_cast<int>(pixel_mask.size(1));
  const PixelRect& r = region;
  if (r.empty() || r.x < 0 || r.y < 0 || r.x + r.width > w || r.y + r.height > h) {
    throw std::invalid_argument("feather_region: region " + std::to_string(r.width) + "x" + std::to_string(r.height) +
                                " at " + std::to_string(r.x) + "," + std::to_string(r.y) + " is empty or leaves the " +
                                std::to_string(w) + "x" + std::to_string(h) + " mask");
  }
  const int x0 = std::max(0, r.x - 1), y0 = std::max(0, r.y - 1);
  const int x1 = std::min(w, r.x + r.width + 1), y1 = std::min(h, r.y + r.height + 1);
  const at::Tensor grown = pixel_mask.narrow(0, y0, y1 - y0).narrow(1, x0, x1 - x0);
  // Outside the region nothing may be masked, or the ring would not hold only kept pixels.
  const int64_t inside = (pixel_mask.narrow(0, r.y, r.height).narrow(1, r.x, r.width) > 0).sum().item<int64_t>();
  if ((pixel_mask > 0).sum().item<int64_t>() != inside) {
    throw std::invalid_argument("feather_region: the mask has pixels > 0 outside the region");
  }
  return feather(grown, radius_px).narrow(0, r.y - y0, r.height).narrow(1, r.x - x0, r.width).contiguous();
}

PixelRect bounding_box(const at::Tensor& mask, int margin, int align) {
  check_2d_mask(mask, "bounding_box");
  const int h = static_cast<int>(mask.size(0));
  const int w = static_cast<int>(mask.size(1));
  at::Tensor positive = mask > 0;
  at::Tensor rows = positive.any(1).nonzero();  // [R, 1]
  if (rows.size(0) == 0) return {};
  at::Tensor cols = positive.any(0).nonzero();
  int x0 = static_cast<int>(cols.min().item<int64_t>());
  int x1 = static_cast<int>(cols.max().item<int64_t>()) + 1;
  int y0 = static_cast<int>(rows.min().item<int64_t>());
  int y1 = static_cast<int>(rows.max().item<int64_t>()) + 1;
  margin = std::max(margin, 0);
  x0 -= margin;
  y0 -= margin;
  x1 += margin;
  y1 += margin;
  if (align > 1) {
    auto down = [align](int v) {
      return v >= 0 ? v / align * align : -((-v + align - 1) / align) * align;
    };
    auto up = [&down, align](int v) { return -down(-v); };
    x0 = down(x0);
    y0 = down(y0);
    x1 = up(x1);
    y1 = up(y1);
  }
  x0 = std::clamp(x0, 0, w);
  y0 = std::clamp(y0, 0, h);
  x1 = std::clamp(x1, 0, w);
  y1 = std::clamp(y1, 0, h);
  return {x0, y0, x1 - x0, y1 - y0};
}

}  // namespace infill
