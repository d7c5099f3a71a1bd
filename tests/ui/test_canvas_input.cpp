// Pointer and keyboard input on the canvas: synthetic mouse events paint where the pointer
// went, tools switch by shortcut, space-drag pans, the wheel zooms around the pointer.
#include <catch2/catch.hpp>

#include <QKeyEvent>
#include <QMouseEvent>
#include <QWheelEvent>

#include "tests/ui/ui_test_support.h"
#include "ui/canvas_view.h"
#include "ui/main_window.h"

using infill::test::ui_app;
using infill::ui::CanvasView;
using infill::ui::MaskDocument;

namespace {

void mouse(QWidget* w, QEvent::Type type, QPointF pos, Qt::MouseButton button, Qt::MouseButtons buttons,
           Qt::KeyboardModifiers mods = Qt::NoModifier) {
  QMouseEvent e(type, pos, w->mapToGlobal(pos), button, buttons, mods);
  QCoreApplication::sendEvent(w, &e);
}

// Drags with the left button through image-space points.
void drag(CanvasView* c, const std::vector<QPointF>& image_points, Qt::KeyboardModifiers mods = Qt::NoModifier) {
  mouse(c, QEvent::MouseButtonPress, c->toWidget(image_points.front()), Qt::LeftButton, Qt::LeftButton, mods);
  for (size_t i = 1; i < image_points.size(); ++i)
    mouse(c, QEvent::MouseMove, c->toWidget(image_points[i]), Qt::NoButton, Qt::LeftButton, mods);
  mouse(c, QEvent::MouseButtonRelease, c->toWidget(image_points.back()), Qt::LeftButton, Qt::NoButton, mods);
}

QImage test_image(int w, int h) {
  QImage image(w, h, QImage::Format_RGBA8888);
  image.fill(QColor(90, 120, 150));
  return image;
}

}  // namespace

TEST_CASE("Mouse strokes on the canvas paint the mask under the pointer only with one undo step each", "[ui][canvas]") {
  ui_app();
  MaskDocument doc;
  doc.reset(QSize(200, 100));
  CanvasView canvas(&doc);
  canvas.resize(400, 200);
  canvas.setImage(test_image(200, 100));
  canvas.actualSize();
  canvas.setBrush(infill::ui::BrushShape{10, 1.0});

  drag(&canvas, {QPointF(20, 50), QPointF(60, 50), QPointF(100, 50)});
  CHECK(doc.undoStack()->count() == 1);
  const QRect painted = infill::ui::mask_bounds(doc.mask());
  CHECK(painted.left() >= 14);
  CHECK(painted.right() <= 105);
  CHECK(painted.top() >= 44);
  CHECK(painted.bottom() <= 55);
  CHECK(doc.mask().constScanLine(50)[60] == 255);
  CHECK(doc.mask().constScanLine(20)[60] == 0);

  // Eraser through the middle.
  canvas.setTool(CanvasView::Tool::Eraser);
  drag(&canvas, {QPointF(60, 30), QPointF(60, 70)});
  CHECK(doc.mask().constScanLine(50)[60] == 0);
  CHECK(doc.mask().constScanLine(50)[30] == 255);
  doc.undoStack()->undo();
  CHECK(doc.mask().constScanLine(50)[60] == 255);

  // Rectangle, and Alt-rectangle to subtract.
  canvas.setTool(CanvasView::Tool::Rectangle);
  drag(&canvas, {QPointF(150, 10), QPointF(170, 20), QPointF(190, 40)});
  CHECK(doc.mask().constScanLine(25)[170] == 255);
  CHECK(doc.mask().constScanLine(45)[170] == 0);
  drag(&canvas, {QPointF(150, 10), QPointF(170, 25)}, Qt::AltModifier);
  CHECK(doc.mask().constScanLine(15)[160] == 0);
  CHECK(doc.mask().constScanLine(35)[180] == 255);

  // Lasso.
  canvas.setTool(CanvasView::Tool::Lasso);
  doc.clear();
  drag(&canvas, {QPointF(10, 10), QPointF(50, 10), QPointF(50, 50), QPointF(10, 50)});
  CHECK(doc.mask().constScanLine(30)[30] == 255);
  CHECK(doc.mask().constScanLine(70)[30] == 0);
}

TEST_CASE("Zoom follows the wheel around the pointer and space-drag pans without painting", "[ui][canvas]") {
  ui_app();
  MaskDocument doc;
  doc.reset(QSize(300, 200));
  CanvasView canvas(&doc);
  canvas.resize(600, 400);
  canvas.setImage(test_image(300, 200));
  canvas.fitToWindow();
  CHECK(canvas.zoom() == Approx(0.95 * 2.0));

  const QPointF pointer(300, 200);
  const QPointF under = canvas.toImage(pointer);
  QWheelEvent wheel(pointer, canvas.mapToGlobal(pointer), QPoint(), QPoint(0, 120), Qt::NoButton, Qt::NoModifier,
                    Qt::NoScrollPhase, false);
  QCoreApplication::sendEvent(&canvas, &wheel);
  CHECK(canvas.zoom() == Approx(0.95 * 2.0 * 1.25));
  CHECK(canvas.toImage(pointer).x() == Approx(under.x()));
  CHECK(canvas.toImage(pointer).y() == Approx(under.y()));

  canvas.actualSize();
  CHECK(canvas.zoom() == 1.0);

  // Space held: a left drag pans instead of painting.
  const QPointF before = canvas.toWidget(QPointF(0, 0));
  QKeyEvent space_down(QEvent::KeyPress, Qt::Key_Space, Qt::NoModifier, QStringLiteral(" "));
  QCoreApplication::sendEvent(&canvas, &space_down);
  mouse(&canvas, QEvent::MouseButtonPress, QPointF(100, 100), Qt::LeftButton, Qt::LeftButton);
  mouse(&canvas, QEvent::MouseMove, QPointF(130, 80), Qt::NoButton, Qt::LeftButton);
  mouse(&canvas, QEvent::MouseButtonRelease, QPointF(130, 80), Qt::LeftButton, Qt::NoButton);
  QKeyEvent space_up(QEvent::KeyRelease, Qt::Key_Space, Qt::NoModifier, QStringLiteral(" "));
  QCoreApplication::sendEvent(&canvas, &space_up);
  CHECK(canvas.toWidget(QPointF(0, 0)) == before + QPointF(30, -20));
  CHECK(doc.isEmpty());
  CHECK(doc.undoStack()->count() == 0);
}

TEST_CASE("Painter shortcuts B E X brackets and Ctrl+Z", "[ui][canvas]") {
  ui_app();
  infill::ui::MainWindow window;
  window.show();
  QImage image = test_image(64, 64);
  window.maskDocument()->reset(image.size());
  window.canvas()->setImage(image);
  window.canvas()->setFocus();
  auto key = [&](int k, Qt::KeyboardModifiers mods = Qt::NoModifier) {
    for (QAction* a : window.actions()) {
      if (a->isEnabled() && a->shortcuts().contains(QKeySequence(k | mods))) {
        a->trigger();
        return true;
      }
    }
    return false;
  };
  REQUIRE(key(Qt::Key_E));
  CHECK(window.canvas()->tool() == CanvasView::Tool::Eraser);
  REQUIRE(key(Qt::Key_X));
  CHECK(window.canvas()->tool() == CanvasView::Tool::Brush);
  REQUIRE(key(Qt::Key_X));
  CHECK(window.canvas()->tool() == CanvasView::Tool::Eraser);
  REQUIRE(key(Qt::Key_B));
  CHECK(window.canvas()->tool() == CanvasView::Tool::Brush);
  const double size = window.canvas()->brush().size_px;
  REQUIRE(key(Qt::Key_BracketRight));
  CHECK(window.canvas()->brush().size_px > size);
  REQUIRE(key(Qt::Key_BracketLeft));
  REQUIRE(key(Qt::Key_BracketLeft));
  CHECK(window.canvas()->brush().size_px < size);

  window.maskDocument()->fillRect(QRectF(8, 8, 16, 16));
  CHECK_FALSE(window.maskDocument()->isEmpty());
  REQUIRE(key(Qt::Key_Z, Qt::ControlModifier));
  CHECK(window.maskDocument()->isEmpty());
}
