#pragma once
/// Edit masks: loading, reduction to the latent grid and to DiT tokens, feathering.
///
/// A pixel mask is a float tensor [H, W] in [0, 1] on the CPU (OpenFX paint convention):
/// 0 = keep the template pixel, 1 = regenerate, grey = blend. All functions here are pure
/// and thread-safe; none keeps a reference to its inputs.

#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

#include "common/status.h"

namespace infill {

/// Loads a mask image through OpenImageIO as float [H, W] in [0, 1].
///
/// Channels: 1 or 2 (grey, grey + alpha) -> the first channel; 3 or more -> the mean of the
/// first three (RGB; a trailing alpha is ignored). Integer files are normalised by OIIO
/// (u8 / 255, u16 / 65535); float files are clamped to [0, 1] and NaN becomes 0.
/// Errors: missing file -> not_found; unreadable -> corrupt_data with OIIO's message; size
/// different from expected_width x expected_height -> invalid_argument
/// ("mask m.png is 511x512, template is 512x512").
Result<at::Tensor> load_mask(const std::string& path, int expected_width, int expected_height);

/// Reduces a pixel mask [H, W] to the latent grid: float [ceil(H / f), ceil(W / f)] of 0 / 1,
/// 1 where any pixel of the f x f block is > 0. The pixel mask is zero-padded to a multiple of
/// `factor` on the right and bottom first (matching the model's padding of the image).
at::Tensor latent_mask(const at::Tensor& pixel_mask, int factor);

/// The DiT tokens an edit recomputes.
struct TokenSet {
  at::Tensor indices;  ///< int64 [M], sorted ascending, row-major token ids (row * grid_w + col)
  int grid_w = 0;      ///< tokens per row
  int grid_h = 0;      ///< token rows

  /// Masked tokens / all tokens, in [0, 1]; 0 for an empty grid.
  double ratio() const;
  /// M.
  int64_t count() const;
  /// bool [grid_h * grid_w], true at the masked token ids.
  at::Tensor token_mask() const;
};

/// Tokens of a latent mask [h, w] for patch size `patch`: the grid is
/// ceil(h / patch) x ceil(w / patch) (the latent is zero-padded to a multiple of the patch),
/// a token is masked if any latent pixel of its patch is > 0, and the set is then dilated by
/// `halo_tokens` (Chebyshev distance, i.e. a square of side 2 * halo + 1) clamped to the grid.
TokenSet masked_tokens(const at::Tensor& latent_mask, int patch, int halo_tokens);

/// The same selection as masked_tokens, as a grid: bool [ceil(h / patch), ceil(w / patch)].
at::Tensor masked_token_grid(const at::Tensor& latent_mask, int patch, int halo_tokens);

/// Feathered compositing alpha [H, W] from a pixel mask [H, W]:
/// alpha = mask * clamp(d / radius_px, 0, 1), where d is the exact Euclidean distance from a
/// pixel to the nearest pixel whose mask is 0 (a masked pixel next to a kept one has d = 1).
/// Guarantees alpha == 0 exactly wherever mask == 0, so the composite keeps those pixels
/// bit-identical. The image border is not a mask border (nothing outside to blend with), so
/// a mask covering the whole image is returned unchanged. radius_px <= 0 returns a copy of
/// the mask.
at::Tensor feather(const at::Tensor& pixel_mask, float radius_px);

/// An axis-aligned rectangle in pixels; width == 0 means empty.
struct PixelRect {
  int x = 0;
  int y = 0;
  int width = 0;
  int height = 0;

  bool empty() const { return width <= 0 || height <= 0; }
  bool operator==(const PixelRect&) const = default;
};

/// feather(pixel_mask, radius_px) restricted to `region` ([region.height, region.width]),
/// with the distance transform run on the region grown by one pixel only, so that its cost
/// follows the edit rather than the image. Exact when every pixel > 0 lies inside `region`
/// (the nearest kept pixel of a pixel inside is then at most as far as the one-pixel ring
/// around it); std::invalid_argument otherwise, or when `region` is empty or leaves the mask.
at::Tensor feather_region(const at::Tensor& pixel_mask, float radius_px, const PixelRect& region);

/// Bounding box of the pixels > 0 of a mask [H, W], grown by `margin` on every side, aligned
/// outward to multiples of `align` (x and y rounded down, right and bottom edges rounded up),
/// then clamped to the image (so the right / bottom edge equals W / H when the image size is
/// not a multiple of `align`). An empty mask gives {0, 0, 0, 0}. align <= 1 means no alignment.
PixelRect bounding_box(const at::Tensor& mask, int margin, int align);

}  // namespace infill
