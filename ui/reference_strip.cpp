#include <infill_protocol/edit_parameters.h>

#include "ui/reference_strip.h"

#include <QCryptographicHash>
#include <QDragEnterEvent>
#include <QDropEvent>
#include <QFileDialog>
#include <QFileInfo>
#include <QHBoxLayout>
#include <QLabel>
#include <QMimeData>
#include <QPushButton>
#include <QToolButton>
#include <QUrl>
#include <QVBoxLayout>

#include "ui/image_io.h"

namespace infill::ui {

namespace {

constexpr int kThumbnailPx = 56;

}  // namespace

int ReferenceStrip::maximumCount() {
  return static_cast<int>(infill::protocol::edit_parameter("references").max_length);
}

ReferenceStrip::ReferenceStrip(QWidget* parent) : QWidget(parent) {
  setObjectName(QStringLiteral("references"));
  setAcceptDrops(true);
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);
  thumbs_ = new QHBoxLayout;
  thumbs_->setContentsMargins(0, 0, 0, 0);
  thumbs_->addStretch(1);
  layout->addLayout(thumbs_);
  auto* row = new QHBoxLayout;
  hint_ = new QLabel(this);
  hint_->setWordWrap(true);
  row->addWidget(hint_, 1);
  add_ = new QPushButton(tr("Add..."), this);
  add_->setObjectName(QStringLiteral("add_reference"));
  add_->setToolTip(tr("Add reference images the edits condition on (FLUX.2 models); you can also drop image files here"));
  row->addWidget(add_);
  layout->addLayout(row);
  connect(add_, &QPushButton::clicked, this, &ReferenceStrip::chooseFiles);
  updateHint();
}

void ReferenceStrip::setEngine(EngineConnection* engine) {
  if (engine_) disconnect(engine_, nullptr, this, nullptr);
  engine_ = engine;
  if (!engine_) return;
  connect(engine_, &EngineConnection::templateRegistered, this, &ReferenceStrip::onRegistered);
  connect(engine_, &EngineConnection::templateFailed, this, &ReferenceStrip::onFailed);
  connect(engine_, &EngineConnection::stateChanged, this, [this](EngineConnection::State s) {
    // Template ids do not survive an engine restart: upload again. The ids stay the same (the
    // SHA-256 of the same bytes).
    if (s == EngineConnection::State::Connected) uploadAll();
  });
  uploadAll();
}

bool ReferenceStrip::addFile(const QString& path) {
  const QFileInfo info(path);
  if (count() >= maximumCount()) {
    emit message(tr("At most %1 reference images per edit; remove one before adding %2").arg(maximumCount()).arg(info.fileName()),
                 true);
    return false;
  }
  const LoadedImage loaded = load_image(path);
  if (!loaded.error.isEmpty()) {
    emit message(tr("Not a reference image: %1").arg(loaded.error), true);
    return false;
  }
  Image image;
  image.path = info.absoluteFilePath();
  image.file = loaded.file;
  image.sha256 = QCryptographicHash::hash(loaded.file, QCryptographicHash::Sha256);
  for (const Image& other : images_) {
    if (other.sha256 == image.sha256) {
      emit message(tr("%1 is already a reference image (as %2)").arg(info.fileName(), QFileInfo(other.path).fileName()), true);
      return false;
    }
  }
  image.widget = new QWidget(this);
  image.widget->setObjectName(QStringLiteral("reference"));
  auto* box = new QVBoxLayout(image.widget);
  box->setContentsMargins(0, 0, 0, 0);
  box->setSpacing(2);
  auto* thumb = new QLabel(image.widget);
  thumb->setPixmap(QPixmap::fromImage(
      loaded.image.scaled(kThumbnailPx, kThumbnailPx, Qt::KeepAspectRatio, Qt::SmoothTransformation)));
  thumb->setFixedSize(kThumbnailPx, kThumbnailPx);
  thumb->setAlignment(Qt::AlignCenter);
  thumb->setToolTip(tr("%1\n%2x%3").arg(image.path).arg(loaded.image.width()).arg(loaded.image.height()));
  box->addWidget(thumb);
  auto* remove = new QToolButton(image.widget);
  remove->setObjectName(QStringLiteral("reference_remove"));
  remove->setText(QStringLiteral("\u00d7"));
  remove->setToolTip(tr("Remove this reference image"));
  box->addWidget(remove, 0, Qt::AlignHCenter);
  thumbs_->insertWidget(thumbs_->count() - 1, image.widget);  // before the stretch
  QWidget* widget = image.widget;
  connect(remove, &QToolButton::clicked, this, [this, widget] {
    for (int i = 0; i < images_.size(); ++i)
      if (images_[i].widget == widget) return removeAt(i);
  });
  images_.append(image);
  upload(images_.last());
  updateHint();
  return true;
}

void ReferenceStrip::removeAt(int index) {
  if (index < 0 || index >= images_.size()) return;
  const bool counted = !images_[index].id.isEmpty();
  images_[index].widget->deleteLater();
  images_.removeAt(index);
  updateHint();
  if (counted) emit changed();
}

int ReferenceStrip::pending() const {
  int n = 0;
  for (const Image& i : images_) n += i.id.isEmpty();
  return n;
}

QStringList ReferenceStrip::references() const {
  QStringList ids;
  for (const Image& i : images_)
    if (!i.id.isEmpty()) ids << i.id;
  return ids;
}

QList<ReferenceFile> ReferenceStrip::referenceFiles() const {
  QList<ReferenceFile> files;
  for (const Image& i : images_)
    if (!i.id.isEmpty()) files.push_back({i.id, QFileInfo(i.path).fileName(), i.file});
  return files;
}

void ReferenceStrip::upload(Image& image) {
  image.tag = engine_ && engine_->state() == EngineConnection::State::Connected
                  ? engine_->registerTemplate(QString(), image.file, QFileInfo(image.path).fileName())
                  : 0;  // waits for the engine
}

void ReferenceStrip::uploadAll() {
  for (Image& i : images_) upload(i);
  updateHint();
}

void ReferenceStrip::onRegistered(quint64 tag, const TemplateStatus& status) {
  for (Image& i : images_) {
    if (i.tag != tag) continue;
    i.tag = 0;
    i.id = status.id;
    updateHint();
    emit changed();
    return;
  }
}

void ReferenceStrip::onFailed(quint64 tag, const QString& text) {
  for (int n = 0; n < images_.size(); ++n) {
    Image& i = images_[n];
    if (i.tag != tag) continue;
    i.tag = 0;
    // A lost engine is not the image's fault: it goes up again on reconnection.
    if (!engine_ || engine_->state() != EngineConnection::State::Connected) return;
    emit message(tr("Reference image %1 refused: %2").arg(QFileInfo(i.path).fileName(), text), true);
    removeAt(n);
    return;
  }
}

void ReferenceStrip::updateHint() {
  const int waiting = pending();
  hint_->setText(images_.isEmpty() ? tr("Drop reference images here (FLUX.2 models)")
                 : waiting > 0     ? tr("%1 of %2 uploading...").arg(waiting).arg(count())
                                   : tr("%1 of at most %2").arg(count()).arg(maximumCount()));
  add_->setEnabled(count() < maximumCount());
}

void ReferenceStrip::chooseFiles() {
  const QStringList paths = QFileDialog::getOpenFileNames(this, tr("Add reference images"), QString(), image_file_filter());
  for (const QString& p : paths)
    if (!addFile(p)) break;
}

void ReferenceStrip::dragEnterEvent(QDragEnterEvent* event) {
  // Any local file: one that is not an image is refused with a message at the drop, rather
  // than silently.
  if (!event->mimeData()->hasUrls()) return;
  for (const QUrl& url : event->mimeData()->urls()) {
    if (url.isLocalFile()) {
      event->acceptProposedAction();
      return;
    }
  }
}

void ReferenceStrip::dropEvent(QDropEvent* event) {
  bool files = false;
  for (const QUrl& url : event->mimeData()->urls()) {
    if (!url.isLocalFile()) continue;
    files = true;
    if (!addFile(url.toLocalFile())) break;
  }
  // Taken even when refused (the message says why): an ignored drop would go on to the main
  // window, which opens dropped images as the picture to edit.
  if (files) event->acceptProposedAction();
}

}  // namespace infill::ui
