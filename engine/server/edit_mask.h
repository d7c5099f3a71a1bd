#pragma once
/// An edit's mask as the API takes it: an encoded image of the template's size (any channel
/// count: grey, or the mean of RGB; alpha dropped), or a rectangle [x, y, width, height] in
/// template pixels. Included only by the service (this header carries ATen).

#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "common/status.h"

namespace infill {

struct TemplateImage;

/// [H, W] float in [0, 1] at the template's size. `rect` wins when it is not null. Errors
/// name the mask and what was expected (kInvalidArgument for a mask that does not fit).
Result<at::Tensor> decode_edit_mask(const std::string& bytes, const nlohmann::json& rect, const TemplateImage& tmpl,
                                    int64_t max_image_pixels);

}  // namespace infill
