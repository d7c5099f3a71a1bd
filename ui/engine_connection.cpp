#include "ui/engine_connection.h"

#include <QCoreApplication>
#include <QDir>
#include <QElapsedTimer>
#include <QFileInfo>
#include <QStandardPaths>

#include <string>
#include <vector>

namespace infill::ui {

namespace {

QString q(const std::string& s) { return QString::fromStdString(s); }

QString describe(const client::Error& e) {
  return QStringLiteral("%1 (%2)").arg(QString::fromUtf8(e.what()), QString::fromLatin1(e.code_name()));
}

TemplateStatus to_status(const client::TemplateInfo& t) {
  TemplateStatus s;
  s.id = q(t.id);
  s.size = QSize(static_cast<int>(t.width), static_cast<int>(t.height));
  s.model_size = QSize(static_cast<int>(t.model_width), static_cast<int>(t.model_height));
  s.state = t.state;
  s.edits_waiting = static_cast<int>(t.edits_waiting);
  return s;
}

QImage decode_png(const void* data, size_t size) {
  QImage image = QImage::fromData(static_cast<const uchar*>(data), static_cast<int>(size), "PNG");
  return image.isNull() ? image : image.convertToFormat(QImage::Format_RGBA8888);
}

}  // namespace

EngineConnection::EngineConnection(QObject* parent) : QObject(parent) {
  qRegisterMetaType<TemplateStatus>();
  qRegisterMetaType<EditOutcome>();
  // One thread: network calls keep their order (a cancel never overtakes its submit) and
  // jobs_ needs no lock.
  pool_.setMaxThreadCount(1);
}

EngineConnection::~EngineConnection() {
  // Tasks reference `this`; the client must outlive them, and its destruction runs the
  // last on_done callbacks, which post (harmlessly) to this object while it still exists.
  ++generation_;
  pool_.waitForDone();
  jobs_.clear();
  client_.reset();
  stopLocalEngine();
}

void EngineConnection::setState(State state, const QString& message) {
  state_ = state;
  state_message_ = message;
  emit stateChanged(state, message);
}

void EngineConnection::run(std::function<void(client::Client&)> task) {
  std::shared_ptr<client::Client> c = client_;
  if (!c) return;
  pool_.start([c, task = std::move(task)] { task(*c); });
}

void EngineConnection::connectToEngine(const EngineOptions& options) {
  options_ = options;
  // Answers still coming for the previous client are dropped by generation; no waiting here,
  // so reconnecting never blocks the UI on a slow engine.
  ++generation_;
  pool_.start([this] { jobs_.clear(); });
  models_.clear();
  endpoint_ = options.endpoint;
  if (endpoint_.isEmpty()) {
    std::string buffer(infill_default_endpoint(nullptr, 0) + 1, '\0');
    infill_default_endpoint(buffer.data(), buffer.size());
    endpoint_ = QString::fromStdString(buffer.c_str());
  }
  client::ClientOptions o;
  o.endpoint = endpoint_.toStdString();
  o.token = options.token.toStdString();
  o.connect_timeout_ms = 3000;
  try {
    client_ = std::make_shared<client::Client>(o);
  } catch (const client::Error& e) {
    client_.reset();
    setState(State::Failed, tr("Cannot use the engine address %1: %2").arg(endpoint_, describe(e)));
    return;
  }
  setState(State::Connecting, tr("Connecting to %1").arg(endpoint_));
  probe(false);
}

void EngineConnection::probe(bool after_start) {
  const int generation = generation_;
  const int ready_timeout_ms = options_.ready_timeout_ms;
  run([this, generation, after_start, ready_timeout_ms](client::Client& c) {
    QString failure;
    bool unreachable = false;
    QList<ModelDescription> models;
    try {
      client::Health h = after_start ? client::Health{} : c.health();
      if (after_start || !h.ready) {
        // Short waits, so that a failed engine start, a reconnect or the window closing
        // stops this task at once instead of after the whole timeout.
        QElapsedTimer clock;
        clock.start();
        for (;;) {
          try {
            c.wait_ready(250);
            break;
          } catch (const client::Error& e) {
            if (generation != generation_ || clock.elapsed() >= ready_timeout_ms) throw;
          }
        }
      }
      for (const client::ModelInfo& m : c.models()) {
        ModelDescription d;
        d.id = q(m.id);
        d.name = q(m.name);
        d.description = q(m.description);
        d.default_steps = static_cast<int>(m.default_steps);
        d.default_guidance = m.default_guidance;
        for (const std::string& w : m.vocabulary) d.vocabulary << q(w);
        models << d;
      }
    } catch (const client::Error& e) {
      unreachable = e.code() == INFILL_ERROR_CONNECTION;
      failure = describe(e);
    }
    QMetaObject::invokeMethod(this, [this, generation, after_start, failure, unreachable, models] {
      if (generation != generation_) return;
      if (failure.isEmpty()) {
        models_ = models;
        setState(State::Connected, tr("Connected to %1%2").arg(endpoint_, startedEngine() ? tr(" (started by the editor)") : QString()));
        return;
      }
      if (unreachable && !after_start && options_.auto_start && endpoint_.startsWith(QLatin1String("unix:"))) {
        startLocalEngine();
        return;
      }
      QString message = tr("Engine at %1 is not available: %2").arg(endpoint_, failure);
      if (after_start && !process_output_.isEmpty()) message += QStringLiteral("\n") + process_output_.right(800);
      setState(State::Failed, message);
    }, Qt::QueuedConnection);
  });
}

QString EngineConnection::findEngineProgram() const {
  if (!options_.engine_program.isEmpty()) return options_.engine_program;
  const QString beside = QDir(QCoreApplication::applicationDirPath()).filePath(QStringLiteral("infill-engine"));
  if (QFileInfo(beside).isExecutable()) return beside;
  return QStandardPaths::findExecutable(QStringLiteral("infill-engine"));
}

void EngineConnection::startLocalEngine() {
  const QString program = findEngineProgram();
  if (program.isEmpty()) {
    setState(State::Failed, tr("No engine answers at %1 and infill-engine was not found next to the editor or on PATH")
                                .arg(endpoint_));
    return;
  }
  stopLocalEngine();
  process_output_.clear();
  process_ = new QProcess(this);
  process_->setProcessChannelMode(QProcess::MergedChannels);
  connect(process_, &QProcess::readyRead, this, [this] {
    // Kept for the error message when the engine fails to start; bounded.
    process_output_ += QString::fromLocal8Bit(process_->readAll());
    if (process_output_.size() > 16384) process_output_ = process_output_.right(8192);
  });
  connect(process_, &QProcess::errorOccurred, this, [this, program](QProcess::ProcessError) {
    if (state_ == State::StartingEngine) {
      ++generation_;
      setState(State::Failed, tr("Cannot start %1: %2").arg(program, process_ ? process_->errorString() : QString()));
    }
  });
  connect(process_, &QProcess::finished, this, [this](int code, QProcess::ExitStatus) {
    if (state_ == State::StartingEngine || state_ == State::Connected) {
      ++generation_;
      setState(State::Failed, tr("The engine started by the editor exited with code %1\n%2").arg(code).arg(process_output_.right(800)));
    }
  });
  QStringList args;
  args << QStringLiteral("--socket") << endpoint_.mid(5) << options_.engine_arguments;
  setState(State::StartingEngine, tr("Starting %1").arg(program));
  process_->start(program, args);
  probe(true);
}

void EngineConnection::stopLocalEngine() {
  if (!process_) return;
  QProcess* p = process_;
  process_ = nullptr;
  p->disconnect(this);
  if (p->state() != QProcess::NotRunning) {
    // SIGTERM lets the engine drain and remove its socket.
    p->terminate();
    if (!p->waitForFinished(5000)) {
      p->kill();
      p->waitForFinished(2000);
    }
  }
  delete p;
}

quint64 EngineConnection::registerTemplate(const QString& path, const QByteArray& encoded, const QString& name) {
  const quint64 tag = next_tag_++;
  if (!client_) {
    QMetaObject::invokeMethod(this, [this, tag] { emit templateFailed(tag, tr("Not connected to an engine")); },
                              Qt::QueuedConnection);
    return tag;
  }
  const int generation = generation_;
  run([this, tag, generation, path, encoded, name](client::Client& c) {
    TemplateStatus status;
    QString failure;
    try {
      status = to_status(path.isEmpty() ? c.upload_template(std::string_view(encoded.constData(), static_cast<size_t>(encoded.size())),
                                                            name.toStdString())
                                        : c.upload_template_file(path.toStdString()));
    } catch (const client::Error& e) {
      failure = describe(e);
    }
    QMetaObject::invokeMethod(this, [this, tag, generation, status, failure] {
      if (generation != generation_) return;
      if (failure.isEmpty()) emit templateRegistered(tag, status);
      else emit templateFailed(tag, failure);
    }, Qt::QueuedConnection);
  });
  return tag;
}

void EngineConnection::refreshTemplate(const QString& template_id) {
  const int generation = generation_;
  run([this, generation, template_id](client::Client& c) {
    try {
      TemplateStatus status = to_status(c.get_template(template_id.toStdString()));
      QMetaObject::invokeMethod(this, [this, generation, status] {
        if (generation == generation_) emit templateStatus(status);
      }, Qt::QueuedConnection);
    } catch (const client::Error&) {
      // A missed poll is retried by the next one; a lost engine shows up on the next edit.
    }
  });
}

quint64 EngineConnection::submitEdit(const EditSubmission& edit) {
  const quint64 tag = next_tag_++;
  if (!client_ || state_ != State::Connected) {
    const QString why = state_message_.isEmpty() ? tr("Not connected to an engine") : state_message_;
    QMetaObject::invokeMethod(this, [this, tag, why] { emit editRejected(tag, why); }, Qt::QueuedConnection);
    return tag;
  }
  const int generation = generation_;
  run([this, tag, generation, edit](client::Client& c) {
    const QImage mask = edit.mask.format() == QImage::Format_Grayscale8 ? edit.mask
                                                                         : edit.mask.convertToFormat(QImage::Format_Grayscale8);
    client::EditRequest r;
    r.template_id = edit.template_id.toStdString();
    r.mask_pixels = mask.constBits();
    r.mask_width = static_cast<uint32_t>(mask.width());
    r.mask_height = static_cast<uint32_t>(mask.height());
    r.mask_stride = static_cast<size_t>(mask.bytesPerLine());
    r.prompt = edit.prompt.toStdString();
    r.seed = edit.seed;
    r.steps = static_cast<uint32_t>(std::max(0, edit.steps));
    r.strength = edit.strength;
    r.guidance = edit.guidance;
    r.feather_px = edit.feather_px;
    r.edit_class = edit.edit_class;
    r.deadline_ms = edit.deadline_ms;
    r.preview_every_steps = static_cast<uint32_t>(std::max(0, edit.preview_every_steps));
    if (edit.supersedes_tag != 0) {
      auto old = jobs_.find(edit.supersedes_tag);
      if (old != jobs_.end()) r.supersedes = old->second->id();
    }
    // The callbacks run on the SDK's thread: decode there, then hand over to the GUI thread.
    r.on_progress = [this, tag](const infill_progress& p) {
      QMetaObject::invokeMethod(this, [this, tag, done = static_cast<int>(p.steps_done), total = static_cast<int>(p.steps_total)] {
        emit editProgress(tag, done, total);
      }, Qt::QueuedConnection);
    };
    r.on_preview = [this, tag](const infill_preview& p) {
      QImage image = decode_png(p.png, p.png_size);
      QMetaObject::invokeMethod(this, [this, tag, done = static_cast<int>(p.steps_done), image] {
        emit editPreview(tag, done, image);
      }, Qt::QueuedConnection);
    };
    r.on_done = [this, tag](const client::DoneEvent& d) {
      EditOutcome out;
      out.edit_id = d.edit_id;
      out.state = d.state;
      out.engine_ms = d.total_ms;
      out.steps_run = static_cast<int>(d.steps_run);
      if (d.state == INFILL_JOB_DONE) {
        out.result = decode_png(d.png.data(), d.png.size());
        if (out.result.isNull()) {
          out.state = INFILL_JOB_FAILED;
          out.error = QStringLiteral("the engine's result of edit %1 is not a readable PNG").arg(d.edit_id);
        }
      } else if (d.error) {
        out.error = describe(*d.error);
      }
      QMetaObject::invokeMethod(this, [this, tag, out] {
        emit editFinished(tag, out);
        pool_.start([this, tag] { jobs_.erase(tag); });
      }, Qt::QueuedConnection);
    };
    try {
      auto job = std::make_shared<client::Job>(c.submit(r));
      const quint64 id = job->id();
      jobs_[tag] = std::move(job);
      QMetaObject::invokeMethod(this, [this, tag, id, generation] {
        if (generation == generation_) emit editAccepted(tag, id);
      }, Qt::QueuedConnection);
    } catch (const client::Error& e) {
      const QString why = describe(e);
      QMetaObject::invokeMethod(this, [this, tag, why] { emit editRejected(tag, why); }, Qt::QueuedConnection);
    }
  });
  return tag;
}

void EngineConnection::cancelEdit(quint64 tag) {
  run([this, tag](client::Client&) {
    auto it = jobs_.find(tag);
    if (it == jobs_.end()) return;
    try {
      it->second->cancel();
    } catch (const client::Error&) {
      // The edit ends anyway (engine lost, already finished); on_done reports how.
    }
  });
}

}  // namespace infill::ui
