#pragma once
/// @file
/// The canvas: the image, the mask overlay, previews and the A/B comparison; mask tools.

#include <QColor>
#include <QImage>
#include <QPolygonF>
#include <QWidget>

#include "ui/mask_document.h"

namespace infill::ui {

/// Shows the image with the mask as a coloured overlay and turns pointer input into mask
/// edits on a MaskDocument. Zoom with the wheel (around the pointer), pan with space-drag or
/// the middle button. With a comparison image set, the part right of the split shows it.
class CanvasView : public QWidget {
  Q_OBJECT

 public:
  enum class Tool { Brush, Eraser, Rectangle, Lasso };
  Q_ENUM(Tool)

  explicit CanvasView(MaskDocument* mask, QWidget* parent = nullptr);

  void setImage(const QImage& image);
  const QImage& image() const { return image_; }

  void setTool(Tool tool);
  Tool tool() const { return tool_; }
  void setBrush(const BrushShape& brush);
  const BrushShape& brush() const { return brush_; }

  void setOverlayColor(const QColor& color);
  QColor overlayColor() const { return overlay_color_; }
  /// 0..1.
  void setOverlayOpacity(double opacity);
  double overlayOpacity() const { return overlay_opacity_; }
  void setOverlayVisible(bool visible);
  bool overlayVisible() const { return overlay_visible_; }

  /// A streamed preview drawn over `where` (image coordinates); a null image removes it.
  void setPreview(const QImage& preview, const QRect& where);
  /// The B side of the A/B comparison (the image's size); null turns comparison off.
  void setComparison(const QImage& b);
  /// Where the split is, 0 (all B) .. 1 (all A).
  void setSplit(double split);
  double split() const { return split_; }

  double zoom() const { return zoom_; }
  /// Widget <-> image coordinates.
  QPointF toImage(QPointF widget_pos) const;
  QPointF toWidget(QPointF image_pos) const;

 public slots:
  void fitToWindow();
  void actualSize();
  void zoomBy(double factor);

 signals:
  void zoomChanged(double zoom);
  void cursorMoved(QPoint image_pos);

 protected:
  void paintEvent(QPaintEvent* event) override;
  void mousePressEvent(QMouseEvent* event) override;
  void mouseMoveEvent(QMouseEvent* event) override;
  void mouseReleaseEvent(QMouseEvent* event) override;
  void wheelEvent(QWheelEvent* event) override;
  void keyPressEvent(QKeyEvent* event) override;
  void keyReleaseEvent(QKeyEvent* event) override;
  void resizeEvent(QResizeEvent* event) override;
  void leaveEvent(QEvent* event) override;

 private:
  void rebuildOverlay(QRect rect);
  void zoomAround(QPointF widget_pos, double new_zoom);

  MaskDocument* mask_;
  QImage image_;
  QImage overlay_;  // ARGB32_Premultiplied, the overlay colour with the mask as alpha
  QColor overlay_color_{255, 40, 90};
  double overlay_opacity_ = 0.5;
  bool overlay_visible_ = true;
  QImage preview_;
  QRect preview_rect_;
  QImage comparison_;
  double split_ = 0.5;

  Tool tool_ = Tool::Brush;
  BrushShape brush_;
  double zoom_ = 1.0;
  QPointF origin_;  // widget position of the image's top-left corner
  bool fit_pending_ = true;

  // Pointer state.
  bool space_down_ = false;
  bool panning_ = false;
  QPointF pan_last_;
  bool selecting_ = false;
  bool select_erase_ = false;
  QPointF select_start_;
  QPolygonF lasso_;
  QPointF hover_;
  bool hover_inside_ = false;
};

}  // namespace infill::ui
