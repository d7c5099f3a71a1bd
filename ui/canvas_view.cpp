#include "ui/canvas_view.h"

#include <QKeyEvent>
#include <QMouseEvent>
#include <QPainter>
#include <QWheelEvent>

#include <algorithm>
#include <cmath>

namespace infill::ui {

namespace {
constexpr double kMinZoom = 0.02, kMaxZoom = 64.0;
}

CanvasView::CanvasView(MaskDocument* mask, QWidget* parent) : QWidget(parent), mask_(mask) {
  setMouseTracking(true);
  setFocusPolicy(Qt::StrongFocus);
  setAttribute(Qt::WA_OpaquePaintEvent);
  setMinimumSize(200, 150);
  connect(mask_, &MaskDocument::maskChanged, this, [this](QRect rect) {
    rebuildOverlay(rect);
    update();
  });
}

void CanvasView::setImage(const QImage& image) {
  const bool new_size = image.size() != image_.size();
  image_ = image;
  preview_ = QImage();
  if (new_size) {
    overlay_ = QImage();
    fit_pending_ = true;
    fitToWindow();
  }
  rebuildOverlay(image_.rect());
  update();
}

void CanvasView::setTool(Tool tool) {
  if (mask_->strokeActive()) mask_->endStroke();
  tool_ = tool;
  selecting_ = false;
  lasso_.clear();
  update();
}

void CanvasView::setBrush(const BrushShape& brush) {
  brush_ = brush;
  brush_.size_px = std::clamp(brush_.size_px, 1.0, 2000.0);
  brush_.hardness = std::clamp(brush_.hardness, 0.0, 1.0);
  update();
}

void CanvasView::setOverlayColor(const QColor& color) {
  overlay_color_ = color;
  rebuildOverlay(image_.rect());
  update();
}

void CanvasView::setOverlayOpacity(double opacity) {
  overlay_opacity_ = std::clamp(opacity, 0.0, 1.0);
  update();
}

void CanvasView::setOverlayVisible(bool visible) {
  overlay_visible_ = visible;
  update();
}

void CanvasView::setPreview(const QImage& preview, const QRect& where) {
  preview_ = preview;
  preview_rect_ = where;
  update();
}

void CanvasView::setComparison(const QImage& b) {
  comparison_ = b;
  update();
}

void CanvasView::setSplit(double split) {
  split_ = std::clamp(split, 0.0, 1.0);
  update();
}

QPointF CanvasView::toImage(QPointF widget_pos) const { return (widget_pos - origin_) / zoom_; }
QPointF CanvasView::toWidget(QPointF image_pos) const { return origin_ + image_pos * zoom_; }

void CanvasView::fitToWindow() {
  if (image_.isNull() || width() <= 0 || height() <= 0) return;
  const double z = std::min(double(width()) / image_.width(), double(height()) / image_.height()) * 0.95;
  zoom_ = std::clamp(z, kMinZoom, kMaxZoom);
  origin_ = QPointF((width() - image_.width() * zoom_) / 2.0, (height() - image_.height() * zoom_) / 2.0);
  fit_pending_ = false;
  emit zoomChanged(zoom_);
  update();
}

void CanvasView::actualSize() { zoomAround(QPointF(width() / 2.0, height() / 2.0), 1.0); }

void CanvasView::zoomBy(double factor) { zoomAround(QPointF(width() / 2.0, height() / 2.0), zoom_ * factor); }

void CanvasView::zoomAround(QPointF widget_pos, double new_zoom) {
  new_zoom = std::clamp(new_zoom, kMinZoom, kMaxZoom);
  // Keep the image point under `widget_pos` where it is.
  const QPointF image_pos = toImage(widget_pos);
  zoom_ = new_zoom;
  origin_ = widget_pos - image_pos * zoom_;
  fit_pending_ = false;
  emit zoomChanged(zoom_);
  update();
}

void CanvasView::rebuildOverlay(QRect rect) {
  const QImage& m = mask_->mask();
  if (m.isNull()) {
    overlay_ = QImage();
    return;
  }
  if (overlay_.size() != m.size()) {
    overlay_ = QImage(m.size(), QImage::Format_ARGB32_Premultiplied);
    rect = m.rect();
  }
  rect = rect.intersected(m.rect());
  const int r = overlay_color_.red(), g = overlay_color_.green(), b = overlay_color_.blue();
  for (int y = rect.top(); y <= rect.bottom(); ++y) {
    const uint8_t* src = m.constScanLine(y);
    auto* dst = reinterpret_cast<QRgb*>(overlay_.scanLine(y));
    for (int x = rect.left(); x <= rect.right(); ++x) {
      const int a = src[x];
      dst[x] = qRgba(r * a / 255, g * a / 255, b * a / 255, a);
    }
  }
}

void CanvasView::paintEvent(QPaintEvent*) {
  QPainter p(this);
  p.fillRect(rect(), QColor(48, 48, 52));
  if (image_.isNull()) {
    p.setPen(QColor(170, 170, 170));
    p.drawText(rect(), Qt::AlignCenter, tr("Open an image (Ctrl+O) or drop one here"));
    return;
  }
  const QRectF target(origin_, QSizeF(image_.width() * zoom_, image_.height() * zoom_));
  p.setRenderHint(QPainter::SmoothPixmapTransform, zoom_ < 1.0);
  p.drawImage(target, image_);

  if (!preview_.isNull() && !preview_rect_.isEmpty()) {
    p.drawImage(QRectF(toWidget(preview_rect_.topLeft()), QSizeF(preview_rect_.size()) * zoom_), preview_);
  }
  if (!comparison_.isNull() && comparison_.size() == image_.size()) {
    const double split_x = target.left() + target.width() * split_;
    p.save();
    p.setClipRect(QRectF(QPointF(split_x, target.top()), target.bottomRight()));
    p.drawImage(target, comparison_);
    p.restore();
    p.setPen(QPen(Qt::white, 2));
    p.drawLine(QPointF(split_x, target.top()), QPointF(split_x, target.bottom()));
    p.setPen(Qt::white);
    p.drawText(QPointF(split_x - 22, target.top() + 16), QStringLiteral("A"));
    p.drawText(QPointF(split_x + 10, target.top() + 16), QStringLiteral("B"));
  }
  if (overlay_visible_ && !overlay_.isNull()) {
    p.setOpacity(overlay_opacity_);
    p.drawImage(target, overlay_);
    p.setOpacity(1.0);
  }

  // Tool feedback: the rectangle or lasso being drawn, the brush outline.
  p.setRenderHint(QPainter::Antialiasing, true);
  p.setPen(QPen(Qt::white, 1, Qt::DashLine));
  p.setBrush(Qt::NoBrush);
  if (selecting_ && tool_ == Tool::Rectangle) {
    p.drawRect(QRectF(toWidget(select_start_), toWidget(hover_)).normalized());
  } else if (selecting_ && tool_ == Tool::Lasso && lasso_.size() > 1) {
    QPolygonF w;
    for (const QPointF& pt : lasso_) w << toWidget(pt);
    p.drawPolyline(w);
  }
  if (hover_inside_ && (tool_ == Tool::Brush || tool_ == Tool::Eraser) && !space_down_) {
    const double r = brush_.size_px / 2.0 * zoom_;
    p.setPen(QPen(QColor(0, 0, 0, 160), 3));
    p.drawEllipse(toWidget(hover_), r, r);
    p.setPen(QPen(Qt::white, 1));
    p.drawEllipse(toWidget(hover_), r, r);
  }
}

void CanvasView::mousePressEvent(QMouseEvent* event) {
  setFocus();
  const QPointF pos = event->position();
  if (event->button() == Qt::MiddleButton || (event->button() == Qt::LeftButton && space_down_)) {
    panning_ = true;
    pan_last_ = pos;
    setCursor(Qt::ClosedHandCursor);
    return;
  }
  if (event->button() != Qt::LeftButton || image_.isNull()) return;
  const QPointF ip = toImage(pos);
  hover_ = ip;
  switch (tool_) {
    case Tool::Brush:
    case Tool::Eraser:
      mask_->beginStroke(ip, brush_, tool_ == Tool::Eraser);
      break;
    case Tool::Rectangle:
    case Tool::Lasso:
      // Alt subtracts from the mask instead of adding.
      selecting_ = true;
      select_erase_ = event->modifiers() & Qt::AltModifier;
      select_start_ = ip;
      lasso_ = QPolygonF() << ip;
      break;
  }
  update();
}

void CanvasView::mouseMoveEvent(QMouseEvent* event) {
  const QPointF pos = event->position();
  if (panning_) {
    origin_ += pos - pan_last_;
    pan_last_ = pos;
    update();
    return;
  }
  const QPointF ip = toImage(pos);
  hover_ = ip;
  hover_inside_ = true;
  emit cursorMoved(ip.toPoint());
  if (mask_->strokeActive()) mask_->continueStroke(ip);
  if (selecting_ && tool_ == Tool::Lasso) lasso_ << ip;
  update();
}

void CanvasView::mouseReleaseEvent(QMouseEvent* event) {
  if (panning_ && (event->button() == Qt::MiddleButton || event->button() == Qt::LeftButton)) {
    panning_ = false;
    setCursor(space_down_ ? Qt::OpenHandCursor : Qt::ArrowCursor);
    return;
  }
  if (event->button() != Qt::LeftButton) return;
  const QPointF ip = toImage(event->position());
  if (mask_->strokeActive()) {
    mask_->continueStroke(ip);
    mask_->endStroke();
  } else if (selecting_) {
    selecting_ = false;
    if (tool_ == Tool::Rectangle) {
      mask_->fillRect(QRectF(select_start_, ip), select_erase_);
    } else {
      lasso_ << ip;
      mask_->fillPolygon(lasso_, select_erase_);
      lasso_.clear();
    }
  }
  update();
}

void CanvasView::wheelEvent(QWheelEvent* event) {
  const double steps = event->angleDelta().y() / 120.0;
  if (steps == 0) return;
  zoomAround(event->position(), zoom_ * std::pow(1.25, steps));
  event->accept();
}

void CanvasView::keyPressEvent(QKeyEvent* event) {
  if (event->key() == Qt::Key_Space && !event->isAutoRepeat()) {
    space_down_ = true;
    setCursor(Qt::OpenHandCursor);
    update();
    return;
  }
  QWidget::keyPressEvent(event);
}

void CanvasView::keyReleaseEvent(QKeyEvent* event) {
  if (event->key() == Qt::Key_Space && !event->isAutoRepeat()) {
    space_down_ = false;
    panning_ = false;
    setCursor(Qt::ArrowCursor);
    update();
    return;
  }
  QWidget::keyReleaseEvent(event);
}

void CanvasView::resizeEvent(QResizeEvent*) {
  if (fit_pending_) fitToWindow();
}

void CanvasView::leaveEvent(QEvent*) {
  hover_inside_ = false;
  update();
}

}  // namespace infill::ui
