// The mask document and its tools: strokes change the mask where drawn and nowhere else,
// every change is one undo step that restores the pixels exactly, tools behave as named.
#include <catch2/catch.hpp>

#include <QTemporaryDir>

#include <cmath>
#include <vector>

#include "tests/ui/ui_test_support.h"
#include "ui/mask_document.h"

using infill::test::differing_pixels;
using infill::test::ui_app;
using infill::ui::BrushShape;
using infill::ui::MaskDocument;

namespace {

double distance_to_segment(QPointF p, QPointF a, QPointF b) {
  const QPointF ab = b - a, ap = p - a;
  const double len2 = QPointF::dotProduct(ab, ab);
  const double t = len2 > 0 ? std::clamp(QPointF::dotProduct(ap, ab) / len2, 0.0, 1.0) : 0.0;
  const QPointF d = p - (a + ab * t);
  return std::hypot(d.x(), d.y());
}

int count_nonzero(const QImage& m) {
  int n = 0;
  for (int y = 0; y < m.height(); ++y)
    for (int x = 0; x < m.width(); ++x) n += m.constScanLine(y)[x] != 0;
  return n;
}

}  // namespace

TEST_CASE("A brush stroke paints along its path and nowhere else and undo restores it exactly", "[ui][mask]") {
  ui_app();
  MaskDocument doc;
  doc.reset(QSize(120, 90));
  const QImage blank = doc.mask().copy();
  const BrushShape brush{12.0, 0.5};
  const QPointF a(20, 30), b(90, 60);
  int committed = 0;
  QObject::connect(&doc, &MaskDocument::editCommitted, [&] { ++committed; });

  doc.beginStroke(a, brush, false);
  for (int i = 1; i <= 10; ++i) doc.continueStroke(a + (b - a) * (i / 10.0));
  doc.endStroke();
  CHECK(committed == 1);
  CHECK(doc.undoStack()->count() == 1);

  const QImage& m = doc.mask();
  const double r = brush.size_px / 2;
  int painted = 0;
  for (int y = 0; y < m.height(); ++y) {
    for (int x = 0; x < m.width(); ++x) {
      const double d = distance_to_segment(QPointF(x + 0.5, y + 0.5), a, b);
      const int v = m.constScanLine(y)[x];
      if (d >= r) REQUIRE(v == 0);                       // nothing outside the brush's reach
      if (d <= r * brush.hardness) REQUIRE(v == 255);    // the hard core is fully painted
      painted += v != 0;
    }
  }
  CHECK(painted > 500);
  const QImage after_stroke = m.copy();

  doc.undoStack()->undo();
  CHECK(doc.mask() == blank);
  doc.undoStack()->redo();
  CHECK(doc.mask() == after_stroke);

  // A second stroke, then undo: exactly the state after the first.
  doc.beginStroke(QPointF(100, 10), brush, false);
  doc.continueStroke(QPointF(100, 80));
  doc.endStroke();
  CHECK(differing_pixels(doc.mask(), after_stroke) > 0);
  doc.undoStack()->undo();
  CHECK(doc.mask() == after_stroke);
}

TEST_CASE("The eraser removes only under its path", "[ui][mask]") {
  ui_app();
  MaskDocument doc;
  doc.reset(QSize(100, 100));
  doc.fillRect(QRectF(10, 10, 80, 80));
  const QImage filled = doc.mask().copy();
  const BrushShape brush{10.0, 1.0};
  doc.beginStroke(QPointF(50, 0), brush, true);
  doc.continueStroke(QPointF(50, 99));
  doc.endStroke();
  const QImage& m = doc.mask();
  for (int y = 0; y < 100; ++y) {
    for (int x = 0; x < 100; ++x) {
      const double d = std::abs(x + 0.5 - 50.0);
      const int before = filled.constScanLine(y)[x];
      const int now = m.constScanLine(y)[x];
      if (d >= 5.0) REQUIRE(now == before);
      if (d <= 4.0 && y > 2 && y < 97) REQUIRE(now == 0);
    }
  }
  doc.undoStack()->undo();
  CHECK(doc.mask() == filled);
}

TEST_CASE("Rectangle and lasso fill inside only and subtract clears", "[ui][mask]") {
  ui_app();
  MaskDocument doc;
  doc.reset(QSize(64, 48));
  doc.fillRect(QRectF(QPointF(30, 20), QPointF(10, 5)));  // any corner order
  for (int y = 0; y < 48; ++y)
    for (int x = 0; x < 64; ++x) {
      const bool inside = x >= 10 && x < 30 && y >= 5 && y < 20;
      REQUIRE(doc.mask().constScanLine(y)[x] == (inside ? 255 : 0));
    }
  doc.fillRect(QRectF(10, 5, 10, 15), true);
  CHECK(count_nonzero(doc.mask()) == 10 * 15);

  doc.clear();
  QPolygonF triangle;
  triangle << QPointF(5, 40) << QPointF(60, 40) << QPointF(32, 4);
  doc.fillPolygon(triangle);
  CHECK(doc.mask().pixel(32, 30) != qRgb(0, 0, 0));
  CHECK(doc.mask().constScanLine(30)[32] == 255);
  CHECK(doc.mask().constScanLine(45)[32] == 0);
  CHECK(doc.mask().constScanLine(5)[5] == 0);
  CHECK(doc.mask().constScanLine(5)[60] == 0);
}

TEST_CASE("Invert clear grow shrink and feather are each one undo step restoring exactly", "[ui][mask]") {
  ui_app();
  MaskDocument doc;
  doc.reset(QSize(80, 60));
  doc.fillRect(QRectF(30, 20, 20, 20));
  std::vector<QImage> states{doc.mask().copy()};

  doc.grow(3);
  CHECK(infill::ui::mask_bounds(doc.mask()) == QRect(27, 17, 26, 26));
  states.push_back(doc.mask().copy());
  doc.grow(-3);
  CHECK(doc.mask() == states[0]);  // square dilation then erosion of a square: the same square
  states.push_back(doc.mask().copy());
  doc.feather(4);
  const QImage& f = doc.mask();
  CHECK(f.constScanLine(30)[40] == 255);  // the centre stays
  CHECK(f.constScanLine(30)[30] > 0);
  CHECK(f.constScanLine(30)[30] < 255);   // the edge ramps
  CHECK(f.constScanLine(30)[27] > 0);     // and reaches outside
  CHECK(f.constScanLine(5)[5] == 0);
  states.push_back(doc.mask().copy());
  doc.invert();
  for (int y = 0; y < 60; ++y)
    for (int x = 0; x < 80; ++x) REQUIRE(doc.mask().constScanLine(y)[x] == 255 - states.back().constScanLine(y)[x]);
  states.push_back(doc.mask().copy());
  doc.clear();
  CHECK(doc.isEmpty());

  // Walk back through every step.
  for (auto it = states.rbegin(); it != states.rend(); ++it) {
    doc.undoStack()->undo();
    REQUIRE(doc.mask() == *it);
  }
}

TEST_CASE("A no-op tool leaves no history entry", "[ui][mask]") {
  ui_app();
  MaskDocument doc;
  doc.reset(QSize(16, 16));
  doc.clear();
  doc.grow(2);
  CHECK(doc.undoStack()->count() == 0);
}

TEST_CASE("Masks load and save as PNG and a mask of the wrong size is refused naming both sizes", "[ui][mask]") {
  ui_app();
  QTemporaryDir dir;
  MaskDocument doc;
  doc.reset(QSize(40, 30));
  doc.beginStroke(QPointF(5, 5), BrushShape{8, 0.3}, false);
  doc.continueStroke(QPointF(35, 25));
  doc.endStroke();
  const QImage drawn = doc.mask().copy();
  QString error;
  const QString path = dir.filePath(QStringLiteral("mask.png"));
  REQUIRE(doc.save(path, &error));
  doc.clear();
  REQUIRE(doc.load(path, &error));
  CHECK(doc.mask() == drawn);
  doc.undoStack()->undo();
  CHECK(doc.isEmpty());

  QImage small(20, 30, QImage::Format_Grayscale8);
  small.fill(255);
  const QString small_path = dir.filePath(QStringLiteral("small.png"));
  REQUIRE(small.save(small_path));
  CHECK_FALSE(doc.load(small_path, &error));
  CHECK(error.contains(QStringLiteral("20x30")));
  CHECK(error.contains(QStringLiteral("40x30")));
  CHECK_FALSE(doc.load(dir.filePath(QStringLiteral("missing.png")), &error));
  CHECK(error.contains(QStringLiteral("missing.png")));
}
