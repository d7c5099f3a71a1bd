#pragma once
/// The last part of every edit, whatever the model: decode the latent box around the mask
/// (with context) and composite it onto the template's pixels, feathered inward, so that every
/// pixel outside the mask keeps its bytes.

#include <ATen/core/Tensor.h>

#include "model/latent_codec.h"
#include "pipeline/image_io.h"
#include "pipeline/mask.h"
#include "pipeline/template_image.h"

namespace infill {

struct RegionComposite {
  PixelImage image;  ///< same size and format as the template
  PixelRect region;  ///< pixel box that was decoded
};

/// `latent` [C, h, w] in the codec's scale (the template's latent with the edited tokens);
/// `mask` [H, W] float at the template's pixel size, not empty.
RegionComposite decode_region_and_composite(const LatentCodec& codec, const TemplateImage& tmpl, const at::Tensor& latent,
                                            const at::Tensor& mask, float feather_px, int decode_margin);

}  // namespace infill
