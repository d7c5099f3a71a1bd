#pragma once
/// @file
/// The mask being painted over an image, with undo of every change.

#include <QImage>
#include <QObject>
#include <QPolygonF>
#include <QUndoStack>

#include <functional>

#include "ui/mask_ops.h"

namespace infill::ui {

/// The editor's mask: Grayscale8, the image's size, 0 = keep, 255 = regenerate. Every change
/// (a whole stroke, a rectangle, invert, ...) is one command on undoStack(), which stores the
/// pixels of the changed rectangle before and after, so undo restores them exactly.
///
/// Lives on the GUI thread. The undo stack may be shared with other documents (the image's
/// "apply result" commands go on it too, so one Ctrl+Z walks back through both).
class MaskDocument : public QObject {
  Q_OBJECT

 public:
  /// `undo_stack` is not owned; nullptr = the document creates and owns its own.
  explicit MaskDocument(QUndoStack* undo_stack = nullptr, QObject* parent = nullptr);

  /// A blank mask of `size` (a new image was opened). Clears the undo history.
  void reset(QSize size);

  const QImage& mask() const { return mask_; }
  QSize size() const { return mask_.size(); }
  bool isEmpty() const;
  QUndoStack* undoStack() const { return undo_; }

  /// A brush (or eraser) stroke: begin, continue for each pointer move, end. The mask shows
  /// the stroke while it is drawn; end pushes it as one command and emits editCommitted().
  void beginStroke(QPointF image_pos, const BrushShape& brush, bool erase);
  void continueStroke(QPointF image_pos);
  void endStroke();
  bool strokeActive() const { return stroke_active_; }

  /// Fills (or with erase, clears) a polygon / rectangle in image coordinates.
  void fillPolygon(const QPolygonF& polygon, bool erase = false);
  void fillRect(const QRectF& rect, bool erase = false);
  void invert();
  void clear();
  /// radius_px > 0 grows, < 0 shrinks.
  void grow(int radius_px);
  void feather(double radius_px);
  /// Replaces the whole mask (one undoable command). `mask` is converted to Grayscale8 and
  /// must have the document's size.
  bool replace(const QImage& mask, QString* error = nullptr);

  /// Loads a mask image (any format Qt reads; colour is converted to grey) of the document's
  /// size, as one undoable command. On failure returns false and says why in *error.
  bool load(const QString& path, QString* error);
  /// Saves the mask as an 8-bit grey PNG.
  bool save(const QString& path, QString* error) const;

  /// Sets the pixels inside `rect` from `pixels` (rect's size). Used by the undo commands.
  void setRegion(QRect rect, const QImage& pixels);

 signals:
  /// Pixels inside `rect` changed (while drawing, by a command, by undo / redo).
  void maskChanged(QRect rect);
  /// A user edit finished (stroke released, a tool applied): live mode starts from here.
  void editCommitted();

 private:
  void pushChange(QRect rect, const QImage& before, const QString& text);
  void applyWholeMaskOp(const QString& text, const std::function<void(QImage&)>& op);

  QUndoStack* undo_;
  QImage mask_;
  // The stroke in progress: the mask at its start, its coverage, its extent.
  bool stroke_active_ = false;
  bool stroke_erase_ = false;
  BrushShape stroke_brush_;
  QPointF stroke_last_;
  QImage stroke_base_;
  QImage stroke_coverage_;
  QRect stroke_rect_;
};

}  // namespace infill::ui
