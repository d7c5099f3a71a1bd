// The editor and the engine's lifetime and models, against real engine processes on private
// sockets: the model chosen in the parameters panel is the one the engine runs the edit on;
// an engine killed mid-session (SIGKILL) and started again is reconnected on its own, the
// image is uploaded again and Generate works; the engine the editor started is started again
// when it dies; a manual Connect ends the automatic loop.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <QDir>
#include <QElapsedTimer>
#include <QFileInfo>
#include <QJsonDocument>
#include <QJsonObject>
#include <QProcess>
#include <QTemporaryDir>

#include <cmath>
#include <cstring>
#include <string>

#include "tests/ui/ui_test_support.h"
#include "ui/edit_controller.h"
#include "ui/engine_connection.h"
#include "ui/image_io.h"
#include "ui/main_window.h"
#include "ui/mask_document.h"
#include "ui/mask_ops.h"

using infill::test::source_path;
using infill::test::ui_app;
using infill::test::wait_until;
using infill::ui::EditController;
using infill::ui::EngineConnection;
using infill::ui::GenerationResult;
using infill::ui::MaskDocument;

namespace {

// build/<preset>/app/infill-engine -> build/<preset>/models/infill-random
QString build_random_model() {
  return QFileInfo(QStringLiteral(INFILL_ENGINE_PATH)).dir().absoluteFilePath(QStringLiteral("../models/infill-random"));
}

// GET `target` over the engine's Unix socket; the JSON body, or an empty object.
QJsonObject engine_get(const QString& socket_path, const std::string& target) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const QByteArray path = socket_path.toLocal8Bit();
  std::strncpy(addr.sun_path, path.constData(), sizeof addr.sun_path - 1);
  std::string raw;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    const std::string req = "GET " + target + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size())) {
      char buf[4096];
      ssize_t n = 0;
      while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) raw.append(buf, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  const size_t body = raw.find("\r\n\r\n");
  if (body == std::string::npos) return {};
  return QJsonDocument::fromJson(QByteArray::fromStdString(raw.substr(body + 4))).object();
}

// An engine process the test owns, on the socket of `options.endpoint`.
struct EngineProcess {
  QProcess process;
  ~EngineProcess() { kill(); }
  bool start(const infill::ui::EngineOptions& options) {
    process.setProcessChannelMode(QProcess::ForwardedErrorChannel);
    QStringList args = options.engine_arguments;
    args << QStringLiteral("--socket") << options.endpoint.mid(5);
    process.start(options.engine_program, args);
    return process.waitForStarted(10000);
  }
  void kill() {
    if (process.state() == QProcess::NotRunning) return;
    ::kill(static_cast<pid_t>(process.processId()), SIGKILL);
    process.waitForFinished(10000);
  }
};

// Pixels of `out` that differ from `image` inside / outside the mask grown by the feather.
std::pair<int, int> changed_pixels(const QImage& image, const QImage& out, const QImage& mask, double feather_px) {
  QImage reach = mask.copy();
  infill::ui::grow_mask(reach, static_cast<int>(std::ceil(3 * feather_px)) + 1);
  int inside = 0, outside = 0;
  for (int y = 0; y < out.height(); ++y) {
    const QRgb* a = reinterpret_cast<const QRgb*>(image.constScanLine(y));
    const QRgb* b = reinterpret_cast<const QRgb*>(out.constScanLine(y));
    for (int x = 0; x < out.width(); ++x) {
      if (a[x] == b[x]) continue;
      (reach.constScanLine(y)[x] > 0 ? inside : outside) += 1;
    }
  }
  return {inside, outside};
}

struct Editing {
  MaskDocument mask;
  EngineConnection* engine;
  EditController controller;
  QImage image;
  std::vector<GenerationResult> results;
  QStringList messages;
  int errors = 0;

  explicit Editing(EngineConnection* e) : engine(e), controller(e, &mask) {
    QObject::connect(&controller, &EditController::resultArrived, [this](const GenerationResult& r) { results.push_back(r); });
    QObject::connect(&controller, &EditController::message, [this](const QString& m, bool error) {
      messages << m;
      errors += error ? 1 : 0;
    });
  }
  void open(const QString& relative) {
    const QString path = source_path(relative);
    const infill::ui::LoadedImage loaded = infill::ui::load_image(path);
    image = loaded.image;
    REQUIRE_FALSE(image.isNull());
    mask.reset(image.size());
    mask.fillRect(QRectF(80, 80, 64, 48));
    controller.setImage(image, loaded.file, path);
  }
  // Generate once; the result, which must differ from the image only inside the mask.
  void generate_and_check(int steps) {
    infill::ui::GenerationParams p = controller.parameters();
    p.steps = steps;
    p.seed = 5;
    p.feather_px = 4;
    controller.setParameters(p);
    const size_t before = results.size();
    const int errors_before = errors;
    REQUIRE(controller.generate());
    // (Generate may first upload the image again: busy() only turns true once it submits.)
    REQUIRE(wait_until([&] { return results.size() > before || errors > errors_before; }, 120000));
    INFO(messages.join(QStringLiteral(" | ")).toStdString());
    REQUIRE(results.size() == before + 1);
    const QImage& out = results.back().image;
    REQUIRE(out.size() == image.size());
    const auto [inside, outside] = changed_pixels(image, out, mask.mask(), p.feather_px);
    CHECK(outside == 0);
    CHECK(inside > 100);
  }
};

}  // namespace

TEST_CASE("The model selected in the parameters panel is the one the engine runs the edit on", "[ui][engine][models]") {
  ui_app();
  if (!QFileInfo::exists(build_random_model() + QStringLiteral("/manifest.json"))) {
    WARN("the build's random model is missing at " << build_random_model().toStdString());
    return;
  }
  QTemporaryDir dir;
  infill::ui::EngineOptions o = infill::test::test_engine_options(dir);
  o.engine_arguments << QStringLiteral("--model") << build_random_model();  // infill-tiny stays first: the default
  infill::ui::MainWindow window;
  window.connectEngine(o);
  REQUIRE(wait_until([&] {
    const auto s = window.engine()->state();
    return s == EngineConnection::State::Connected || s == EngineConnection::State::Failed;
  }, 150000));
  INFO(window.engine()->stateMessage().toStdString());
  REQUIRE(window.engine()->state() == EngineConnection::State::Connected);
  const auto& models = window.engine()->models();
  REQUIRE(models.size() == 2);
  CHECK(models[0].name == QStringLiteral("infill-tiny"));
  const QString second = models[1].id;
  CHECK(window.parameters()->selectedModelId() == models[0].id);
  REQUIRE(window.parameters()->selectModel(second));
  CHECK(window.controller()->parameters().model_id == second);  // paramsChanged reached the controller

  quint64 edit_id = 0;
  QObject::connect(window.engine(), &EngineConnection::editAccepted, [&](quint64, quint64 id) { edit_id = id; });
  std::vector<GenerationResult> results;
  QObject::connect(window.controller(), &EditController::resultArrived, [&](const GenerationResult& r) { results.push_back(r); });
  REQUIRE(window.openImage(source_path(QStringLiteral("resources/jobs/hills_256.png"))));
  window.maskDocument()->fillRect(QRectF(64, 64, 64, 64));
  infill::ui::GenerationParams p = window.parameters()->params();
  p.steps = 4;
  window.controller()->setParameters(p);
  REQUIRE(window.controller()->generate());
  REQUIRE(wait_until([&] { return !results.empty(); }, 120000));
  REQUIRE(edit_id != 0);
  const QJsonObject status = engine_get(o.endpoint.mid(5), "/v1/edits/" + std::to_string(edit_id));
  INFO(QJsonDocument(status).toJson().toStdString());
  CHECK(status.value(QStringLiteral("state")).toString() == QStringLiteral("done"));
  CHECK(status.value(QStringLiteral("model")).toString() == second);
}

TEST_CASE("An engine killed mid-session and started again is reconnected on its own and Generate works",
          "[ui][engine][reconnect]") {
  ui_app();
  QTemporaryDir dir;
  infill::ui::EngineOptions o = infill::test::test_engine_options(dir);
  EngineProcess first;
  REQUIRE(first.start(o));
  infill::ui::EngineOptions connect_only = o;
  connect_only.auto_start = false;  // the test owns the engine
  EngineConnection engine;
  REQUIRE(wait_until([&] {
    if (engine.state() == EngineConnection::State::Connected) return true;
    if (engine.state() != EngineConnection::State::Connecting) engine.connectToEngine(connect_only);
    return false;
  }, 120000));
  Editing e(&engine);
  e.open(QStringLiteral("resources/jobs/hills_256.png"));
  REQUIRE(wait_until([&] { return !e.controller.templateId().isEmpty(); }, 30000));
  const QString template_id = e.controller.templateId();

  // An edit in flight when the engine dies ends with a clear message, not silently.
  infill::ui::GenerationParams long_edit;
  long_edit.steps = 200;
  e.controller.setParameters(long_edit);
  int progress = 0;
  QObject::connect(&e.controller, &EditController::progressChanged, [&](int, int, double) { ++progress; });
  REQUIRE(e.controller.generate());
  REQUIRE(wait_until([&] { return progress > 0; }, 60000));

  first.kill();
  QElapsedTimer clock;
  clock.start();
  int loop_turns = 0;
  REQUIRE(wait_until([&] {
    ++loop_turns;
    return engine.state() == EngineConnection::State::Reconnecting;
  }, 15000));
  CHECK(engine.stateMessage().contains(QStringLiteral("reconnecting")));
  CHECK(e.controller.templateId().isEmpty());  // to be uploaded again
  // Attempts go on with backoff while nothing answers, and the GUI thread stays free.
  REQUIRE(wait_until([&] {
    ++loop_turns;
    return engine.reconnectAttempts() >= 2;
  }, 15000));
  CHECK(engine.state() == EngineConnection::State::Reconnecting);
  // More than one turn per 100 ms on average (the two attempts take over a second): a fixed
  // count of turns would depend on how fast a busy machine turns the loop meanwhile.
  INFO("loop turns: " << loop_turns << " in " << clock.elapsed() << " ms");
  CHECK(loop_turns > clock.elapsed() / 100);

  EngineProcess second;
  REQUIRE(second.start(o));
  REQUIRE(wait_until([&] { return engine.state() == EngineConnection::State::Connected; }, 120000));
  CHECK(engine.stateMessage().contains(QStringLiteral("Reconnected")));
  // The image is uploaded again (same bytes, same id) without the user doing anything.
  REQUIRE(wait_until([&] { return !e.controller.templateId().isEmpty(); }, 30000));
  CHECK(e.controller.templateId() == template_id);
  // The edit that was running ended, saying the engine went away.
  REQUIRE(wait_until([&] { return !e.controller.busy(); }, 30000));
  CHECK(e.messages.join(QStringLiteral("\n")).contains(QStringLiteral("engine went away")));

  e.generate_and_check(4);

  // A manual Connect ends the automatic loop: kill again, then connect somewhere else.
  second.kill();
  REQUIRE(wait_until([&] { return engine.state() == EngineConnection::State::Reconnecting; }, 15000));
  infill::ui::EngineOptions nowhere;
  nowhere.endpoint = QStringLiteral("unix:") + dir.filePath(QStringLiteral("nobody.sock"));
  nowhere.auto_start = false;
  engine.connectToEngine(nowhere);
  REQUIRE(wait_until([&] { return engine.state() == EngineConnection::State::Failed; }, 15000));
  infill::test::pump(2500);
  CHECK(engine.state() == EngineConnection::State::Failed);
  CHECK(engine.reconnectAttempts() == 0);
}

TEST_CASE("The engine the editor started is started again when it is killed", "[ui][engine][reconnect]") {
  ui_app();
  QTemporaryDir dir;
  EngineConnection engine;
  engine.connectToEngine(infill::test::test_engine_options(dir));
  REQUIRE(wait_until([&] {
    return engine.state() == EngineConnection::State::Connected || engine.state() == EngineConnection::State::Failed;
  }, 150000));
  INFO(engine.stateMessage().toStdString());
  REQUIRE(engine.state() == EngineConnection::State::Connected);
  REQUIRE(engine.startedEngine());
  Editing e(&engine);
  e.open(QStringLiteral("resources/jobs/dusk_256.png"));
  REQUIRE(wait_until([&] { return !e.controller.templateId().isEmpty(); }, 30000));

  const qint64 pid = engine.engineProcessId();
  REQUIRE(pid > 0);
  ::kill(static_cast<pid_t>(pid), SIGKILL);
  REQUIRE(wait_until([&] { return engine.state() == EngineConnection::State::Reconnecting; }, 15000));
  REQUIRE(wait_until([&] { return engine.state() == EngineConnection::State::Connected; }, 120000));
  INFO(engine.stateMessage().toStdString());
  CHECK(engine.engineProcessId() > 0);
  CHECK(engine.engineProcessId() != pid);
  CHECK(engine.stateMessage().contains(QStringLiteral("restarted by the editor")));
  REQUIRE(wait_until([&] { return !e.controller.templateId().isEmpty(); }, 30000));
  e.generate_and_check(4);
}
