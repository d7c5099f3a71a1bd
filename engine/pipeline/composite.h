#pragma once
/// Compositing generated pixels onto the original image, and fitting images to the model grid.
///
/// The composite works in the original's own sample format so that every pixel whose alpha is
/// 0 comes back byte-for-byte identical (all channels, including alpha). Pure functions,
/// thread-safe.

#include <ATen/core/Tensor.h>

#include "common/status.h"
#include "pipeline/image_io.h"
#include "pipeline/mask.h"

namespace infill {

/// Checks that generated_rgb is float [3, H, W] and alpha float [H, W] with H, W the original's
/// size (or `region`'s size when given); a region must lie inside the original.
/// invalid_argument naming the mismatch otherwise.
Status check_composite_inputs(const PixelImage& original, const at::Tensor& generated_rgb,
                              const at::Tensor& alpha);
Status check_composite_inputs(const PixelImage& original, const at::Tensor& generated_rgb,
                              const at::Tensor& alpha, const PixelRect& region);

/// out = original * (1 - a) + generated * a per colour channel, in the original's format:
/// u8 / u16 are rounded to nearest and clamped, f16 rounded to nearest even, f32 and f16 not
/// clamped (HDR originals keep their range). A scene_linear original gets the generated
/// display-referred values through display_to_linear (colour_transfer.h) before the blend. Where a == 0 (or a is NaN) the pixel is copied byte-for-byte; where a >= 1 it is the
/// generated value. The original's alpha channel is always kept. Grey originals (1 or 2
/// channels) blend with the mean of the generated RGB. Generated values are clamped to [0, 1].
/// generated_rgb: float [3, H, W], alpha: float [H, W], H x W the original's size. Inputs are
/// programming-checked: a mismatch throws std::invalid_argument (validate with
/// check_composite_inputs for untrusted inputs).
PixelImage composite(const PixelImage& original, const at::Tensor& generated_rgb,
                     const at::Tensor& alpha);

/// As composite(), with generated_rgb [3, h, w] and alpha [h, w] covering only `region`
/// (e.g. the decoded crop around the mask); pixels outside the region are copied unchanged.
PixelImage composite(const PixelImage& original, const at::Tensor& generated_rgb,
                     const at::Tensor& alpha, const PixelRect& region);

/// Pads the last two dims (H, W) of `image` ([..., H, W], e.g. [3, H, W]) on the right and
/// bottom to multiples of `multiple` by replicating the last column / row. Returns `image`
/// itself when no padding is needed.
at::Tensor pad_to_multiple(const at::Tensor& image, int multiple);

/// The top-left width x height of `image` ([..., H, W]): a view sharing its storage.
at::Tensor crop(const at::Tensor& image, int width, int height);

}  // namespace infill
