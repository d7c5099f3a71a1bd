#pragma once
// Shared by the editor's tests: one QApplication per test process (offscreen unless the run
// chose a platform, e.g. xcb under xvfb-run), a private settings folder, event-loop waits,
// and where the engine binary and the bundled model are.
#include <QApplication>
#include <QCoreApplication>
#include <QDir>
#include <QElapsedTimer>
#include <QImage>
#include <QTemporaryDir>
#include <QThread>

#include <functional>

namespace infill::test {

inline QApplication& ui_app() {
  static QTemporaryDir config_dir;
  static int argc = 1;
  static char name[] = "infill_tests_ui";
  static char* argv[] = {name, nullptr};
  static QApplication* app = [] {
    // ctest runs these headless; a run under xvfb-run sets QT_QPA_PLATFORM=xcb itself.
    if (qEnvironmentVariableIsEmpty("QT_QPA_PLATFORM")) qputenv("QT_QPA_PLATFORM", "offscreen");
    // Recent files and other settings go to a throw-away folder, never the user's.
    qputenv("XDG_CONFIG_HOME", config_dir.path().toLocal8Bit());
    auto* a = new QApplication(argc, argv);
    QCoreApplication::setOrganizationName(QStringLiteral("infill-tests"));
    QCoreApplication::setApplicationName(QStringLiteral("infill-tests"));
    return a;
  }();
  return *app;
}

/// Runs the event loop until `done()` or `timeout_ms`; returns done().
inline bool wait_until(const std::function<bool()>& done, int timeout_ms) {
  QElapsedTimer clock;
  clock.start();
  while (!done() && clock.elapsed() < timeout_ms) {
    QCoreApplication::processEvents(QEventLoop::AllEvents, 20);
    QThread::msleep(2);
  }
  return done();
}

/// Runs the event loop for `ms`.
inline void pump(int ms) {
  wait_until([] { return false; }, ms);
}

inline QString source_path(const QString& relative) {
  return QDir(QStringLiteral(INFILL_SOURCE_DIR)).filePath(relative);
}

/// Number of pixels where two same-sized Grayscale8 images differ.
inline int differing_pixels(const QImage& a, const QImage& b) {
  int n = 0;
  for (int y = 0; y < a.height(); ++y) {
    const uchar* ra = a.constScanLine(y);
    const uchar* rb = b.constScanLine(y);
    for (int x = 0; x < a.width(); ++x) n += ra[x] != rb[x];
  }
  return n;
}

}  // namespace infill::test

#include <QFile>

#include "ui/engine_connection.h"

namespace infill::test {

/// Options that make the editor start its own engine for a test: the build's infill-engine,
/// the bundled model, a socket in `dir`, no journal, no calibration, an empty config (so a
/// config installed on the machine does not change the run).
inline infill::ui::EngineOptions test_engine_options(const QTemporaryDir& dir) {
  const QString config = dir.filePath(QStringLiteral("engine.json"));
  QFile f(config);
  if (f.open(QIODevice::WriteOnly)) f.write("{}");
  infill::ui::EngineOptions o;
  o.endpoint = QStringLiteral("unix:") + dir.filePath(QStringLiteral("engine.sock"));
  o.auto_start = true;
  o.engine_program = QStringLiteral(INFILL_ENGINE_PATH);
  o.engine_arguments = {QStringLiteral("--config"), config,
                        QStringLiteral("--model"), source_path(QStringLiteral("resources/models/infill-tiny")),
                        QStringLiteral("--journal"), QStringLiteral("off"),
                        QStringLiteral("--no-calibrate")};
  o.ready_timeout_ms = 120000;
  return o;
}

}  // namespace infill::test
