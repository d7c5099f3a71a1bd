#include "ui/mask_ops.h"

#include <QPainter>
#include <QPainterPath>

#include <algorithm>
#include <cmath>
#include <deque>
#include <vector>

namespace infill::ui {

namespace {

// Sliding max (grow) or min (shrink) over a window of 2r + 1 samples of one line, with a
// monotonic deque: O(n) whatever the radius, so large grows stay interactive.
void sliding_extreme(const uint8_t* in, uint8_t* out, int n, int stride, int r, bool take_max) {
  std::deque<int> window;  // indices whose values are monotonic (decreasing for max)
  auto better = [&](uint8_t a, uint8_t b) { return take_max ? a >= b : a <= b; };
  int next = 0;  // next index to enter the window
  for (int i = 0; i < n; ++i) {
    const int hi = std::min(n - 1, i + r);
    while (next <= hi) {
      while (!window.empty() && better(in[next * stride], in[window.back() * stride])) window.pop_back();
      window.push_back(next++);
    }
    while (window.front() < i - r) window.pop_front();
    out[i * stride] = in[window.front() * stride];
  }
}

// One box blur pass of radius r along a line, edges clamped (a mask touching the border
// does not fade towards it).
void box_line(const uint8_t* in, uint8_t* out, int n, int stride, int r) {
  const int width = 2 * r + 1;
  auto at = [&](int i) { return static_cast<int>(in[std::clamp(i, 0, n - 1) * stride]); };
  int sum = 0;
  for (int i = -r; i <= r; ++i) sum += at(i);
  for (int i = 0; i < n; ++i) {
    out[i * stride] = static_cast<uint8_t>((sum + width / 2) / width);
    sum += at(i + r + 1) - at(i - r);
  }
}

// Applies `line_op(in, out, n, stride)` to every row, then every column, of `mask`.
template <typename LineOp>
void separable(QImage& mask, LineOp line_op) {
  const int w = mask.width(), h = mask.height();
  const int bpl = static_cast<int>(mask.bytesPerLine());
  std::vector<uint8_t> src(static_cast<size_t>(bpl) * static_cast<size_t>(h));
  std::copy_n(mask.constBits(), src.size(), src.begin());
  uint8_t* dst = mask.bits();
  for (int y = 0; y < h; ++y) line_op(src.data() + y * bpl, dst + y * bpl, w, 1);
  std::copy_n(mask.constBits(), src.size(), src.begin());
  for (int x = 0; x < w; ++x) line_op(src.data() + x, dst + x, h, bpl);
}

}  // namespace

double dab_coverage(const BrushShape& brush, QPointF centre, int x, int y) {
  const double radius = std::max(0.5, brush.size_px / 2.0);
  const double dx = x + 0.5 - centre.x(), dy = y + 0.5 - centre.y();
  const double d = std::sqrt(dx * dx + dy * dy);
  const double hard = std::clamp(brush.hardness, 0.0, 1.0) * radius;
  if (d <= hard) return 1.0;
  if (d >= radius) return 0.0;
  const double t = (d - hard) / (radius - hard);
  return 1.0 - t * t * (3.0 - 2.0 * t);  // smoothstep fall-off
}

QRect stamp_segment(QImage& coverage, const BrushShape& brush, QPointF from, QPointF to) {
  const double radius = std::max(0.5, brush.size_px / 2.0);
  // Dabs a quarter radius apart look continuous at any hardness.
  const double spacing = std::max(0.5, radius / 4.0);
  const QPointF delta = to - from;
  const double length = std::hypot(delta.x(), delta.y());
  const int dabs = 1 + static_cast<int>(std::ceil(length / spacing));
  QRect touched;
  const QRect image_rect = coverage.rect();
  for (int i = 0; i < dabs; ++i) {
    const QPointF c = dabs == 1 ? to : from + delta * (static_cast<double>(i) / (dabs - 1));
    const QRect box = QRect(QPoint(static_cast<int>(std::floor(c.x() - radius)),
                                   static_cast<int>(std::floor(c.y() - radius))),
                            QPoint(static_cast<int>(std::ceil(c.x() + radius)),
                                   static_cast<int>(std::ceil(c.y() + radius))))
                          .intersected(image_rect);
    for (int y = box.top(); y <= box.bottom(); ++y) {
      uint8_t* row = coverage.scanLine(y);
      for (int x = box.left(); x <= box.right(); ++x) {
        const int v = static_cast<int>(std::lround(dab_coverage(brush, c, x, y) * 255.0));
        if (v > row[x]) row[x] = static_cast<uint8_t>(v);
      }
    }
    touched |= box;
  }
  return touched;
}

void composite_stroke(QImage& mask, const QImage& base, const QImage& coverage, QRect rect,
                      bool erase) {
  rect = rect.intersected(mask.rect());
  for (int y = rect.top(); y <= rect.bottom(); ++y) {
    uint8_t* out = mask.scanLine(y);
    const uint8_t* b = base.constScanLine(y);
    const uint8_t* c = coverage.constScanLine(y);
    for (int x = rect.left(); x <= rect.right(); ++x) {
      out[x] = erase ? static_cast<uint8_t>((b[x] * (255 - c[x]) + 127) / 255) : std::max(b[x], c[x]);
    }
  }
}

QImage polygon_coverage(QSize size, const QPolygonF& polygon) {
  // QPainter does not draw on Grayscale8; draw white on an alpha-only image instead.
  QImage alpha(size, QImage::Format_Alpha8);
  alpha.fill(0);
  {
    QPainter p(&alpha);
    p.setRenderHint(QPainter::Antialiasing, true);
    p.setPen(Qt::NoPen);
    p.setBrush(Qt::white);
    QPainterPath path;
    path.addPolygon(polygon);
    path.closeSubpath();
    p.drawPath(path);
  }
  QImage out(size, QImage::Format_Grayscale8);
  for (int y = 0; y < size.height(); ++y)
    std::copy_n(alpha.constScanLine(y), size.width(), out.scanLine(y));
  return out;
}

void invert_mask(QImage& mask) {
  for (int y = 0; y < mask.height(); ++y) {
    uint8_t* row = mask.scanLine(y);
    for (int x = 0; x < mask.width(); ++x) row[x] = static_cast<uint8_t>(255 - row[x]);
  }
}

void grow_mask(QImage& mask, int radius_px) {
  if (radius_px == 0 || mask.isNull()) return;
  const int r = std::abs(radius_px);
  const bool take_max = radius_px > 0;
  separable(mask, [&](const uint8_t* in, uint8_t* out, int n, int stride) {
    sliding_extreme(in, out, n, stride, r, take_max);
  });
}

void feather_mask(QImage& mask, double radius_px) {
  if (radius_px <= 0 || mask.isNull()) return;
  // Three box passes of radius r have variance 3 * r(r+1)/3 = r(r+1); r ~ radius / 2 gives a
  // ramp about 2 * radius wide.
  const int r = std::max(1, static_cast<int>(std::lround(radius_px / 2.0)));
  for (int pass = 0; pass < 3; ++pass) {
    separable(mask, [&](const uint8_t* in, uint8_t* out, int n, int stride) { box_line(in, out, n, stride, r); });
  }
}

QRect mask_bounds(const QImage& mask) {
  int left = mask.width(), right = -1, top = mask.height(), bottom = -1;
  for (int y = 0; y < mask.height(); ++y) {
    const uint8_t* row = mask.constScanLine(y);
    for (int x = 0; x < mask.width(); ++x) {
      if (row[x] == 0) continue;
      left = std::min(left, x);
      right = std::max(right, x);
      top = std::min(top, y);
      bottom = std::max(bottom, y);
    }
  }
  if (right < 0) return {};
  return QRect(QPoint(left, top), QPoint(right, bottom));
}

}  // namespace infill::ui
