#include "pipeline/region_composite.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>

#include "pipeline/composite.h"

namespace infill {

RegionComposite decode_region_and_composite(const LatentCodec& codec, const TemplateImage& tmpl, const at::Tensor& latent,
                                            const at::Tensor& mask, float feather_px, int decode_margin) {
  c10::InferenceMode guard;
  RegionComposite out;
  const int factor = codec.factor();
  at::Tensor padded_mask = at::zeros({tmpl.model_height, tmpl.model_width}, at::kFloat);
  padded_mask.narrow(0, 0, tmpl.height).narrow(1, 0, tmpl.width).copy_(mask);
  out.region = bounding_box(padded_mask, 0, factor);
  const PixelRect& r = out.region;
  const at::Tensor decoded = codec.decode_crop(latent.unsqueeze(0), r.x / factor, r.y / factor, r.width / factor,
                                               r.height / factor, decode_margin)[0];
  // Every masked pixel lies in the region's part inside the original: feather and blend run
  // there alone, the rest of the original is copied byte for byte.
  const PixelRect inside{r.x, r.y, std::min(r.width, tmpl.width - r.x), std::min(r.height, tmpl.height - r.y)};
  const at::Tensor generated = decoded.narrow(1, 0, inside.height).narrow(2, 0, inside.width).contiguous();
  out.image = composite(tmpl.pixels, generated, feather_region(mask, feather_px, inside), inside);
  return out;
}

}  // namespace infill
