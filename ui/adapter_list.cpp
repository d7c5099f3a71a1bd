#include <infill_protocol/edit_parameters.h>

#include "ui/adapter_list.h"

#include <QDoubleSpinBox>
#include <QFileDialog>
#include <QFileInfo>
#include <QHBoxLayout>
#include <QLabel>
#include <QPushButton>
#include <QToolButton>
#include <QVBoxLayout>

namespace infill::ui {

namespace {

const infill::protocol::EditParameter& adapters_parameter() { return infill::protocol::edit_parameter("adapters"); }

}  // namespace

int AdapterList::maximumCount() { return static_cast<int>(adapters_parameter().max_length); }

AdapterList::AdapterList(QWidget* parent) : QWidget(parent) {
  setObjectName(QStringLiteral("adapters"));
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);
  rows_layout_ = new QVBoxLayout;
  rows_layout_->setContentsMargins(0, 0, 0, 0);
  layout->addLayout(rows_layout_);
  add_ = new QPushButton(tr("Add LoRA..."), this);
  add_->setObjectName(QStringLiteral("add_adapter"));
  add_->setToolTip(tr("Apply a LoRA (.safetensors) to the edits: it is uploaded to the engine, which checks that the "
                      "model can use it (FLUX.2 models)"));
  layout->addWidget(add_);
  connect(add_, &QPushButton::clicked, this, &AdapterList::chooseFile);
}

void AdapterList::setEngine(EngineConnection* engine) {
  if (engine_) disconnect(engine_, nullptr, this, nullptr);
  engine_ = engine;
  if (!engine_) return;
  connect(engine_, &EngineConnection::adapterUploaded, this, &AdapterList::onUploaded);
  connect(engine_, &EngineConnection::adapterFailed, this, &AdapterList::onFailed);
  connect(engine_, &EngineConnection::stateChanged, this, [this](EngineConnection::State s) {
    // A (re)started engine may not hold the files: upload them again (the same bytes are one
    // adapter, so an engine that kept them only answers).
    if (s == EngineConnection::State::Connected) scheduleUpload();
  });
  scheduleUpload();
}

void AdapterList::setModel(const QString& model_id) {
  if (model_id == model_) return;
  model_ = model_id;
  scheduleUpload();
}

void AdapterList::scheduleUpload() {
  // Queued, so that a connection and the model list it brings upload each file once.
  if (upload_scheduled_) return;
  upload_scheduled_ = true;
  QMetaObject::invokeMethod(this, [this] {
    upload_scheduled_ = false;
    uploadAll();
  }, Qt::QueuedConnection);
}

bool AdapterList::addFile(const QString& path) {
  const QFileInfo info(path);
  if (count() >= maximumCount()) {
    emit message(tr("At most %1 LoRAs per edit; remove one before adding %2").arg(maximumCount()).arg(info.fileName()), true);
    return false;
  }
  if (!info.isFile()) {
    emit message(tr("LoRA file %1 does not exist").arg(path), true);
    return false;
  }
  Row row;
  row.path = info.absoluteFilePath();
  row.widget = new QWidget(this);
  auto* line = new QHBoxLayout(row.widget);
  line->setContentsMargins(0, 0, 0, 0);
  row.label = new QLabel(info.fileName(), row.widget);
  row.label->setObjectName(QStringLiteral("adapter_name"));
  line->addWidget(row.label, 1);
  row.strength = new QDoubleSpinBox(row.widget);
  row.strength->setObjectName(QStringLiteral("adapter_strength"));
  // The table's range, so the editor never offers a strength the engine refuses.
  row.strength->setRange(infill::protocol::editor_min(adapters_parameter()), infill::protocol::editor_max(adapters_parameter()));
  row.strength->setSingleStep(0.1);
  row.strength->setValue(1.0);
  row.strength->setToolTip(tr("How strongly the LoRA applies (negative subtracts it)"));
  line->addWidget(row.strength);
  auto* remove = new QToolButton(row.widget);
  remove->setObjectName(QStringLiteral("adapter_remove"));
  remove->setText(QStringLiteral("\u00d7"));
  remove->setToolTip(tr("Remove this LoRA"));
  line->addWidget(remove);
  rows_layout_->addWidget(row.widget);
  QWidget* widget = row.widget;
  connect(row.strength, qOverload<double>(&QDoubleSpinBox::valueChanged), this, [this] { emit changed(); });
  connect(remove, &QToolButton::clicked, this, [this, widget] {
    for (int i = 0; i < rows_.size(); ++i)
      if (rows_[i].widget == widget) return removeAt(i);
  });
  rows_.append(row);
  upload(rows_.last());
  add_->setEnabled(count() < maximumCount());
  return true;
}

void AdapterList::removeAt(int row) {
  if (row < 0 || row >= rows_.size()) return;
  const bool counted = !rows_[row].id.isEmpty();
  rows_[row].widget->deleteLater();
  rows_.removeAt(row);
  add_->setEnabled(count() < maximumCount());
  if (counted) emit changed();
}

int AdapterList::pending() const {
  int n = 0;
  for (const Row& r : rows_) n += r.id.isEmpty();
  return n;
}

QList<AdapterChoice> AdapterList::adapters() const {
  QList<AdapterChoice> out;
  for (const Row& r : rows_)
    if (!r.id.isEmpty()) out.append({r.id, r.strength->value(), r.path});
  return out;
}

QDoubleSpinBox* AdapterList::strengthBox(int row) const {
  return row >= 0 && row < rows_.size() ? rows_[row].strength : nullptr;
}

void AdapterList::upload(Row& row) {
  if (!engine_ || engine_->state() != EngineConnection::State::Connected) {
    row.tag = 0;  // waits for the engine
  } else {
    row.tag = engine_->uploadAdapter(row.path, model_);
  }
  updateRow(row);
}

void AdapterList::uploadAll() {
  for (Row& r : rows_) upload(r);
}

void AdapterList::onUploaded(quint64 tag, const AdapterStatus& status) {
  for (Row& r : rows_) {
    if (r.tag != tag) continue;
    r.tag = 0;
    r.id = status.id;
    r.refusal.clear();
    updateRow(r);
    r.label->setToolTip(tr("%1\n%2 LoRA, rank %3, %4 layers").arg(r.path, status.format).arg(status.max_rank).arg(status.layers));
    emit changed();
    return;
  }
}

void AdapterList::onFailed(quint64 tag, const QString& text) {
  for (int i = 0; i < rows_.size(); ++i) {
    Row& r = rows_[i];
    if (r.tag != tag) continue;
    r.tag = 0;
    const QString name = QFileInfo(r.path).fileName();
    if (!engine_ || engine_->state() != EngineConnection::State::Connected) {
      // The engine went away: not the file's fault; it is uploaded again on reconnection.
      updateRow(r);
      return;
    }
    if (r.id.isEmpty()) {
      // Never accepted: the file is no LoRA this model can use.
      emit message(tr("LoRA %1 refused: %2").arg(name, text), true);
      removeAt(i);
      return;
    }
    // Accepted for an earlier model: kept (the user may switch back), marked.
    r.refusal = text;
    updateRow(r);
    emit message(tr("LoRA %1 does not fit the selected model: %2").arg(name, text), true);
    return;
  }
}

void AdapterList::updateRow(const Row& r) {
  const QString name = QFileInfo(r.path).fileName();
  if (!r.refusal.isEmpty()) {
    r.label->setText(tr("%1 (does not fit the model)").arg(name));
    r.label->setStyleSheet(QStringLiteral("color: #e04050;"));
    r.label->setToolTip(r.refusal);
    return;
  }
  r.label->setStyleSheet(QString());
  r.label->setText(r.id.isEmpty() ? tr("%1 (uploading...)").arg(name) : name);
  if (r.id.isEmpty()) r.label->setToolTip(r.path);
}

void AdapterList::chooseFile() {
  const QString path =
      QFileDialog::getOpenFileName(this, tr("Add a LoRA"), QString(), tr("LoRA files (*.safetensors);;All files (*)"));
  if (!path.isEmpty()) addFile(path);
}

}  // namespace infill::ui
