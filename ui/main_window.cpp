#include "ui/main_window.h"

#include <QAction>
#include <QActionGroup>
#include <QApplication>
#include <QCheckBox>
#include <QCloseEvent>
#include <QColorDialog>
#include <QDialog>
#include <QDialogButtonBox>
#include <QDockWidget>
#include <QDragEnterEvent>
#include <QDropEvent>
#include <QFileDialog>
#include <QFileInfo>
#include <QFormLayout>
#include <QHBoxLayout>
#include <QInputDialog>
#include <QLabel>
#include <QLineEdit>
#include <QMenuBar>
#include <QMimeData>
#include <QProgressBar>
#include <QPushButton>
#include <QSettings>
#include <QSlider>
#include <QStatusBar>
#include <QToolBar>
#include <QUndoCommand>
#include <QVBoxLayout>

#include <functional>

#include "ui/image_io.h"

namespace infill::ui {

namespace {

constexpr int kMaxRecent = 8;
const char* const kRecentKey = "recent_files";

// Replacing the canvas image (applying a result) as one undo step.
// The picture as shown and its file at full depth: what Apply and its undo swap.
struct Picture {
  QImage image;
  QByteArray file;
};

class ImageChangeCommand : public QUndoCommand {
 public:
  ImageChangeCommand(Picture before, Picture after, std::function<void(const Picture&)> set)
      : QUndoCommand(QObject::tr("Apply result")), before_(std::move(before)), after_(std::move(after)), set_(std::move(set)) {}
  void redo() override { set_(after_); }
  void undo() override { set_(before_); }

 private:
  Picture before_, after_;
  std::function<void(const Picture&)> set_;
};

QString mask_path_for(const QString& image_path) {
  const QFileInfo info(image_path);
  return info.dir().filePath(info.completeBaseName() + QStringLiteral("_mask.png"));
}

}  // namespace

MainWindow::MainWindow(QWidget* parent)
    : QMainWindow(parent),
      undo_(new QUndoStack(this)),
      mask_(new MaskDocument(undo_, this)),
      engine_(new EngineConnection(this)),
      controller_(new EditController(engine_, mask_, this)),
      canvas_(new CanvasView(mask_, this)),
      params_(new ParametersPanel(this)),
      results_(new ResultsStrip(this)) {
  setWindowTitle(QStringLiteral("Infill"));
  setAcceptDrops(true);
  undo_->setUndoLimit(200);
  createActions();
  createPanels();
  createMenus();
  updateRecentMenu();

  connect(controller_, &EditController::message, this, &MainWindow::showMessage);
  connect(controller_, &EditController::templateStateChanged, this,
          [this](const QString& s) { template_label_->setText(tr("Template: %1").arg(s)); });
  connect(controller_, &EditController::previewArrived, canvas_, &CanvasView::setPreview);
  connect(controller_, &EditController::resultArrived, this, &MainWindow::onResult);
  connect(controller_, &EditController::progressChanged, this, [this](int done, int total, double eta_s) {
    progress_->setRange(0, std::max(1, total));
    progress_->setValue(done);
    progress_->setFormat(eta_s >= 0 ? tr("%1/%2 steps, ETA %3 s").arg(done).arg(total).arg(eta_s, 0, 'f', 1)
                                    : tr("%1/%2 steps").arg(done).arg(total));
  });
  connect(controller_, &EditController::busyChanged, this, [this](bool busy) {
    if (!busy) {
      progress_->setValue(progress_->maximum());
      canvas_->setPreview(QImage(), QRect());
    }
    updateActions();
  });
  connect(controller_, &EditController::liveLatency, this,
          [this](double ms) { latency_label_->setText(tr("Last live result: %1 ms").arg(qRound(ms))); });
  connect(engine_, &EngineConnection::stateChanged, this, &MainWindow::onEngineState);
  connect(params_, &ParametersPanel::paramsChanged, this, [this] { controller_->setParameters(params_->params()); });
  connect(params_, &ParametersPanel::validityChanged, this, [this] { updateActions(); });
  connect(params_, &ParametersPanel::message, this, &MainWindow::showMessage);
  params_->setEngine(engine_);
  connect(mask_, &MaskDocument::editCommitted, this, [this] { updateActions(); });
  connect(undo_, &QUndoStack::indexChanged, this, [this] { updateActions(); });
  connect(results_, &ResultsStrip::resultSelected, this, [this] { showSelectedResult(); });
  connect(results_, &ResultsStrip::applyRequested, this, [this](int i) { applyResult(results_->result(i)); });
  connect(canvas_, &CanvasView::zoomChanged, this,
          [this](double z) { zoom_label_->setText(QStringLiteral("%1%").arg(qRound(z * 100))); });
  controller_->setParameters(params_->params());
  onEngineState(EngineConnection::State::Disconnected, tr("Not connected"));
  template_label_->setText(tr("Template: none"));
  updateActions();
  resize(1280, 860);
}

MainWindow::~MainWindow() = default;

QAction* MainWindow::makeAction(const QString& name, const QString& text, const QKeySequence& key) {
  auto* a = new QAction(text, this);
  a->setObjectName(name);
  if (!key.isEmpty()) a->setShortcut(key);
  addAction(a);  // shortcuts work even when the menu bar is hidden
  actions_ << a;
  return a;
}

QAction* MainWindow::action(const QString& name) const {
  for (QAction* a : actions_)
    if (a->objectName() == name) return a;
  return nullptr;
}

void MainWindow::createActions() {
  connect(makeAction(QStringLiteral("open"), tr("&Open..."), QKeySequence::Open), &QAction::triggered, this, [this] {
    const QString path = QFileDialog::getOpenFileName(this, tr("Open image"), QFileInfo(path_).path(), image_file_filter());
    if (!path.isEmpty()) openImage(path);
  });
  connect(makeAction(QStringLiteral("export"), tr("&Export result..."), QKeySequence(tr("Ctrl+E"))), &QAction::triggered,
          this, [this] { exportDialog(false); });
  connect(makeAction(QStringLiteral("export_with_mask"), tr("Export result with &mask..."), QKeySequence(tr("Ctrl+Shift+E"))),
          &QAction::triggered, this, [this] { exportDialog(true); });
  connect(makeAction(QStringLiteral("load_mask"), tr("&Load mask..."), QKeySequence(tr("Ctrl+Shift+O"))), &QAction::triggered,
          this, [this] {
            const QString path = QFileDialog::getOpenFileName(this, tr("Load mask"), QFileInfo(path_).path(), tr("PNG (*.png)"));
            QString error;
            if (!path.isEmpty() && !mask_->load(path, &error)) showMessage(error, true);
          });
  connect(makeAction(QStringLiteral("save_mask"), tr("&Save mask..."), QKeySequence(tr("Ctrl+Shift+S"))), &QAction::triggered,
          this, [this] {
            const QString path = QFileDialog::getSaveFileName(this, tr("Save mask"), mask_path_for(path_), tr("PNG (*.png)"));
            QString error;
            if (path.isEmpty()) return;
            if (!mask_->save(path, &error)) showMessage(error, true);
            else showMessage(tr("Mask saved to %1").arg(path), false);
          });
  connect(makeAction(QStringLiteral("quit"), tr("&Quit"), QKeySequence::Quit), &QAction::triggered, this, &QWidget::close);

  QAction* undo = undo_->createUndoAction(this, tr("&Undo"));
  undo->setObjectName(QStringLiteral("undo"));
  undo->setShortcut(QKeySequence::Undo);
  QAction* redo = undo_->createRedoAction(this, tr("&Redo"));
  redo->setObjectName(QStringLiteral("redo"));
  redo->setShortcuts({QKeySequence::Redo, QKeySequence(tr("Ctrl+Y"))});
  addAction(undo);
  addAction(redo);
  actions_ << undo << redo;

  connect(makeAction(QStringLiteral("invert"), tr("&Invert mask"), QKeySequence(tr("Ctrl+I"))), &QAction::triggered, mask_,
          &MaskDocument::invert);
  connect(makeAction(QStringLiteral("clear"), tr("&Clear mask"), QKeySequence(Qt::Key_Delete)), &QAction::triggered, mask_,
          &MaskDocument::clear);
  connect(makeAction(QStringLiteral("grow"), tr("&Grow mask..."), QKeySequence(tr("Ctrl+G"))), &QAction::triggered, this, [this] {
    bool ok = false;
    const int px = QInputDialog::getInt(this, tr("Grow mask"), tr("Pixels:"), 8, 1, 256, 1, &ok);
    if (ok) mask_->grow(px);
  });
  connect(makeAction(QStringLiteral("shrink"), tr("S&hrink mask..."), QKeySequence(tr("Ctrl+Shift+G"))), &QAction::triggered, this,
          [this] {
            bool ok = false;
            const int px = QInputDialog::getInt(this, tr("Shrink mask"), tr("Pixels:"), 8, 1, 256, 1, &ok);
            if (ok) mask_->grow(-px);
          });
  connect(makeAction(QStringLiteral("feather"), tr("&Feather mask..."), QKeySequence(tr("Ctrl+F"))), &QAction::triggered, this,
          [this] {
            bool ok = false;
            const double px = QInputDialog::getDouble(this, tr("Feather mask"), tr("Radius (pixels):"), 8, 1, 128, 1, &ok);
            if (ok) mask_->feather(px);
          });

  tools_ = new QActionGroup(this);
  auto tool_action = [this](const QString& name, const QString& text, const QKeySequence& key, CanvasView::Tool tool) {
    QAction* a = makeAction(name, text, key);
    a->setCheckable(true);
    tools_->addAction(a);
    connect(a, &QAction::triggered, this, [this, tool] { selectTool(tool); });
    return a;
  };
  tool_action(QStringLiteral("tool_brush"), tr("&Brush"), QKeySequence(Qt::Key_B), CanvasView::Tool::Brush)->setChecked(true);
  tool_action(QStringLiteral("tool_eraser"), tr("&Eraser"), QKeySequence(Qt::Key_E), CanvasView::Tool::Eraser);
  tool_action(QStringLiteral("tool_rect"), tr("&Rectangle"), QKeySequence(Qt::Key_R), CanvasView::Tool::Rectangle);
  tool_action(QStringLiteral("tool_lasso"), tr("&Lasso"), QKeySequence(Qt::Key_L), CanvasView::Tool::Lasso);
  connect(makeAction(QStringLiteral("swap_brush_eraser"), tr("S&wap brush and eraser"), QKeySequence(Qt::Key_X)),
          &QAction::triggered, this, [this] {
            selectTool(canvas_->tool() == CanvasView::Tool::Eraser ? CanvasView::Tool::Brush : CanvasView::Tool::Eraser);
          });
  connect(makeAction(QStringLiteral("brush_smaller"), tr("Brush s&maller"), QKeySequence(Qt::Key_BracketLeft)),
          &QAction::triggered, this, [this] { changeBrushSize(1 / 1.2); });
  connect(makeAction(QStringLiteral("brush_larger"), tr("Brush l&arger"), QKeySequence(Qt::Key_BracketRight)),
          &QAction::triggered, this, [this] { changeBrushSize(1.2); });
  // Shift+[ arrives as "{" (with or without the Shift modifier, by keyboard layout): bind both.
  QAction* softer = makeAction(QStringLiteral("brush_softer"), tr("Brush softer"));
  softer->setShortcuts({QKeySequence(Qt::Key_BraceLeft), QKeySequence(Qt::SHIFT | Qt::Key_BraceLeft)});
  connect(softer, &QAction::triggered, this, [this] { changeHardness(-0.1); });
  QAction* harder = makeAction(QStringLiteral("brush_harder"), tr("Brush harder"));
  harder->setShortcuts({QKeySequence(Qt::Key_BraceRight), QKeySequence(Qt::SHIFT | Qt::Key_BraceRight)});
  connect(harder, &QAction::triggered, this, [this] { changeHardness(0.1); });

  connect(makeAction(QStringLiteral("fit"), tr("&Fit to window"), QKeySequence(tr("Ctrl+0"))), &QAction::triggered, canvas_,
          &CanvasView::fitToWindow);
  connect(makeAction(QStringLiteral("actual_size"), tr("&100%"), QKeySequence(tr("Ctrl+1"))), &QAction::triggered, canvas_,
          &CanvasView::actualSize);
  connect(makeAction(QStringLiteral("zoom_in"), tr("Zoom &in"), QKeySequence::ZoomIn), &QAction::triggered, this,
          [this] { canvas_->zoomBy(1.25); });
  connect(makeAction(QStringLiteral("zoom_out"), tr("Zoom &out"), QKeySequence::ZoomOut), &QAction::triggered, this,
          [this] { canvas_->zoomBy(1 / 1.25); });
  QAction* overlay = makeAction(QStringLiteral("toggle_overlay"), tr("Show &mask overlay"), QKeySequence(Qt::Key_H));
  overlay->setCheckable(true);
  overlay->setChecked(true);
  connect(overlay, &QAction::toggled, canvas_, &CanvasView::setOverlayVisible);
  connect(makeAction(QStringLiteral("overlay_color"), tr("Overlay &colour...")), &QAction::triggered, this, [this] {
    const QColor c = QColorDialog::getColor(canvas_->overlayColor(), this, tr("Overlay colour"));
    if (c.isValid()) canvas_->setOverlayColor(c);
  });
  QAction* compare = makeAction(QStringLiteral("compare"), tr("A/B &compare"), QKeySequence(Qt::Key_C));
  compare->setCheckable(true);
  connect(compare, &QAction::toggled, this, [this] { showSelectedResult(); });

  connect(makeAction(QStringLiteral("generate"), tr("&Generate"), QKeySequence(tr("Ctrl+Return"))), &QAction::triggered, this,
          [this] {
            controller_->setParameters(params_->params());
            if (!params_->invalidWords().isEmpty()) {
              showMessage(tr("The prompt has words the model does not know: %1").arg(params_->invalidWords().join(QStringLiteral(", "))),
                          true);
              return;
            }
            // (Not connected, nothing uploads: generate() says so.)
            if (const int waiting = params_->uploadsPending();
                waiting > 0 && engine_->state() == EngineConnection::State::Connected) {
              showMessage(tr("%n LoRA or reference file(s) still uploading to the engine; Generate again when they are "
                             "listed", nullptr, waiting),
                          true);
              return;
            }
            controller_->generate();
          });
  connect(makeAction(QStringLiteral("cancel"), tr("&Cancel"), QKeySequence(Qt::Key_Escape)), &QAction::triggered, controller_,
          &EditController::cancel);
  QAction* live = makeAction(QStringLiteral("live"), tr("&Live mode"), QKeySequence(tr("Ctrl+L")));
  live->setCheckable(true);
  connect(live, &QAction::toggled, this, [this](bool on) {
    controller_->setParameters(params_->params());
    controller_->setLiveMode(on);
    if (live_box_->isChecked() != on) live_box_->setChecked(on);
    latency_label_->setText(on ? tr("Live: waiting for a stroke") : QString());
  });
  connect(makeAction(QStringLiteral("apply"), tr("&Apply result"), QKeySequence(tr("Ctrl+Shift+Return"))), &QAction::triggered,
          this, [this] {
            if (const GenerationResult* r = results_->selectedResult()) applyResult(*r);
          });
  connect(makeAction(QStringLiteral("connect"), tr("C&onnect to engine...")), &QAction::triggered, this,
          &MainWindow::connectDialog);
}

void MainWindow::createMenus() {
  QMenu* file = menuBar()->addMenu(tr("&File"));
  file->addAction(action(QStringLiteral("open")));
  recent_menu_ = file->addMenu(tr("Open &recent"));
  file->addSeparator();
  file->addAction(action(QStringLiteral("load_mask")));
  file->addAction(action(QStringLiteral("save_mask")));
  file->addSeparator();
  file->addAction(action(QStringLiteral("export")));
  file->addAction(action(QStringLiteral("export_with_mask")));
  file->addSeparator();
  file->addAction(action(QStringLiteral("quit")));

  QMenu* edit = menuBar()->addMenu(tr("&Edit"));
  for (const char* n : {"undo", "redo"}) edit->addAction(action(QLatin1String(n)));
  edit->addSeparator();
  for (const char* n : {"invert", "clear", "grow", "shrink", "feather"}) edit->addAction(action(QLatin1String(n)));

  QMenu* tools = menuBar()->addMenu(tr("&Tools"));
  for (const char* n : {"tool_brush", "tool_eraser", "tool_rect", "tool_lasso", "swap_brush_eraser"})
    tools->addAction(action(QLatin1String(n)));
  tools->addSeparator();
  for (const char* n : {"brush_smaller", "brush_larger", "brush_softer", "brush_harder"}) tools->addAction(action(QLatin1String(n)));

  QMenu* view = menuBar()->addMenu(tr("&View"));
  for (const char* n : {"fit", "actual_size", "zoom_in", "zoom_out"}) view->addAction(action(QLatin1String(n)));
  view->addSeparator();
  for (const char* n : {"toggle_overlay", "overlay_color", "compare"}) view->addAction(action(QLatin1String(n)));

  QMenu* engine = menuBar()->addMenu(tr("E&ngine"));
  for (const char* n : {"generate", "cancel", "live", "apply"}) engine->addAction(action(QLatin1String(n)));
  engine->addSeparator();
  engine->addAction(action(QStringLiteral("connect")));

  QToolBar* bar = addToolBar(tr("Tools"));
  bar->setObjectName(QStringLiteral("tools_toolbar"));
  bar->addAction(action(QStringLiteral("open")));
  bar->addSeparator();
  for (QAction* a : tools_->actions()) bar->addAction(a);
  bar->addSeparator();
  bar->addWidget(new QLabel(tr(" Size "), bar));
  bar->addWidget(brush_size_);
  bar->addWidget(new QLabel(tr(" Hardness "), bar));
  bar->addWidget(hardness_);
  bar->addWidget(new QLabel(tr(" Overlay "), bar));
  bar->addWidget(opacity_);
  bar->addAction(action(QStringLiteral("toggle_overlay")));
  bar->addSeparator();
  for (const char* n : {"undo", "redo", "invert", "clear"}) bar->addAction(action(QLatin1String(n)));
}

void MainWindow::createPanels() {
  brush_size_ = new QSlider(Qt::Horizontal, this);
  brush_size_->setRange(1, 500);
  brush_size_->setValue(static_cast<int>(canvas_->brush().size_px));
  brush_size_->setFixedWidth(120);
  brush_size_->setObjectName(QStringLiteral("brush_size"));
  connect(brush_size_, &QSlider::valueChanged, this, [this](int v) {
    BrushShape b = canvas_->brush();
    b.size_px = v;
    canvas_->setBrush(b);
  });
  hardness_ = new QSlider(Qt::Horizontal, this);
  hardness_->setRange(0, 100);
  hardness_->setValue(static_cast<int>(canvas_->brush().hardness * 100));
  hardness_->setFixedWidth(90);
  connect(hardness_, &QSlider::valueChanged, this, [this](int v) {
    BrushShape b = canvas_->brush();
    b.hardness = v / 100.0;
    canvas_->setBrush(b);
  });
  opacity_ = new QSlider(Qt::Horizontal, this);
  opacity_->setRange(0, 100);
  opacity_->setValue(static_cast<int>(canvas_->overlayOpacity() * 100));
  opacity_->setFixedWidth(90);
  connect(opacity_, &QSlider::valueChanged, this, [this](int v) { canvas_->setOverlayOpacity(v / 100.0); });

  // Centre: canvas, the A/B split, the results strip.
  auto* centre = new QWidget(this);
  auto* layout = new QVBoxLayout(centre);
  layout->setContentsMargins(0, 0, 0, 0);
  layout->addWidget(canvas_, 1);
  auto* split_row = new QHBoxLayout;
  split_row->setContentsMargins(6, 0, 6, 0);
  split_row->addWidget(new QLabel(tr("A (image)"), centre));
  split_slider_ = new QSlider(Qt::Horizontal, centre);
  split_slider_->setRange(0, 1000);
  split_slider_->setValue(500);
  split_slider_->setToolTip(tr("A/B comparison: drag to move the split between the image and the selected result"));
  split_row->addWidget(split_slider_, 1);
  split_row->addWidget(new QLabel(tr("B (result)"), centre));
  apply_button_ = new QPushButton(tr("Apply"), centre);
  apply_button_->setToolTip(tr("Put the selected result into the image (undoable)"));
  split_row->addWidget(apply_button_);
  layout->addLayout(split_row);
  layout->addWidget(results_);
  setCentralWidget(centre);
  connect(split_slider_, &QSlider::valueChanged, this, [this] { showSelectedResult(); });
  connect(apply_button_, &QPushButton::clicked, action(QStringLiteral("apply")), &QAction::trigger);

  // Right: parameters and the Generate controls.
  auto* dock = new QDockWidget(tr("Parameters"), this);
  dock->setObjectName(QStringLiteral("parameters_dock"));
  dock->setFeatures(QDockWidget::DockWidgetMovable | QDockWidget::DockWidgetFloatable);
  auto* side = new QWidget(dock);
  auto* side_layout = new QVBoxLayout(side);
  side_layout->addWidget(params_);
  auto* buttons = new QHBoxLayout;
  generate_button_ = new QPushButton(tr("Generate"), side);
  generate_button_->setDefault(true);
  generate_button_->setToolTip(tr("Repaint the masked region (Ctrl+Enter)"));
  cancel_button_ = new QPushButton(tr("Cancel"), side);
  buttons->addWidget(generate_button_, 1);
  buttons->addWidget(cancel_button_);
  side_layout->addLayout(buttons);
  live_box_ = new QCheckBox(tr("Live mode: repaint after each stroke"), side);
  side_layout->addWidget(live_box_);
  progress_ = new QProgressBar(side);
  progress_->setRange(0, 1);
  progress_->setValue(0);
  progress_->setTextVisible(true);
  progress_->setFormat(tr("idle"));
  side_layout->addWidget(progress_);
  latency_label_ = new QLabel(side);
  side_layout->addWidget(latency_label_);
  side_layout->addStretch(1);
  dock->setWidget(side);
  addDockWidget(Qt::RightDockWidgetArea, dock);
  connect(generate_button_, &QPushButton::clicked, action(QStringLiteral("generate")), &QAction::trigger);
  connect(cancel_button_, &QPushButton::clicked, action(QStringLiteral("cancel")), &QAction::trigger);
  connect(live_box_, &QCheckBox::toggled, action(QStringLiteral("live")), &QAction::setChecked);

  engine_label_ = new QLabel(this);
  template_label_ = new QLabel(this);
  zoom_label_ = new QLabel(QStringLiteral("100%"), this);
  message_label_ = new QLabel(this);
  statusBar()->addWidget(message_label_, 1);
  statusBar()->addPermanentWidget(template_label_);
  statusBar()->addPermanentWidget(engine_label_);
  statusBar()->addPermanentWidget(zoom_label_);
}

void MainWindow::updateActions() {
  const bool has_image = !canvas_->image().isNull();
  const bool busy = controller_->busy();
  const bool has_result = results_->selectedResult() != nullptr;
  action(QStringLiteral("generate"))->setEnabled(has_image && params_->invalidWords().isEmpty());
  generate_button_->setEnabled(action(QStringLiteral("generate"))->isEnabled());
  action(QStringLiteral("cancel"))->setEnabled(busy || controller_->liveMode());
  cancel_button_->setEnabled(busy);
  action(QStringLiteral("apply"))->setEnabled(has_result);
  apply_button_->setEnabled(has_result);
  action(QStringLiteral("export"))->setEnabled(has_image);
  action(QStringLiteral("export_with_mask"))->setEnabled(has_image);
  for (const char* n : {"save_mask", "load_mask", "invert", "clear", "grow", "shrink", "feather"})
    action(QLatin1String(n))->setEnabled(has_image);
  split_slider_->setEnabled(has_result && action(QStringLiteral("compare"))->isChecked());
  if (!busy && progress_->format() != tr("idle") && progress_->value() == 0) progress_->setFormat(tr("idle"));
}

void MainWindow::showMessage(const QString& text, bool error) {
  message_label_->setStyleSheet(error ? QStringLiteral("color: #e04050;") : QString());
  // The status line shows the first line; the tooltip keeps the details (engine output, ...).
  message_label_->setText(text.section(QLatin1Char('\n'), 0, 0));
  message_label_->setToolTip(text);
}

void MainWindow::onEngineState(EngineConnection::State state, const QString& message) {
  QString short_state;
  switch (state) {
    case EngineConnection::State::Disconnected: short_state = tr("Engine: not connected"); break;
    case EngineConnection::State::Connecting: short_state = tr("Engine: connecting..."); break;
    case EngineConnection::State::StartingEngine: short_state = tr("Engine: starting..."); break;
    case EngineConnection::State::Connected: short_state = tr("Engine: connected"); break;
    case EngineConnection::State::Failed: short_state = tr("Engine: unavailable"); break;
    case EngineConnection::State::Reconnecting: short_state = tr("Engine lost, reconnecting..."); break;
  }
  engine_label_->setText(short_state);
  engine_label_->setToolTip(message);
  engine_label_->setStyleSheet(state == EngineConnection::State::Failed         ? QStringLiteral("color: #e04050;")
                               : state == EngineConnection::State::Reconnecting ? QStringLiteral("color: #d08020;")
                                                                                : QString());
  // Losing the engine is said once, in the status line; the attempts update the label's tooltip.
  if (state == EngineConnection::State::Reconnecting && engine_->reconnectAttempts() == 0) showMessage(message, true);
  if (state == EngineConnection::State::Connected && engine_->reconnectAttempts() > 0) showMessage(message, false);
  if (state == EngineConnection::State::Connected) {
    params_->setModels(engine_->models());
    controller_->setParameters(params_->params());
  }
  if (state == EngineConnection::State::Failed) showMessage(message, true);
  updateActions();
}

void MainWindow::connectEngine(const EngineOptions& options) {
  engine_options_ = options;
  engine_->connectToEngine(options);
}

void MainWindow::connectDialog() {
  QDialog dialog(this);
  dialog.setWindowTitle(tr("Connect to engine"));
  auto* form = new QFormLayout(&dialog);
  auto* endpoint = new QLineEdit(engine_options_.endpoint, &dialog);
  endpoint->setPlaceholderText(tr("empty: the local engine; or http://host:port"));
  auto* token = new QLineEdit(engine_options_.token, &dialog);
  token->setEchoMode(QLineEdit::Password);
  token->setPlaceholderText(tr("for remote engines (TCP)"));
  form->addRow(tr("Address"), endpoint);
  form->addRow(tr("Token"), token);
  auto* box = new QDialogButtonBox(QDialogButtonBox::Ok | QDialogButtonBox::Cancel, &dialog);
  form->addRow(box);
  connect(box, &QDialogButtonBox::accepted, &dialog, &QDialog::accept);
  connect(box, &QDialogButtonBox::rejected, &dialog, &QDialog::reject);
  if (dialog.exec() != QDialog::Accepted) return;
  EngineOptions o = engine_options_;
  o.endpoint = endpoint->text().trimmed();
  o.token = token->text().trimmed();
  connectEngine(o);
}

void MainWindow::setImageInternal(const QImage& image, const QByteArray& file) {
  document_file_ = file;
  canvas_->setImage(image);
  canvas_->setComparison(QImage());
  controller_->setImage(image, file, QFileInfo(path_).fileName());
  updateActions();
}

bool MainWindow::openImage(const QString& path) {
  LoadedImage loaded = load_image(path);
  if (loaded.image.isNull()) {
    showMessage(loaded.error, true);
    return false;
  }
  // Edits of the previous picture would come back as results that fit nothing.
  controller_->cancel();
  path_ = path;
  mask_->reset(loaded.image.size());
  results_->clearResults();
  setImageInternal(loaded.image, loaded.file);
  setWindowTitle(QStringLiteral("%1 - Infill").arg(QFileInfo(path).fileName()));
  showMessage(tr("Opened %1 (%2x%3, %4 channels, %5)")
                  .arg(QFileInfo(path).fileName()).arg(loaded.image.width()).arg(loaded.image.height())
                  .arg(loaded.channels).arg(loaded.pixel_type),
              false);
  addRecent(path);
  return true;
}

void MainWindow::addRecent(const QString& path) {
  QSettings settings;
  QStringList recent = settings.value(QLatin1String(kRecentKey)).toStringList();
  const QString absolute = QFileInfo(path).absoluteFilePath();
  recent.removeAll(absolute);
  recent.prepend(absolute);
  while (recent.size() > kMaxRecent) recent.removeLast();
  settings.setValue(QLatin1String(kRecentKey), recent);
  updateRecentMenu();
}

void MainWindow::updateRecentMenu() {
  recent_menu_->clear();
  const QStringList recent = QSettings().value(QLatin1String(kRecentKey)).toStringList();
  for (const QString& path : recent) {
    QAction* a = recent_menu_->addAction(QFileInfo(path).fileName());
    a->setToolTip(path);
    connect(a, &QAction::triggered, this, [this, path] { openImage(path); });
  }
  recent_menu_->setEnabled(!recent.isEmpty());
}

void MainWindow::selectTool(CanvasView::Tool tool) {
  canvas_->setTool(tool);
  const char* name = tool == CanvasView::Tool::Brush    ? "tool_brush"
                     : tool == CanvasView::Tool::Eraser ? "tool_eraser"
                     : tool == CanvasView::Tool::Rectangle ? "tool_rect"
                                                           : "tool_lasso";
  action(QLatin1String(name))->setChecked(true);
}

void MainWindow::changeBrushSize(double factor) {
  const int v = static_cast<int>(std::lround(brush_size_->value() * factor));
  // At small sizes a 20% step rounds to nothing; always move by at least one pixel.
  brush_size_->setValue(factor > 1 ? std::max(v, brush_size_->value() + 1) : std::min(v, brush_size_->value() - 1));
}

void MainWindow::changeHardness(double delta) { hardness_->setValue(hardness_->value() + static_cast<int>(delta * 100)); }

void MainWindow::onResult(const GenerationResult& result) {
  canvas_->setPreview(QImage(), QRect());
  params_->showUsedSeed(result.seed);
  results_->addResult(result);
  results_->setCurrentRow(results_->resultCount() - 1);
  showSelectedResult();
  updateActions();
}

void MainWindow::showSelectedResult() {
  const GenerationResult* r = results_->selectedResult();
  if (!r || r->image.size() != canvas_->image().size()) {
    canvas_->setComparison(QImage());
    updateActions();
    return;
  }
  canvas_->setComparison(r->image);
  // Without A/B, the result is shown whole (the split at the left edge).
  const bool compare = action(QStringLiteral("compare"))->isChecked();
  canvas_->setSplit(compare ? split_slider_->value() / 1000.0 : 0.0);
  updateActions();
}

void MainWindow::applyResult(const GenerationResult& result) {
  if (result.image.isNull() || result.image.size() != canvas_->image().size()) return;
  const Picture before{canvas_->image(), document_file_};
  const Picture after{result.image.convertToFormat(QImage::Format_RGBA8888), result.file};
  undo_->push(new ImageChangeCommand(before, after, [this](const Picture& picture) {
    // The engine's template must follow the picture: the next edit starts from this one, at
    // the file's full depth (the engine's result file, never the 8-bit display).
    setImageInternal(picture.image, picture.file);
  }));
  results_->setCurrentRow(-1);
  showMessage(tr("Result applied (Ctrl+Z to undo)"), false);
}

QString MainWindow::exportImage(const QImage& image, const QByteArray& file, const QString& path, bool with_mask) {
  // The file at full depth where there is one; the 8-bit picture only for images made here.
  QString error = file.isEmpty() ? save_image(image, path) : save_image_file(file, path);
  if (!error.isEmpty()) return error;
  if (with_mask) {
    QString mask_error;
    if (!mask_->save(mask_path_for(path), &mask_error)) return mask_error;
  }
  return {};
}

void MainWindow::exportDialog(bool with_mask) {
  const GenerationResult* r = results_->selectedResult();
  const QImage image = r ? r->image : canvas_->image();
  const QByteArray file = r ? r->file : document_file_;
  if (image.isNull()) return;
  const QFileInfo src(path_);
  const QString suggestion = src.dir().filePath(src.completeBaseName() + QStringLiteral("_infill.png"));
  const QString path = QFileDialog::getSaveFileName(this, with_mask ? tr("Export result and mask") : tr("Export result"),
                                                    suggestion, tr("PNG (*.png);;TIFF (*.tif *.tiff);;OpenEXR (*.exr)"));
  if (path.isEmpty()) return;
  const QString error = exportImage(image, file, path, with_mask);
  if (error.isEmpty()) {
    showMessage(with_mask ? tr("Exported %1 and %2").arg(path, mask_path_for(path)) : tr("Exported %1").arg(path), false);
  } else {
    showMessage(error, true);
  }
}

void MainWindow::dragEnterEvent(QDragEnterEvent* event) {
  if (!event->mimeData()->hasUrls()) return;
  for (const QUrl& url : event->mimeData()->urls()) {
    if (url.isLocalFile() && readable_extensions().contains(QFileInfo(url.toLocalFile()).suffix().toLower())) {
      event->acceptProposedAction();
      return;
    }
  }
}

void MainWindow::dropEvent(QDropEvent* event) {
  for (const QUrl& url : event->mimeData()->urls()) {
    if (url.isLocalFile() && openImage(url.toLocalFile())) {
      event->acceptProposedAction();
      return;
    }
  }
}

void MainWindow::closeEvent(QCloseEvent* event) {
  controller_->cancel();
  QMainWindow::closeEvent(event);
}

}  // namespace infill::ui
