#include "pipeline/reference_image.h"

#include <algorithm>
#include <cmath>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "model/latent_codec.h"
#include "pipeline/composite.h"
#include "pipeline/reference_size.h"
#include "pipeline/template_image.h"

namespace infill {

Result<ReferenceImage> make_reference_image(const LatentCodec& codec, int grid, const TemplateImage& tmpl) {
  if (Status sized = check_reference_size(tmpl.id, tmpl.width, tmpl.height); !sized.ok())
    return sized;
  ReferenceImage ref;
  ref.id = tmpl.id;
  const int64_t pixels = int64_t{tmpl.width} * tmpl.height;
  if (pixels <= kMaxReferencePixels) {
    ref.latent = tmpl.latent;
    return ref;
  }
  c10::InferenceMode guard;
  const double scale = std::sqrt(double(kMaxReferencePixels) / double(pixels));
  const int64_t w = std::max<int64_t>(1, static_cast<int64_t>(tmpl.width * scale));
  const int64_t h = std::max<int64_t>(1, static_cast<int64_t>(tmpl.height * scale));
  // The template's rgb is edge-padded to its grid: scale the image itself, then pad again.
  const at::Tensor image = tmpl.rgb.narrow(1, 0, tmpl.height).narrow(2, 0, tmpl.width).unsqueeze(0);
  const at::Tensor scaled = at::_upsample_bicubic2d_aa(image, {h, w}, /*align_corners=*/false).clamp(0.0, 1.0)[0];
  const at::Tensor padded = pad_to_multiple(scaled.contiguous(), grid);
  ref.latent = codec.encode(padded.unsqueeze(0))[0].contiguous();
  return ref;
}

}  // namespace infill
