#pragma once
/// @file
/// The editor's main window: canvas, tools, parameters, results, engine status.

#include <QMainWindow>
#include <QUndoStack>

#include "ui/canvas_view.h"
#include "ui/edit_controller.h"
#include "ui/engine_connection.h"
#include "ui/mask_document.h"
#include "ui/parameters_panel.h"
#include "ui/results_strip.h"

class QAction;
class QActionGroup;
class QCheckBox;
class QLabel;
class QMenu;
class QProgressBar;
class QPushButton;
class QSlider;

namespace infill::ui {

class MainWindow : public QMainWindow {
  Q_OBJECT

 public:
  explicit MainWindow(QWidget* parent = nullptr);
  ~MainWindow() override;

  /// Opens an image file; false (and a status-bar message) when it cannot be read.
  bool openImage(const QString& path);
  /// Connects (or reconnects) to an engine.
  void connectEngine(const EngineOptions& options);

  /// Writes `image` (PNG, TIFF, EXR by extension) and, with `with_mask`, the mask next to it
  /// as <name>_mask.png. Returns "" on success, else why.
  /// Writes `file` (full depth) to `path`, or `image` when there is no file.
  QString exportImage(const QImage& image, const QByteArray& file, const QString& path, bool with_mask);
  /// Puts a result into the canvas as one undoable step.
  void applyResult(const GenerationResult& result);

  // Parts, for tests and for main().
  MaskDocument* maskDocument() const { return mask_; }
  CanvasView* canvas() const { return canvas_; }
  ParametersPanel* parameters() const { return params_; }
  ResultsStrip* results() const { return results_; }
  EditController* controller() const { return controller_; }
  EngineConnection* engine() const { return engine_; }
  QUndoStack* undoStack() const { return undo_; }
  QAction* action(const QString& name) const;
  QString currentPath() const { return path_; }
  /// The picture's file at full depth: the opened file's bytes, or an applied result's.
  QByteArray documentFile() const { return document_file_; }

 protected:
  void dragEnterEvent(QDragEnterEvent* event) override;
  void dropEvent(QDropEvent* event) override;
  void closeEvent(QCloseEvent* event) override;

 private:
  void createActions();
  void createMenus();
  void createPanels();
  void updateRecentMenu();
  void addRecent(const QString& path);
  void showMessage(const QString& text, bool error);
  void setImageInternal(const QImage& image, const QByteArray& file);
  void updateActions();
  void selectTool(CanvasView::Tool tool);
  void changeBrushSize(double factor);
  void changeHardness(double delta);
  void onResult(const GenerationResult& result);
  void showSelectedResult();
  void onEngineState(EngineConnection::State state, const QString& message);
  void exportDialog(bool with_mask);
  void connectDialog();
  QAction* makeAction(const QString& name, const QString& text, const QKeySequence& key = {});

  QUndoStack* undo_;
  MaskDocument* mask_;
  EngineConnection* engine_;
  EditController* controller_;
  CanvasView* canvas_;
  ParametersPanel* params_;
  ResultsStrip* results_;
  QSlider* split_slider_ = nullptr;
  QSlider* brush_size_ = nullptr;
  QSlider* hardness_ = nullptr;
  QSlider* opacity_ = nullptr;
  QPushButton* generate_button_ = nullptr;
  QPushButton* cancel_button_ = nullptr;
  QPushButton* apply_button_ = nullptr;
  QCheckBox* live_box_ = nullptr;
  QProgressBar* progress_ = nullptr;
  QLabel* latency_label_ = nullptr;
  QLabel* engine_label_ = nullptr;
  QLabel* template_label_ = nullptr;
  QLabel* zoom_label_ = nullptr;
  QLabel* message_label_ = nullptr;
  QMenu* recent_menu_ = nullptr;
  QActionGroup* tools_ = nullptr;
  QList<QAction*> actions_;
  QString path_;
  QByteArray document_file_;  // the picture's file at full depth (opened, or the applied result's)
  EngineOptions engine_options_;
};

}  // namespace infill::ui
