#pragma once
/// @file
/// The reference images of the next edits, in the parameters panel.

#include <QByteArray>
#include <QList>
#include <QPointer>
#include <QString>
#include <QStringList>
#include <QWidget>

#include "ui/engine_connection.h"

class QHBoxLayout;
class QLabel;
class QPushButton;

namespace infill::ui {

/// A strip of reference images (FLUX.2 models condition an edit on them): image files dropped
/// on it or added with its button, shown as thumbnails with a remove button, at most the
/// parameter table's `references` max_length and no two with the same bytes (the engine's
/// template ids would repeat). Each is read with OpenImageIO (a file that is not a readable
/// image is refused with message()), uploaded as a template (POST /v1/templates), and sent as
/// the edits' `references`; the engine checks its size when an edit names it. Uploaded again
/// when the engine (re)connects, since template ids do not survive an engine restart.
///
/// Threading: GUI thread only (uploads run on EngineConnection's pool).
class ReferenceStrip : public QWidget {
  Q_OBJECT

 public:
  explicit ReferenceStrip(QWidget* parent = nullptr);

  void setEngine(EngineConnection* engine);

  /// Adds the image file at `path` and uploads it. False, with message(), when the strip is
  /// full, the file is not a readable image, or the strip holds the same image already.
  bool addFile(const QString& path);
  void removeAt(int index);
  int count() const { return static_cast<int>(images_.size()); }
  /// Images whose upload has not answered yet.
  int pending() const;
  /// The uploaded images' template ids, in order (images still uploading left out).
  QStringList references() const;
  /// The uploaded images' ids with their files, in order: what an edit uploads again when the
  /// engine no longer knows one.
  QList<ReferenceFile> referenceFiles() const;
  /// The most images: the parameter table's max_length of `references`.
  static int maximumCount();

 signals:
  /// The edits' references changed (an image uploaded or removed).
  void changed();
  void message(const QString& text, bool error);

 protected:
  void dragEnterEvent(QDragEnterEvent* event) override;
  void dropEvent(QDropEvent* event) override;

 private:
  struct Image {
    QString path;
    QByteArray file;  // the bytes uploaded (again after a reconnect)
    QByteArray sha256;
    QString id;       // "" until uploaded
    quint64 tag = 0;  // the upload in flight, 0 = none
    QWidget* widget = nullptr;
  };
  void upload(Image& image);
  void uploadAll();
  void onRegistered(quint64 tag, const TemplateStatus& status);
  void onFailed(quint64 tag, const QString& message);
  void chooseFiles();
  void updateHint();

  QPointer<EngineConnection> engine_;
  QList<Image> images_;
  QHBoxLayout* thumbs_ = nullptr;
  QLabel* hint_ = nullptr;
  QPushButton* add_ = nullptr;
};

}  // namespace infill::ui
