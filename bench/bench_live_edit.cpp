// bench_live_edit: the editor's live mode against a real engine, as a painter meets it. Starts
// infill-engine (the bundled infill-tiny) on a private Unix socket through the editor's own
// auto-start, opens a 512x512 template in the real MainWindow (offscreen unless
// QT_QPA_PLATFORM says otherwise), turns live mode on and paints strokes with synthetic mouse
// events on the canvas. The mask is cleared before each stroke, so each edit covers about
// --mask-ratio of the image. For every stroke it times, from the mouse release: the first
// preview handed to the canvas and the final result, waiting for the result before the next
// stroke. A few warm-up strokes come first (the first one makes the engine prepare the
// template); the engine must report the template prepared before the timed strokes.
// Prints one JSON document on stdout; progress goes to stderr. Exit 1 when the engine cannot
// be started or a stroke gets no result, 2 on bad arguments.
//
//   bench_live_edit [--strokes N] [--warmup N] [--mask-ratio R] [--debounce-ms MS]
//                   [--steps N] [--guidance G] [--prompt TEXT] [--pause-ms MS] [--model DIR]
//
// Steps and guidance default to what the parameters panel gives (the model's defaults), the
// debounce to the editor's.

// First: libtorch's headers must not see Qt's keyword macros (signals, slots, emit).
#include "common/blas_kernel.h"
#include "bench_stats.h"
#include "machine_info.h"

#include <QAction>
#include <QEventLoop>
#include <QFileInfo>
#include <QGuiApplication>
#include <QLineEdit>
#include <QMouseEvent>
#include <QProcess>
#include <QTemporaryDir>
#include <QTimer>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/ui/ui_test_support.h"
#include "ui/main_window.h"

using json = nlohmann::json;
using infill::ui::EngineConnection;

namespace {

constexpr int kImageSize = 512;
constexpr double kFirstPreviewTargetMs = 300.0;
constexpr double kFinalResultTargetMs = 1500.0;
constexpr int kResultTimeoutMs = 180000;
constexpr double kStrokeSpacingPx = 8.0;  // between pointer moves, in image pixels

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

struct Options {
  int strokes = 20;
  int warmup = 2;
  double mask_ratio = 0.1;
  int debounce_ms = -1;  // < 0 = the editor's default
  int steps = 0;         // 0 = the panel's (the model's default)
  double guidance = 0;   // 0 = the panel's
  QString prompt = QStringLiteral("green bright");
  int pause_ms = 300;
  QString model;  // "" = resources/models/infill-tiny
};

int usage(const std::string& why) {
  std::cerr
      << "bench_live_edit: " << why << "\n"
      << "usage: bench_live_edit [--strokes N] [--warmup N] [--mask-ratio R] [--debounce-ms MS]\n"
      << "                       [--steps N] [--guidance G] [--prompt TEXT] [--pause-ms MS] "
         "[--model DIR]\n";
  return 2;
}

// The window and the folder of its engine's socket. die() ends them before exiting: the
// window's EngineConnection stops the engine it started, which would otherwise outlive us.
struct Session {
  QTemporaryDir dir;
  std::unique_ptr<infill::ui::MainWindow> window;
};
std::unique_ptr<Session> g_session;

[[noreturn]] void die(const std::string& message) {
  std::cerr << "bench_live_edit: error: " << message << std::endl;
  g_session.reset();
  std::exit(1);
}

std::optional<Options> parse(int argc, char** argv, std::string& error) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") return std::nullopt;
    if (i + 1 >= argc) {
      error = "option " + a + " is unknown or lacks its value";
      return std::nullopt;
    }
    const char* v = argv[++i];
    char* end = nullptr;
    auto as_int = [&](int lo, int hi, int& out) {
      const long x = std::strtol(v, &end, 10);
      if (end == v || *end != '\0' || x < lo || x > hi) {
        error = a + " is " + v + ", expected " + std::to_string(lo) + ".." + std::to_string(hi);
        return false;
      }
      out = static_cast<int>(x);
      return true;
    };
    auto as_double = [&](double lo, double hi, double& out) {
      const double x = std::strtod(v, &end);
      if (end == v || *end != '\0' || !(x >= lo && x <= hi)) {
        error = a + " is " + v + ", expected " + std::to_string(lo) + ".." + std::to_string(hi);
        return false;
      }
      out = x;
      return true;
    };
    bool ok = true;
    if (a == "--strokes")
      ok = as_int(1, 10000, o.strokes);
    else if (a == "--warmup")
      ok = as_int(1, 100, o.warmup);
    else if (a == "--mask-ratio")
      ok = as_double(0.01, 0.3, o.mask_ratio);
    else if (a == "--debounce-ms")
      ok = as_int(0, 10000, o.debounce_ms);
    else if (a == "--steps")
      ok = as_int(1, 1000, o.steps);
    else if (a == "--guidance")
      ok = as_double(1.0, 20.0, o.guidance);
    else if (a == "--prompt")
      o.prompt = QString::fromLocal8Bit(v);
    else if (a == "--pause-ms")
      ok = as_int(0, 60000, o.pause_ms);
    else if (a == "--model")
      o.model = QString::fromLocal8Bit(v);
    else {
      error = "option " + a + " is unknown";
      return std::nullopt;
    }
    if (!ok) return std::nullopt;
  }
  return o;
}

// Runs the event loop until done() or `timeout_ms`. Unlike the tests' wait_until, which polls
// with short sleeps, this blocks in the event dispatcher, so a queued signal is handled the
// moment it is posted and its timestamp is not rounded up to a polling period. The check
// timer only decides when to return.
bool run_until(const std::function<bool()>& done, int timeout_ms) {
  if (done()) return true;
  QEventLoop loop;
  QTimer check;
  check.setTimerType(Qt::PreciseTimer);
  QObject::connect(&check, &QTimer::timeout, &loop, [&] {
    if (done()) loop.quit();
  });
  QTimer deadline;
  deadline.setSingleShot(true);
  QObject::connect(&deadline, &QTimer::timeout, &loop, &QEventLoop::quit);
  check.start(5);
  deadline.start(timeout_ms);
  loop.exec();
  return done();
}

void run_for(int ms) {
  run_until([] { return false; }, ms);
}

using infill::bench::percentile;

json summary(const std::vector<double>& v) {
  if (v.empty()) return {{"count", 0}};
  return {{"count", v.size()},
          {"median", percentile(v, 0.5)},
          {"p90", percentile(v, 0.9)},
          {"min", *std::min_element(v.begin(), v.end())},
          {"max", *std::max_element(v.begin(), v.end())}};
}

double mask_ratio(const QImage& mask) {
  int64_t n = 0;
  for (int y = 0; y < mask.height(); ++y) {
    const uchar* row = mask.constScanLine(y);
    for (int x = 0; x < mask.width(); ++x) n += row[x] > 0;
  }
  return double(n) / (double(mask.width()) * mask.height());
}

// A horizontal stroke of `length_px` from `start`, with pointer moves every kStrokeSpacingPx.
std::vector<QPointF> stroke_points(QPointF start, double length_px) {
  std::vector<QPointF> points;
  const int moves = std::max(1, static_cast<int>(std::ceil(length_px / kStrokeSpacingPx)));
  for (int i = 0; i <= moves; ++i)
    points.emplace_back(start.x() + length_px * i / moves, start.y());
  return points;
}

// The length of a stroke starting `margin_px` inside the image whose painted area (pixels > 0)
// is `ratio` of the image, found on a scratch coverage image with the canvas's own dab code.
double length_for_ratio(const infill::ui::BrushShape& brush, double ratio, double margin_px) {
  auto painted = [&](double length) {
    QImage coverage(kImageSize, kImageSize, QImage::Format_Grayscale8);
    coverage.fill(0);
    const std::vector<QPointF> points = stroke_points(QPointF(margin_px, kImageSize / 2.0), length);
    for (size_t i = 0; i + 1 < points.size(); ++i)
      infill::ui::stamp_segment(coverage, brush, points[i], points[i + 1]);
    return mask_ratio(coverage);
  };
  double lo = 0, hi = kImageSize - 2 * margin_px;
  for (int i = 0; i < 30; ++i) {
    const double mid = (lo + hi) / 2;
    (painted(mid) < ratio ? lo : hi) = mid;
  }
  return hi;
}

// `infill-engine --check` with the arguments the editor will start it with: validates the
// model and says how many workers and compute threads the engine will use.
json check_engine(const infill::ui::EngineOptions& o) {
  QProcess p;
  p.start(o.engine_program, QStringList(o.engine_arguments) << QStringLiteral("--check"));
  if (!p.waitForStarted(20000))
    die("cannot run the engine " + o.engine_program.toStdString() + ": " +
        p.errorString().toStdString());
  if (!p.waitForFinished(120000)) die("infill-engine --check did not finish within 120 s");
  const QByteArray out = p.readAllStandardOutput();
  if (p.exitStatus() != QProcess::NormalExit || p.exitCode() != 0)
    die("infill-engine --check failed (exit code " + std::to_string(p.exitCode()) +
        "): " + p.readAllStandardError().trimmed().toStdString());
  json j = json::parse(out.toStdString(), nullptr, false);
  if (j.is_discarded()) die("infill-engine --check printed no JSON: " + out.toStdString());
  return j;
}

// What the signal handlers record for the stroke being timed.
struct StrokeProbe {
  bool active = false;
  Clock::time_point released;
  double accepted_ms = -1, first_step_ms = -1, first_preview_ms = -1, final_ms = -1;
  double engine_ms = 0;
  int previews = 0;
  int steps_run = 0;  // the engine may run fewer than asked to meet the live deadline
  bool done = false;
  QString error;
};

}  // namespace

int main(int argc, char** argv) {
  infill::select_blas_kernel();  // first: before any GEMM (common/blas_kernel.h)
  std::string parse_error;
  const std::optional<Options> parsed = parse(argc, argv, parse_error);
  if (!parsed)
    return usage(parse_error.empty() ? "measures live mode's stroke-end latencies" : parse_error);
  const Options opt = *parsed;

  // The tests' application: offscreen unless QT_QPA_PLATFORM is set, settings (recent files)
  // in a throw-away folder.
  infill::test::ui_app();
  g_session = std::make_unique<Session>();
  const QTemporaryDir& dir = g_session->dir;
  if (!dir.isValid()) die("cannot create a temporary folder: " + dir.errorString().toStdString());
  // The engine as the editor's tests start it: the build's infill-engine, the bundled model,
  // a socket in `dir`, an empty config, no journal, no start-up calibration.
  infill::ui::EngineOptions engine_options = infill::test::test_engine_options(dir);
  QString model_path = infill::test::source_path(QStringLiteral("resources/models/infill-tiny"));
  if (!opt.model.isEmpty()) {
    model_path = opt.model;
    const qsizetype at = engine_options.engine_arguments.indexOf(QStringLiteral("--model"));
    engine_options.engine_arguments[at + 1] = model_path;
  }
  std::cerr << "bench_live_edit: checking " << engine_options.engine_program.toStdString()
            << " with " << model_path.toStdString() << std::endl;
  const json engine_check = check_engine(engine_options);

  g_session->window = std::make_unique<infill::ui::MainWindow>();
  infill::ui::MainWindow& window = *g_session->window;
  window.show();
  EngineConnection* engine = window.engine();
  infill::ui::EditController* controller = window.controller();
  infill::ui::CanvasView* canvas = window.canvas();
  infill::ui::MaskDocument* mask = window.maskDocument();

  std::cerr << "bench_live_edit: starting the engine on " << engine_options.endpoint.toStdString()
            << std::endl;
  window.connectEngine(engine_options);
  run_until(
      [&] {
        return engine->state() == EngineConnection::State::Connected ||
               engine->state() == EngineConnection::State::Failed;
      },
      engine_options.ready_timeout_ms + 30000);
  if (engine->state() != EngineConnection::State::Connected)
    die("the engine could not be started: " + engine->stateMessage().toStdString());
  if (!engine->startedEngine())
    die("an engine other than the one this program started answered on " +
        engine->endpoint().toStdString());

  // The template: the bundled sample, scaled to 512x512 if it ever is another size, written as
  // PNG so the editor opens (and uploads) a file as it would a user's.
  const QString sample =
      infill::test::source_path(QStringLiteral("resources/templates/sample.png"));
  QImage image(sample);
  if (image.isNull()) die("cannot read " + sample.toStdString());
  if (image.size() != QSize(kImageSize, kImageSize))
    image = image.scaled(kImageSize, kImageSize, Qt::IgnoreAspectRatio, Qt::SmoothTransformation);
  const QString template_path = dir.filePath(QStringLiteral("template_512.png"));
  if (!image.save(template_path, "PNG")) die("cannot write " + template_path.toStdString());
  if (!window.openImage(template_path))
    die("the editor cannot open " + template_path.toStdString());
  if (!run_until([&] { return !controller->templateId().isEmpty(); }, 60000))
    die("the engine did not register the template within 60 s");

  bool prepared = false;
  auto note_template = [&](const infill::ui::TemplateStatus& s) {
    if (s.id == controller->templateId() && s.state == INFILL_TEMPLATE_PREPARED) prepared = true;
  };
  QObject::connect(engine, &EngineConnection::templateStatus, note_template);
  QObject::connect(engine, &EngineConnection::templateRegistered,
                   [&](quint64, const infill::ui::TemplateStatus& s) { note_template(s); });

  // Parameters as a painter sets them: the prompt typed in the panel, the model's defaults for
  // the rest unless overridden.
  window.parameters()->promptEdit()->setText(opt.prompt);
  infill::ui::GenerationParams params = controller->parameters();
  if (opt.steps > 0) params.steps = opt.steps;
  if (opt.guidance > 0) params.guidance = opt.guidance;
  controller->setParameters(params);
  if (opt.debounce_ms >= 0) controller->setLiveDebounceMs(opt.debounce_ms);
  QAction* live = window.action(QStringLiteral("live"));
  live->setChecked(true);  // Ctrl+L
  if (!controller->liveMode()) die("the editor's live action did not turn live mode on");

  // A brush wide enough that one horizontal stroke inside the image covers the ratio.
  const infill::ui::BrushShape brush{
      std::clamp(std::round(opt.mask_ratio * kImageSize / 0.7), 8.0, kImageSize / 2.0), 0.8};
  canvas->setBrush(brush);
  const double margin = brush.size_px / 2 + 4;
  const double length = length_for_ratio(brush, opt.mask_ratio, margin);

  StrokeProbe probe;
  QObject::connect(engine, &EngineConnection::editAccepted, [&](quint64, quint64) {
    if (probe.active && probe.accepted_ms < 0) probe.accepted_ms = ms_since(probe.released);
  });
  QObject::connect(engine, &EngineConnection::editProgress, [&](quint64, int, int) {
    if (probe.active && probe.first_step_ms < 0) probe.first_step_ms = ms_since(probe.released);
  });
  // MainWindow connected the canvas first: when this runs, the canvas has the preview.
  QObject::connect(controller, &infill::ui::EditController::previewArrived,
                   [&](const QImage&, const QRect&) {
                     if (!probe.active) return;
                     if (probe.previews++ == 0) probe.first_preview_ms = ms_since(probe.released);
                   });
  QObject::connect(controller, &infill::ui::EditController::resultArrived,
                   [&](const infill::ui::GenerationResult& r) {
                     if (!probe.active || !r.live) return;
                     probe.final_ms = ms_since(probe.released);
                     probe.engine_ms = r.engine_ms;
                     probe.done = true;
                   });
  QObject::connect(engine, &EngineConnection::editFinished,
                   [&](quint64, const infill::ui::EditOutcome& o) {
                     if (probe.active && o.state == INFILL_JOB_DONE) probe.steps_run = o.steps_run;
                   });
  QObject::connect(controller, &infill::ui::EditController::message,
                   [&](const QString& text, bool error) {
                     if (probe.active && error) probe.error = text;
                   });

  auto mouse = [&](QEvent::Type type, QPointF image_pos, Qt::MouseButton button,
                   Qt::MouseButtons buttons) {
    const QPointF pos = canvas->toWidget(image_pos);
    QMouseEvent e(type, pos, canvas->mapToGlobal(pos), button, buttons, Qt::NoModifier);
    QCoreApplication::sendEvent(canvas, &e);
  };

  // One stroke: clear the previous region, paint (events paced like a quick hand, the canvas
  // repainting in between), release, wait for the final result.
  auto stroke = [&](int index, const std::string& label) -> StrokeProbe {
    mask->clear();
    run_for(20);
    const double y = margin + std::fmod(index * 157.0, kImageSize - 2 * margin);
    const double x =
        margin + std::fmod(index * 61.0, std::max(1.0, kImageSize - 2 * margin - length));
    const std::vector<QPointF> points = stroke_points(QPointF(x, y), length);
    probe = StrokeProbe{};
    mouse(QEvent::MouseButtonPress, points.front(), Qt::LeftButton, Qt::LeftButton);
    for (size_t i = 1; i < points.size(); ++i) {
      mouse(QEvent::MouseMove, points[i], Qt::NoButton, Qt::LeftButton);
      run_for(4);
    }
    probe.active = true;
    probe.released = Clock::now();
    mouse(QEvent::MouseButtonRelease, points.back(), Qt::LeftButton, Qt::NoButton);
    run_until([&] { return probe.done || !probe.error.isEmpty(); }, kResultTimeoutMs);
    probe.active = false;
    if (!probe.error.isEmpty()) die(label + ": " + probe.error.toStdString());
    if (!probe.done)
      die(label + ": no result within " + std::to_string(kResultTimeoutMs / 1000) +
          " s (engine: " + engine->stateMessage().toStdString() + ")");
    StrokeProbe r = probe;
    std::cerr << "bench_live_edit: " << label << ": mask " << mask_ratio(mask->mask())
              << ", first preview " << r.first_preview_ms << " ms, final result " << r.final_ms
              << " ms (" << r.steps_run << " steps)" << std::endl;
    run_for(opt.pause_ms);
    return r;
  };

  std::cerr << "bench_live_edit: warming up (" << opt.warmup
            << " strokes; the first prepares the template)" << std::endl;
  for (int i = 0; i < opt.warmup; ++i)
    stroke(opt.strokes + i, "warm-up stroke " + std::to_string(i + 1));
  if (!run_until([&] { return prepared; }, 120000))
    die("the engine did not report the template prepared within 120 s");

  std::vector<double> ratios, first_preview, final_result, accepted, first_step, engine_ms;
  json per_first_preview = json::array(), per_previews = json::array(),
       per_steps_run = json::array();
  for (int i = 0; i < opt.strokes; ++i) {
    const StrokeProbe r =
        stroke(i, "stroke " + std::to_string(i + 1) + "/" + std::to_string(opt.strokes));
    ratios.push_back(mask_ratio(mask->mask()));
    final_result.push_back(r.final_ms);
    accepted.push_back(r.accepted_ms);
    first_step.push_back(r.first_step_ms);
    engine_ms.push_back(r.engine_ms);
    per_previews.push_back(r.previews);
    per_steps_run.push_back(r.steps_run);
    if (r.first_preview_ms >= 0) {
      first_preview.push_back(r.first_preview_ms);
      per_first_preview.push_back(r.first_preview_ms);
    } else {
      per_first_preview.push_back(nullptr);  // the result came before any preview
    }
  }
  const infill::ui::GenerationParams used = controller->parameters();
  const infill::ui::EditController::LiveStats stats = controller->liveStats();

  json machine = infill::bench::machine_info();
  machine["note"] = "torch_threads is this program's; the engine computes with engine.threads";
  const double ratio_mean = [&] {
    double s = 0;
    for (double r : ratios) s += r;
    return s / double(ratios.size());
  }();
  const double fp_median = percentile(first_preview, 0.5),
               final_median = percentile(final_result, 0.5);
  json out = {
      {"benchmark", "live_edit"},
      {"machine", machine},
      {"config",
       {{"model", QFileInfo(model_path).fileName().toStdString()},
        {"model_id", engine_check.value("model_id", "")},
        {"image",
         {{"width", kImageSize},
          {"height", kImageSize},
          {"source", "resources/templates/sample.png"}}},
        {"strokes", opt.strokes},
        {"warmup_strokes", opt.warmup},
        {"mask_ratio_target", opt.mask_ratio},
        {"mask_ratio_measured",
         {{"mean", ratio_mean},
          {"min", *std::min_element(ratios.begin(), ratios.end())},
          {"max", *std::max_element(ratios.begin(), ratios.end())}}},
        {"brush",
         {{"size_px", brush.size_px}, {"hardness", brush.hardness}, {"stroke_length_px", length}}},
        {"prompt", used.prompt.toStdString()},
        {"steps", used.steps},
        {"guidance", used.guidance},
        {"seed", used.seed},
        {"live_debounce_ms", controller->liveDebounceMs()},
        {"pause_between_strokes_ms", opt.pause_ms},
        {"qt_platform", QGuiApplication::platformName().toStdString()},
        {"engine",
         {{"endpoint", "private Unix socket, started by the editor's EngineConnection"},
          {"workers", engine_check.value("workers", 0)},
          {"threads", engine_check.value("threads", 0)},
          {"calibrate", false},
          {"journal", "off"}}}}},
      {"measured_from", "mouse release on the canvas"},
      {"per_stroke",
       {{"mask_ratio", ratios},
        {"first_preview_ms", per_first_preview},
        {"final_result_ms", final_result},
        {"previews", per_previews},
        {"steps_run", per_steps_run},
        {"accepted_ms", accepted},
        {"first_step_ms", first_step},
        {"engine_total_ms", engine_ms}}},
      {"first_preview_ms", summary(first_preview)},
      {"final_result_ms", summary(final_result)},
      // Where the time to the first preview goes: the edit accepted by the engine (debounce,
      // mask upload), its first denoising step reported, the first preview on the canvas.
      {"breakdown_median_ms",
       {{"accepted", percentile(accepted, 0.5)},
        {"first_step", percentile(first_step, 0.5)},
        {"first_preview", fp_median},
        {"final_result", final_median},
        {"engine_total", percentile(engine_ms, 0.5)}}},
      {"live_stats",
       {{"submitted", stats.submitted},
        {"superseded", stats.superseded},
        {"stale", stats.stale},
        {"results", stats.results}}},
      {"targets",
       {{"first_preview_ms",
         {{"target_median", kFirstPreviewTargetMs},
          {"median", fp_median},
          {"met", !first_preview.empty() && fp_median <= kFirstPreviewTargetMs}}},
        {"final_result_ms",
         {{"target_median", kFinalResultTargetMs},
          {"median", final_median},
          {"met", final_median <= kFinalResultTargetMs}}}}}};
  std::cout << out.dump(2) << std::endl;
  g_session.reset();  // stops the engine
  return 0;
}
