#pragma once
/// @file
/// The LoRAs of the next edits, in the parameters panel.

#include <QList>
#include <QPointer>
#include <QString>
#include <QWidget>

#include "ui/engine_connection.h"

class QDoubleSpinBox;
class QLabel;
class QPushButton;
class QToolButton;
class QVBoxLayout;

namespace infill::ui {

/// A list of LoRA files, each with a strength spin box (the parameter table's range) and a
/// remove button, at most the table's `adapters` max_length. A file added here is uploaded to
/// the engine (POST /v1/adapters) for the selected model, which reads it before keeping it: a
/// file that model cannot use is refused, the row goes and message() says why, naming the file
/// and the engine's reason. Rows are uploaded again when the engine (re)connects and when the
/// model changes (the engine keeps the same bytes once, so that costs a transfer only); a row
/// the new model refuses stays, marked, and an edit naming it is refused by the engine.
///
/// Threading: GUI thread only (uploads run on EngineConnection's pool).
class AdapterList : public QWidget {
  Q_OBJECT

 public:
  explicit AdapterList(QWidget* parent = nullptr);

  /// The engine files are uploaded to; rows added before it connects wait for it.
  void setEngine(EngineConnection* engine);
  /// The model edits run on ("" = the engine's default): rows are read for it.
  void setModel(const QString& model_id);

  /// Adds the LoRA file at `path` and uploads it. False, with message(), when the list is full
  /// or the file does not exist.
  bool addFile(const QString& path);
  /// Removes row `row` (0-based).
  void removeAt(int row);
  int count() const { return static_cast<int>(rows_.size()); }
  /// Rows whose upload has not answered yet (waiting for the engine, or running).
  int pending() const;
  /// The uploaded LoRAs and their strengths, in order (rows still uploading left out).
  QList<AdapterChoice> adapters() const;
  /// Row `row`'s strength box (for tests and keyboard focus).
  QDoubleSpinBox* strengthBox(int row) const;
  /// The most rows: the parameter table's max_length of `adapters`.
  static int maximumCount();

 signals:
  /// The edits' adapters changed (a row uploaded, removed, or its strength set).
  void changed();
  void message(const QString& text, bool error);

 private:
  struct Row {
    QString path;
    QString id;        // "" until uploaded
    quint64 tag = 0;   // the upload in flight, 0 = none
    QString refusal;   // the engine's reason when the current model refused it
    QWidget* widget = nullptr;
    QLabel* label = nullptr;
    QDoubleSpinBox* strength = nullptr;
  };
  void upload(Row& row);
  void uploadAll();
  void scheduleUpload();
  void onUploaded(quint64 tag, const AdapterStatus& status);
  void onFailed(quint64 tag, const QString& message);
  void updateRow(const Row& row);
  void chooseFile();

  QPointer<EngineConnection> engine_;
  QString model_;
  QList<Row> rows_;
  QVBoxLayout* rows_layout_ = nullptr;
  QPushButton* add_ = nullptr;
  bool upload_scheduled_ = false;
};

}  // namespace infill::ui
