#pragma once
/// Reference images of an edit: images besides the template that a FLUX.2 [klein] edit
/// conditions on (a style, an object, a depth map), the klein way: each is VAE-encoded once and
/// enters the sequence as clean latent tokens after the template's own reference tokens, at
/// position time t = 20, 30, ... (upstream's encode_image_refs: t = 10 + 10 i, the template
/// being this engine's first reference). Their K/V are part of an edit's cached context like
/// the unmasked tokens', so the activation keys include their ids.
///
/// Sizes follow upstream's preparation where it is checkable: at least 64 pixels a side, an
/// aspect ratio of at most 8 (check_reference_size in reference_size.h, the one rule that
/// clients check too), and at most 1024x1024 pixels (upstream's cap with several
/// references; it allows 2024^2 for a single one, which this engine does not, so that a step's
/// cost stays bounded by the mask and four references). Larger images are scaled down keeping
/// their aspect (antialiased bicubic; upstream uses PIL's Lanczos); sizes are rounded to the
/// codec's grid by edge padding, as templates are (upstream centre-crops to a multiple of 16).

#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

#include "common/status.h"

namespace infill {

class LatentCodec;
struct TemplateImage;

/// The most reference images an edit carries, and the pixels of each.
constexpr int kMaxReferenceImages = 4;
constexpr int64_t kMaxReferencePixels = int64_t{1024} * 1024;

struct ReferenceImage {
  std::string id;     ///< the template id it was uploaded under (part of cache keys)
  at::Tensor latent;  ///< [C, h, w] float32 in the model's latent scale
};

/// The reference made from an uploaded image: its latent as is when it holds at most
/// kMaxReferencePixels, else its pixels scaled down to fit, padded to `grid` and encoded with
/// `codec` (shift 0, scale 1: FLUX.2's latent). Errors name the image (`tmpl.id`) and the
/// limit it breaks.
Result<ReferenceImage> make_reference_image(const LatentCodec& codec, int grid, const TemplateImage& tmpl);

}  // namespace infill
