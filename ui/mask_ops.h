#pragma once
/// @file
/// Pixel operations on masks: QImage::Format_Grayscale8, 0 = keep, 255 = regenerate, grey =
/// blend (the engine's convention). Pure functions of their inputs, callable from any thread.

#include <QImage>
#include <QPointF>
#include <QPolygonF>
#include <QRect>

namespace infill::ui {

/// A round brush. `size_px` is the diameter in image pixels; `hardness` in [0, 1] is the
/// fraction of the radius painted at full strength (1 = hard edge, 0 = a linear fall-off from
/// the centre).
struct BrushShape {
  double size_px = 32.0;
  double hardness = 0.8;
};

/// Coverage in [0, 1] of one dab centred at `centre`, at pixel centre (x + 0.5, y + 0.5).
double dab_coverage(const BrushShape& brush, QPointF centre, int x, int y);

/// Stamps dabs along the segment from `from` to `to` into `coverage` (Grayscale8, 0..255) by
/// taking the maximum, so a stroke that crosses itself does not build up beyond one dab.
/// Returns the pixels touched (clipped to the image).
QRect stamp_segment(QImage& coverage, const BrushShape& brush, QPointF from, QPointF to);

/// Combines a stroke's coverage into `mask` inside `rect`, starting from `base` (the mask
/// before the stroke): painting takes max(base, coverage); erasing scales base by
/// (1 - coverage). All three images have the same size.
void composite_stroke(QImage& mask, const QImage& base, const QImage& coverage, QRect rect,
                      bool erase);

/// Coverage (Grayscale8, the mask's size) of a filled polygon in image coordinates,
/// antialiased. A rectangle is a polygon with four corners.
QImage polygon_coverage(QSize size, const QPolygonF& polygon);

/// 255 - v for every pixel.
void invert_mask(QImage& mask);

/// Dilates (radius_px > 0) or erodes (< 0) by a square of side 2|radius_px| + 1, with a
/// separable running max / min. Grey levels are kept (grey-scale morphology).
void grow_mask(QImage& mask, int radius_px);

/// Softens edges: three passes of a separable box blur (close to a Gaussian of sigma ~
/// radius_px / 2), so that a hard edge ramps over about 2 * radius_px pixels.
void feather_mask(QImage& mask, double radius_px);

/// Bounding box of the pixels > 0; empty when the mask is empty.
QRect mask_bounds(const QImage& mask);

}  // namespace infill::ui
