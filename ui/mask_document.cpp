#include "ui/mask_document.h"

#include <QImageReader>
#include <QUndoCommand>

namespace infill::ui {

namespace {

// One mask change: the pixels of `rect` before and after. Storing only the changed rectangle
// keeps a long history of small strokes cheap on large images.
class MaskChangeCommand : public QUndoCommand {
 public:
  MaskChangeCommand(MaskDocument* doc, QRect rect, QImage before, QImage after, const QString& text)
      : QUndoCommand(text), doc_(doc), rect_(rect), before_(std::move(before)), after_(std::move(after)) {}
  // The change is already on the mask when the command is pushed; the first redo() is a no-op.
  void redo() override {
    if (first_) {
      first_ = false;
      return;
    }
    doc_->setRegion(rect_, after_);
  }
  void undo() override { doc_->setRegion(rect_, before_); }

 private:
  MaskDocument* doc_;
  QRect rect_;
  QImage before_, after_;
  bool first_ = true;
};

}  // namespace

MaskDocument::MaskDocument(QUndoStack* undo_stack, QObject* parent)
    : QObject(parent), undo_(undo_stack ? undo_stack : new QUndoStack(this)) {}

void MaskDocument::reset(QSize size) {
  stroke_active_ = false;
  mask_ = QImage(size, QImage::Format_Grayscale8);
  mask_.fill(0);
  undo_->clear();
  emit maskChanged(mask_.rect());
}

bool MaskDocument::isEmpty() const { return mask_bounds(mask_).isEmpty(); }

void MaskDocument::beginStroke(QPointF image_pos, const BrushShape& brush, bool erase) {
  if (mask_.isNull()) return;
  if (stroke_active_) endStroke();
  stroke_active_ = true;
  stroke_erase_ = erase;
  stroke_brush_ = brush;
  stroke_last_ = image_pos;
  stroke_base_ = mask_.copy();
  stroke_coverage_ = QImage(mask_.size(), QImage::Format_Grayscale8);
  stroke_coverage_.fill(0);
  stroke_rect_ = QRect();
  continueStroke(image_pos);
}

void MaskDocument::continueStroke(QPointF image_pos) {
  if (!stroke_active_) return;
  const QRect touched = stamp_segment(stroke_coverage_, stroke_brush_, stroke_last_, image_pos);
  stroke_last_ = image_pos;
  if (touched.isEmpty()) return;
  composite_stroke(mask_, stroke_base_, stroke_coverage_, touched, stroke_erase_);
  stroke_rect_ |= touched;
  emit maskChanged(touched);
}

void MaskDocument::endStroke() {
  if (!stroke_active_) return;
  stroke_active_ = false;
  if (!stroke_rect_.isEmpty()) {
    pushChange(stroke_rect_, stroke_base_.copy(stroke_rect_), stroke_erase_ ? tr("Erase") : tr("Brush"));
  }
  stroke_base_ = QImage();
  stroke_coverage_ = QImage();
  emit editCommitted();
}

void MaskDocument::fillPolygon(const QPolygonF& polygon, bool erase) {
  if (mask_.isNull() || polygon.size() < 3) return;
  const QRect rect = polygon.boundingRect().toAlignedRect().adjusted(-1, -1, 1, 1).intersected(mask_.rect());
  if (rect.isEmpty()) return;
  const QImage before = mask_.copy(rect);
  const QImage coverage = polygon_coverage(mask_.size(), polygon);
  const QImage base = mask_.copy();
  composite_stroke(mask_, base, coverage, rect, erase);
  emit maskChanged(rect);
  pushChange(rect, before, erase ? tr("Subtract selection") : tr("Fill selection"));
  emit editCommitted();
}

void MaskDocument::fillRect(const QRectF& rect, bool erase) {
  fillPolygon(QPolygonF(rect.normalized()), erase);
}

void MaskDocument::applyWholeMaskOp(const QString& text, const std::function<void(QImage&)>& op) {
  if (mask_.isNull()) return;
  const QImage before = mask_.copy();
  op(mask_);
  if (mask_ == before) return;  // nothing changed: no empty entry in the history
  emit maskChanged(mask_.rect());
  pushChange(mask_.rect(), before, text);
  emit editCommitted();
}

void MaskDocument::invert() { applyWholeMaskOp(tr("Invert mask"), [](QImage& m) { invert_mask(m); }); }
void MaskDocument::clear() { applyWholeMaskOp(tr("Clear mask"), [](QImage& m) { m.fill(0); }); }
void MaskDocument::grow(int radius_px) {
  applyWholeMaskOp(radius_px >= 0 ? tr("Grow mask") : tr("Shrink mask"),
                   [radius_px](QImage& m) { grow_mask(m, radius_px); });
}
void MaskDocument::feather(double radius_px) {
  applyWholeMaskOp(tr("Feather mask"), [radius_px](QImage& m) { feather_mask(m, radius_px); });
}

bool MaskDocument::replace(const QImage& mask, QString* error) {
  if (mask.size() != mask_.size()) {
    if (error) {
      *error = tr("mask is %1x%2, image is %3x%4")
                   .arg(mask.width()).arg(mask.height()).arg(mask_.width()).arg(mask_.height());
    }
    return false;
  }
  const QImage grey = mask.convertToFormat(QImage::Format_Grayscale8);
  applyWholeMaskOp(tr("Load mask"), [&grey](QImage& m) { m = grey.copy(); });
  return true;
}

bool MaskDocument::load(const QString& path, QString* error) {
  QImageReader reader(path);
  QImage image = reader.read();
  if (image.isNull()) {
    if (error) *error = tr("%1: cannot read the mask (%2)").arg(path, reader.errorString());
    return false;
  }
  QString why;
  if (!replace(image, &why)) {
    if (error) *error = QStringLiteral("%1: %2").arg(path, why);
    return false;
  }
  return true;
}

bool MaskDocument::save(const QString& path, QString* error) const {
  if (!mask_.save(path, "PNG")) {
    if (error) *error = tr("%1: cannot write the mask PNG").arg(path);
    return false;
  }
  return true;
}

void MaskDocument::setRegion(QRect rect, const QImage& pixels) {
  for (int y = 0; y < rect.height(); ++y) {
    std::copy_n(pixels.constScanLine(y), rect.width(), mask_.scanLine(rect.top() + y) + rect.left());
  }
  emit maskChanged(rect);
}

void MaskDocument::pushChange(QRect rect, const QImage& before, const QString& text) {
  undo_->push(new MaskChangeCommand(this, rect, before, mask_.copy(rect), text));
}

}  // namespace infill::ui
