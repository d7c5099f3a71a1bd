#include "ui/edit_controller.h"

#include <QBuffer>
#include <QFileInfo>
#include <QRandomGenerator>

#include <algorithm>
#include <cmath>
#include <utility>

namespace infill::ui {

namespace {

// The engine decodes previews of the mask's box aligned to the autoencoder's factor, with
// this many latent pixels of context (engine/serving/worker.cpp).
constexpr int kLatentFactor = 8;
constexpr int kPreviewMarginLatent = 2;

}  // namespace

EditController::EditController(EngineConnection* engine, MaskDocument* mask, QObject* parent)
    : QObject(parent), engine_(engine), mask_(mask) {
  qRegisterMetaType<GenerationResult>();
  debounce_.setSingleShot(true);
  debounce_.setInterval(kDefaultLiveDebounceMs);
  connect(&debounce_, &QTimer::timeout, this, &EditController::submitLive);
  // A new stroke began: the mask it leaves is the one worth an edit, so the wait restarts at
  // its end instead of submitting now.
  connect(mask_, &MaskDocument::maskChanged, this, [this] {
    if (mask_->strokeActive()) debounce_.stop();
  });
  // The template's preparation runs on the engine after the first edit; poll its state until
  // it is prepared, so the status bar can say when edits become fast.
  template_poll_.setInterval(1000);
  connect(&template_poll_, &QTimer::timeout, this, [this] {
    if (template_.id.isEmpty() || template_.state == INFILL_TEMPLATE_PREPARED) {
      template_poll_.stop();
      return;
    }
    engine_->refreshTemplate(template_.id);
  });

  connect(engine_, &EngineConnection::stateChanged, this,
          [this](EngineConnection::State s, const QString&) { onEngineState(s); });
  connect(engine_, &EngineConnection::templateRegistered, this, &EditController::onTemplateRegistered);
  connect(engine_, &EngineConnection::templateFailed, this, &EditController::onTemplateFailed);
  connect(engine_, &EngineConnection::templateStatus, this, &EditController::onTemplateStatus);
  connect(engine_, &EngineConnection::editProgress, this, &EditController::onProgress);
  connect(engine_, &EngineConnection::editPreview, this, &EditController::onPreview);
  connect(engine_, &EngineConnection::editFinished, this, &EditController::onFinished);
  connect(engine_, &EngineConnection::editRejected, this, &EditController::onRejected);
  connect(engine_, &EngineConnection::adapterUploaded, this, &EditController::onAdapterUploaded);
  connect(engine_, &EngineConnection::adapterFailed, this, &EditController::onAdapterFailed);
  connect(mask_, &MaskDocument::editCommitted, this, &EditController::onMaskEdited);
}

QString EditController::templateStateText() const {
  if (template_tag_ != 0) return tr("uploading");
  if (template_.id.isEmpty()) return tr("not registered");
  switch (template_.state) {
    case INFILL_TEMPLATE_READY: return tr("ready (prepared by the first edit)");
    case INFILL_TEMPLATE_PREPARING: return tr("preparing");
    case INFILL_TEMPLATE_PREPARED: return tr("prepared");
  }
  return tr("unknown");
}

void EditController::setImage(const QImage& image, const QByteArray& file, const QString& name) {
  image_ = image;
  name_ = name;
  encoded_ = file;
  if (encoded_.isEmpty() && !image.isNull()) {
    QBuffer buffer(&encoded_);
    buffer.open(QIODevice::WriteOnly);
    image.save(&buffer, "PNG");
  }
  template_ = TemplateStatus{};
  template_tag_ = 0;
  template_dirty_ = true;
  template_poll_.stop();
  if (engine_->state() == EngineConnection::State::Connected) uploadTemplate();
  emit templateStateChanged(templateStateText());
}

void EditController::uploadTemplate() {
  if (image_.isNull()) return;
  const QString name = name_.isEmpty() ? QStringLiteral("edited") : name_;
  template_tag_ = engine_->registerTemplate(QString(), encoded_, name);
  emit templateStateChanged(templateStateText());
}

void EditController::onEngineState(EngineConnection::State state) {
  if (state == EngineConnection::State::Reconnecting && !template_dirty_) {
    // Template ids do not survive an engine restart: upload the image again once it is back.
    template_dirty_ = true;
    template_ = TemplateStatus{};
    template_poll_.stop();
    emit templateStateChanged(templateStateText());
  }
  if (state == EngineConnection::State::Connected && template_dirty_ && template_tag_ == 0) uploadTemplate();
}

void EditController::onTemplateRegistered(quint64 tag, const TemplateStatus& status) {
  if (onReferenceRegistered(tag, status)) return;
  if (tag != template_tag_) return;  // an older image's upload
  template_tag_ = 0;
  template_dirty_ = false;
  template_ = status;
  ++template_epoch_;
  if (status.state != INFILL_TEMPLATE_PREPARED) template_poll_.start();
  emit templateStateChanged(templateStateText());
  if (generate_waiting_ && !uploadsRunning()) {
    generate_waiting_ = false;
    submitBatch();
  }
}

void EditController::onTemplateFailed(quint64 tag, const QString& text) {
  if (onReferenceFailed(tag, text)) return;
  if (tag != template_tag_) return;
  template_tag_ = 0;
  generate_waiting_ = false;
  emit templateStateChanged(templateStateText());
  emit message(tr("Could not register the image with the engine: %1").arg(text), true);
}

void EditController::onTemplateStatus(const TemplateStatus& status) {
  if (status.id != template_.id) return;
  const bool changed = status.state != template_.state;
  template_ = status;
  if (status.state == INFILL_TEMPLATE_PREPARED) template_poll_.stop();
  if (changed) emit templateStateChanged(templateStateText());
}

EditSubmission EditController::baseSubmission(quint64 seed) const {
  EditSubmission s;
  s.template_id = template_.id;
  s.model = params_.model_id;
  s.mask = mask_->mask();
  s.prompt = params_.prompt;
  s.seed = seed;
  s.steps = params_.steps;
  s.strength = params_.strength;
  s.guidance = params_.guidance;
  s.feather_px = params_.feather_px;
  s.adapters = params_.adapters;
  s.references = params_.references;
  const int steps = params_.steps > 0 ? params_.steps : 16;
  s.preview_every_steps = std::max(1, steps / 6);
  return s;
}

bool EditController::generate() {
  if (image_.isNull()) {
    emit message(tr("Open an image first"), true);
    return false;
  }
  if (mask_->isEmpty()) {
    emit message(tr("Paint a mask over the region to repaint first"), true);
    return false;
  }
  if (engine_->state() != EngineConnection::State::Connected) {
    emit message(tr("The engine is not connected: %1").arg(engine_->stateMessage()), true);
    return false;
  }
  template_retried_ = false;
  if (template_dirty_ || template_tag_ != 0) {
    generate_waiting_ = true;
    if (template_tag_ == 0) uploadTemplate();
    emit message(tr("Registering the image with the engine..."), false);
    return true;
  }
  if (!adapter_uploads_.empty() || !reference_uploads_.empty()) {
    generate_waiting_ = true;  // submitted once the files are back on the engine
    emit message(!adapter_uploads_.empty()
                     ? tr("Uploading the LoRA files to the engine again...")
                     : tr("Uploading the reference images to the engine again..."),
                 false);
    return true;
  }
  return submitBatch();
}

bool EditController::submitBatch() {
  if (params_.random_seed) params_.seed = QRandomGenerator::global()->bounded(1u << 31);
  const int n = std::max(1, params_.variations);
  const bool was_busy = busy();
  if (!was_busy) batch_clock_.start();
  for (int i = 0; i < n; ++i) {
    const quint64 seed = params_.seed + static_cast<quint64>(i);
    const quint64 tag = engine_->submitEdit(baseSubmission(seed));
    Pending& p = pending_[tag];
    p.result.mask = mask_->mask();
    p.result.prompt = params_.prompt;
    p.result.seed = seed;
    p.template_epoch = template_epoch_;
    p.adapters_uploaded_again = adapters_uploaded_again_;
    p.references_uploaded_again = references_uploaded_again_;
    p.clock.start();
    batch_.insert(tag);
  }
  if (!was_busy) emit busyChanged(true);
  emit message(tr("Generating %n variation(s)...", nullptr, n), false);
  return true;
}

void EditController::cancel() {
  generate_waiting_ = false;
  live_waiting_ = false;
  debounce_.stop();
  for (quint64 tag : batch_) engine_->cancelEdit(tag);
  if (live_tag_ != 0 && pending_.count(live_tag_)) engine_->cancelEdit(live_tag_);
}

void EditController::setLiveMode(bool on) {
  live_ = on;
  if (on) {
    live_stats_ = LiveStats{};
  } else {
    debounce_.stop();
    if (live_tag_ != 0 && pending_.count(live_tag_)) engine_->cancelEdit(live_tag_);
  }
}

void EditController::onMaskEdited() {
  if (!live_) return;
  // Latency counts from the end of the last stroke, the moment the painter waits from.
  live_edit_clock_.start();
  debounce_.start();
}

void EditController::submitLive() {
  if (!live_ || image_.isNull() || mask_->isEmpty() || engine_->state() != EngineConnection::State::Connected) return;
  if (mask_->strokeActive()) return;  // a half-painted mask; the stroke's end submits
  if (template_dirty_ || template_tag_ != 0) {
    // Submitted once the upload is done (onTemplateRegistered runs a Generate only for
    // explicit requests, so retry from here).
    if (template_tag_ == 0) uploadTemplate();
    debounce_.start();
    return;
  }
  if (!adapter_uploads_.empty() || !reference_uploads_.empty()) {
    live_waiting_ = true;  // submitted once the files are back on the engine
    return;
  }
  EditSubmission s = baseSubmission(params_.seed);
  s.edit_class = INFILL_CLASS_LIVE;
  // The engine sends a live edit's first preview right after its first step (the first sight
  // of the region is what the painter waits for); after that one every 3 steps, since each
  // preview (crop decode, PNG) takes CPU from the denoising steps that must fit the deadline.
  s.preview_every_steps = 3;
  // The previous live edit is stale the moment the mask changed again: the engine cancels it
  // at its next step instead of finishing work nobody will look at.
  if (live_tag_ != 0 && pending_.count(live_tag_)) s.supersedes_tag = live_tag_;
  live_tag_ = engine_->submitEdit(s);
  Pending& p = pending_[live_tag_];
  p.result.mask = s.mask;
  p.result.prompt = s.prompt;
  p.result.seed = s.seed;
  p.live = true;
  p.template_epoch = template_epoch_;
  p.adapters_uploaded_again = adapters_uploaded_again_;
  p.references_uploaded_again = references_uploaded_again_;
  p.clock.start();
  ++live_stats_.submitted;
}

void EditController::onProgress(quint64 tag, int done, int total) {
  auto it = pending_.find(tag);
  if (it == pending_.end()) return;
  it->second.steps_done = done;
  it->second.steps_total = total;
  if (batch_.count(tag)) {
    int sum_done = 0, sum_total = 0;
    for (quint64 t : batch_) {
      const Pending& p = pending_[t];
      const int p_total = p.steps_total > 0 ? p.steps_total : total;
      sum_done += p.steps_done;
      sum_total += p_total;
    }
    const double elapsed_s = batch_clock_.elapsed() / 1000.0;
    const double eta_s = sum_done > 0 ? elapsed_s * (sum_total - sum_done) / sum_done : -1.0;
    emit progressChanged(sum_done, sum_total, eta_s);
  } else if (tag == live_tag_) {
    emit progressChanged(done, total, -1.0);
  }
}

QRect EditController::previewRect(const QImage& preview) const {
  const QRect bounds = mask_bounds(mask_->mask());
  if (bounds.isEmpty()) return {};
  const QSize model = template_.model_size.isValid() && !template_.model_size.isEmpty() ? template_.model_size : image_.size();
  const double sx = double(model.width()) / image_.width(), sy = double(model.height()) / image_.height();
  const int m = kLatentFactor * kPreviewMarginLatent;
  auto down = [](double v) { return int(std::floor(v / kLatentFactor)) * kLatentFactor; };
  auto up = [](double v) { return int(std::ceil(v / kLatentFactor)) * kLatentFactor; };
  const int x0 = std::max(0, down(bounds.left() * sx) - m), y0 = std::max(0, down(bounds.top() * sy) - m);
  const int x1 = std::min(model.width(), up((bounds.right() + 1) * sx) + m);
  const int y1 = std::min(model.height(), up((bounds.bottom() + 1) * sy) + m);
  QRectF box(x0, y0, x1 - x0, y1 - y0);
  if (preview.size() != box.size().toSize()) {
    // Not the crop we expected (another margin rule): centre it on the mask's box instead.
    const QPointF c = box.center();
    box = QRectF(c.x() - preview.width() / 2.0, c.y() - preview.height() / 2.0, preview.width(), preview.height());
  }
  return QRectF(box.x() / sx, box.y() / sy, box.width() / sx, box.height() / sy).toAlignedRect();
}

void EditController::onPreview(quint64 tag, int, const QImage& preview) {
  if (preview.isNull() || !pending_.count(tag)) return;
  if (batch_.count(tag) || tag == live_tag_) emit previewArrived(preview, previewRect(preview));
}

void EditController::finishTag(quint64 tag) {
  pending_.erase(tag);
  if (batch_.erase(tag) && batch_.empty()) emit busyChanged(false);
}

void EditController::onFinished(quint64 tag, const EditOutcome& outcome) {
  auto it = pending_.find(tag);
  if (it == pending_.end()) return;
  Pending p = it->second;
  finishTag(tag);
  if (outcome.error_code == INFILL_ERROR_ENGINE_LOST && !template_dirty_ && p.template_epoch == template_epoch_) {
    // The engine went away or restarted: it may have forgotten the image too (unless the
    // image was uploaded again since this edit was submitted, e.g. after a reconnect).
    template_dirty_ = true;
    if (engine_->state() == EngineConnection::State::Connected && template_tag_ == 0) uploadTemplate();
  }
  GenerationResult r = p.result;
  r.image = outcome.result;
  r.file = outcome.result_file;
  r.engine_ms = outcome.engine_ms;
  r.live = p.live;
  r.latency_ms = p.live ? live_edit_clock_.elapsed() : p.clock.elapsed();
  if (p.live) {
    if (outcome.state == INFILL_JOB_CANCELLED) {
      ++live_stats_.superseded;
    } else if (tag != live_tag_) {
      ++live_stats_.stale;  // a newer edit is on its way; its result is the one to show
    } else if (outcome.state == INFILL_JOB_DONE) {
      ++live_stats_.results;
      live_stats_.last_latency_ms = r.latency_ms;
      emit resultArrived(r);
      emit liveLatency(r.latency_ms);
    } else {
      emit message(tr("Live edit failed: %1").arg(outcome.error), true);
    }
    return;
  }
  if (outcome.state == INFILL_JOB_DONE) {
    emit resultArrived(r);
    emit message(tr("Variation seed %1 done in %2 ms").arg(r.seed).arg(qRound(r.latency_ms)), false);
  } else if (outcome.state == INFILL_JOB_CANCELLED) {
    emit message(tr("Cancelled"), false);
  } else if (outcome.error_code == INFILL_ERROR_ENGINE_LOST) {
    emit message(tr("Edit lost: the engine went away while it ran; Generate again once it is back (%1)").arg(outcome.error), true);
  } else {
    emit message(tr("Edit failed: %1").arg(outcome.error), true);
  }
}

void EditController::onRejected(quint64 tag, const QString& text, const QString& engine_code) {
  auto it = pending_.find(tag);
  if (it == pending_.end()) return;
  const bool live = it->second.live;
  const bool retried = it->second.adapters_uploaded_again;
  const bool references_retried = it->second.references_uploaded_again;
  const bool in_batch = batch_.count(tag) > 0;
  finishTag(tag);
  if (engine_code == QLatin1String("unknown_adapter")) {
    // The engine's adapter store no longer holds a LoRA this editor uploaded (it restarted with
    // another store, or the adapter was deleted): upload the files again and submit once more,
    // once per edit. Not the image's fault, so not the template path below.
    const bool newest = in_batch || tag == live_tag_;
    if (newest && !retried && (!adapter_uploads_.empty() || uploadAdaptersAgain())) {
      if (in_batch) {
        for (quint64 t : std::set<quint64>(batch_)) finishTag(t);  // refused for the same reason
        generate_waiting_ = true;
      } else {
        live_waiting_ = true;
      }
      emit message(tr("The engine no longer holds a LoRA of the list (it restarted?); uploading "
                      "the files again..."),
                   false);
      return;
    }
    emit message((live ? tr("Live edit refused: %1") : tr("Edit refused: %1")).arg(text), true);
    return;
  }
  if (engine_code == QLatin1String("template_not_found") &&
      text.contains(QLatin1String("references["))) {
    // The engine no longer knows a reference image of the edit (evicted, or a restarted
    // engine): upload the images again and submit once more, once per edit. Not the image
    // the edits start from, so not the template path below.
    const bool newest = in_batch || tag == live_tag_;
    if (newest && !references_retried && (!reference_uploads_.empty() || uploadReferencesAgain())) {
      if (in_batch) {
        for (quint64 t : std::set<quint64>(batch_)) finishTag(t);  // refused for the same reason
        generate_waiting_ = true;
      } else {
        live_waiting_ = true;
      }
      emit message(tr("The engine no longer knows a reference image (evicted, or it restarted?); "
                      "uploading the images again..."),
                   false);
      return;
    }
    const QString name = referenceNamedIn(text);
    const QString why =
        name.isEmpty() ? text
                       : tr("reference image %1 is not known to the engine (%2)").arg(name, text);
    emit message((live ? tr("Live edit refused: %1") : tr("Edit refused: %1")).arg(why), true);
    return;
  }
  if (text.contains(QLatin1String("not_found"))) {
    // The engine evicted the template (or restarted): upload it again for the next edit.
    template_dirty_ = true;
    template_ = TemplateStatus{};
    if (in_batch && !template_retried_) {
      // Once per Generate: upload again and submit the batch anew (its other variations were
      // refused for the same reason).
      template_retried_ = true;
      for (quint64 t : std::set<quint64>(batch_)) finishTag(t);
      generate_waiting_ = true;
      if (template_tag_ == 0) uploadTemplate();
      emit message(tr("The engine no longer knows the image (it restarted?); uploading it again..."), false);
      return;
    }
  }
  emit message((live ? tr("Live edit refused: %1") : tr("Edit refused: %1")).arg(text), true);
}

bool EditController::uploadAdaptersAgain() {
  for (const AdapterChoice& a : params_.adapters) {
    if (a.file.isEmpty()) continue;
    bool running = false;
    for (const auto& [tag, file] : adapter_uploads_) running |= file == a.file;
    if (!running) adapter_uploads_[engine_->uploadAdapter(a.file, params_.model_id)] = a.file;
  }
  return !adapter_uploads_.empty();
}

void EditController::onAdapterUploaded(quint64 tag, const AdapterStatus& status) {
  auto it = adapter_uploads_.find(tag);
  if (it == adapter_uploads_.end()) return;  // the LoRA list's own upload
  // The same bytes are the same id; a file changed on disk since is a new one: send that.
  for (AdapterChoice& a : params_.adapters)
    if (a.file == it->second) a.id = status.id;
  adapter_uploads_.erase(it);
  if (adapter_uploads_.empty()) adaptersUploadedAgain();
}

void EditController::onAdapterFailed(quint64 tag, const QString& text) {
  auto it = adapter_uploads_.find(tag);
  if (it == adapter_uploads_.end()) return;
  adapter_upload_failure_ = tr("Could not upload LoRA %1 to the engine again: %2")
                                .arg(QFileInfo(it->second).fileName(), text);
  adapter_uploads_.erase(it);
  if (adapter_uploads_.empty()) adaptersUploadedAgain();
}

void EditController::adaptersUploadedAgain() { resubmitAfterUploads(adapter_upload_failure_, adapters_uploaded_again_); }

void EditController::resubmitAfterUploads(QString& failure, bool& uploaded_again) {
  if (!failure.isEmpty()) {
    generate_waiting_ = false;
    live_waiting_ = false;
    emit message(std::exchange(failure, QString()), true);
    return;
  }
  // What is submitted now is the one more try: refused again, it is not retried.
  uploaded_again = true;
  if (generate_waiting_ && !uploadsRunning()) {
    generate_waiting_ = false;
    submitBatch();
  }
  if (live_waiting_) {
    live_waiting_ = false;
    submitLive();
  }
  uploaded_again = false;
}

bool EditController::uploadReferencesAgain() {
  for (const ReferenceFile& r : params_.reference_files) {
    if (r.file.isEmpty() || !params_.references.contains(r.id)) continue;
    bool running = false;
    for (const auto& [tag, id] : reference_uploads_) running |= id == r.id;
    if (!running) reference_uploads_[engine_->registerTemplate(QString(), r.file, r.name)] = r.id;
  }
  return !reference_uploads_.empty();
}

bool EditController::onReferenceRegistered(quint64 tag, const TemplateStatus& status) {
  auto it = reference_uploads_.find(tag);
  if (it == reference_uploads_.end()) return false;  // the image's, or the strip's own upload
  // The same bytes are the same id; should the engine name them otherwise, send its id.
  for (QString& id : params_.references)
    if (id == it->second) id = status.id;
  for (ReferenceFile& r : params_.reference_files)
    if (r.id == it->second) r.id = status.id;
  reference_uploads_.erase(it);
  if (reference_uploads_.empty()) referencesUploadedAgain();
  return true;
}

bool EditController::onReferenceFailed(quint64 tag, const QString& text) {
  auto it = reference_uploads_.find(tag);
  if (it == reference_uploads_.end()) return false;
  if (reference_upload_failure_.isEmpty()) {
    QString name = it->second;
    for (const ReferenceFile& r : params_.reference_files)
      if (r.id == it->second) name = r.name;
    reference_upload_failure_ =
        tr("Could not upload reference image %1 to the engine again: %2").arg(name, text);
  }
  reference_uploads_.erase(it);
  if (reference_uploads_.empty()) referencesUploadedAgain();
  return true;
}

void EditController::referencesUploadedAgain() {
  resubmitAfterUploads(reference_upload_failure_, references_uploaded_again_);
}

QString EditController::referenceNamedIn(const QString& text) const {
  for (const ReferenceFile& r : params_.reference_files)
    if (!r.id.isEmpty() && text.contains(r.id)) return r.name;
  return {};
}

}  // namespace infill::ui
