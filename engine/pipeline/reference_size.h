#pragma once
/// The sizes a reference image may have (reference_image.h): at least 64 pixels a side and an
/// aspect ratio of at most 8, upstream's checkable limits. The one rule, over width and height
/// only, so that the engine (make_reference_image) and a client that reads just an image's
/// header (infill-render's job files) refuse the same images with the same words. Torch-free.

#include <algorithm>
#include <string>

#include "common/status.h"

namespace infill {

constexpr int kMinReferenceSide = 64;
constexpr double kMaxReferenceAspect = 8.0;

/// OK when a `width` x `height` image can be a reference; otherwise invalid_argument naming
/// the image ("reference image NAME is 40x40 pixels; a reference is at least 64 pixels a
/// side", or "...; a reference's aspect ratio is at most 8").
inline Status check_reference_size(const std::string& name, int width, int height) {
  const std::string size = std::to_string(width) + "x" + std::to_string(height);
  if (width < kMinReferenceSide || height < kMinReferenceSide)
    return invalid_argument("reference image " + name + " is " + size +
                            " pixels; a reference is at least " +
                            std::to_string(kMinReferenceSide) + " pixels a side");
  const double aspect = double(std::max(width, height)) / double(std::min(width, height));
  if (aspect > kMaxReferenceAspect)
    return invalid_argument("reference image " + name + " is " + size +
                            " pixels; a reference's aspect ratio is at most " +
                            std::to_string(static_cast<int>(kMaxReferenceAspect)));
  return {};
}

/// What check_reference_size accepts, for an error's "expected ..." part: "at least 64 pixels
/// a side with an aspect ratio of at most 8".
inline std::string reference_size_expected() {
  return "at least " + std::to_string(kMinReferenceSide) +
         " pixels a side with an aspect ratio of at most " +
         std::to_string(static_cast<int>(kMaxReferenceAspect));
}

}  // namespace infill
