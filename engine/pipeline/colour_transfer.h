#pragma once
/// Scene-linear light <-> the display-referred sRGB encoding the models read.
///
/// Models are trained on 8-bit sRGB pictures, so a scene-linear template (OpenEXR, HDR) is
/// shown to them through a view transform and what they generate goes back through its
/// inverse before it is composited into the linear pixels. The transform is OpenColorIO's
/// "linear" -> "sRGB" through OpenImageIO's colour management: the config named by $OCIO
/// where one is set, else OIIO's built-in one (the piecewise sRGB curve of IEC 61966-2-1).
/// Builds without OpenImageIO, and configs without those two spaces, use that curve directly.
/// Values above 1 stay above 1 here; the model's view clamps them (to_rgb_tensor).
/// Thread-safe: the processors are built once and only read afterwards.

#include <cstdint>
#include <string>

namespace infill {

/// Converts RGB triples in place. Sample c of pixel i is at data[i * pixel_stride + c *
/// channel_stride] (interleaved: pixel_stride = channels, channel_stride = 1; planar [3, N]:
/// pixel_stride = 1, channel_stride = N).
void linear_to_display(float* data, int64_t pixels, int64_t pixel_stride, int64_t channel_stride);
void display_to_linear(float* data, int64_t pixels, int64_t pixel_stride, int64_t channel_stride);

/// Which transform is in use, for /v1/templates and the logs: e.g. "OpenColorIO config
/// built-in: linear -> sRGB" or "the sRGB curve (IEC 61966-2-1)".
std::string colour_transfer_description();

}  // namespace infill
