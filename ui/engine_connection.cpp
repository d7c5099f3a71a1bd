#include "ui/engine_connection.h"

#include <QCoreApplication>
#include <QDir>
#include <QElapsedTimer>
#include <QFileInfo>
#include <QStandardPaths>

#include <string>
#include <vector>

#include "ui/image_io.h"

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

struct ProbeOutcome {
  QString failure;           // "" = ready, models filled
  bool unreachable = false;  // nothing answered (connection error)
  QList<ModelDescription> models;
};

// Asks the engine for its health and models, on a pool thread. With `wait` (or an engine that
// answers but is still loading) waits for readiness up to `ready_timeout_ms`, in short
// slices, so that `still_wanted()` turning false (a reconnect, the window closing, a started
// engine dying) ends the wait at once.
ProbeOutcome probe_engine(client::Client& c, bool wait, int ready_timeout_ms, const std::function<bool()>& still_wanted) {
  ProbeOutcome out;
  try {
    client::Health h = wait ? client::Health{} : c.health();
    if (wait || !h.ready) {
      QElapsedTimer clock;
      clock.start();
      for (;;) {
        try {
          c.wait_ready(250);
          break;
        } catch (const client::Error&) {
          if (!still_wanted() || clock.elapsed() >= ready_timeout_ms) throw;
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
      d.free_text = m.free_text;
      out.models << d;
    }
  } catch (const client::Error& e) {
    out.unreachable = e.code() == INFILL_ERROR_CONNECTION;
    out.failure = describe(e);
  }
  return out;
}

}  // namespace

EngineConnection::EngineConnection(QObject* parent) : QObject(parent) {
  qRegisterMetaType<TemplateStatus>();
  qRegisterMetaType<AdapterStatus>();
  qRegisterMetaType<EditOutcome>();
  // One thread: network calls keep their order (a cancel never overtakes its submit) and
  // jobs_ needs no lock.
  pool_.setMaxThreadCount(1);
  watch_pool_.setMaxThreadCount(1);
  reconnect_timer_.setSingleShot(true);
  connect(&reconnect_timer_, &QTimer::timeout, this, [this] { attemptReconnect(false); });
  connect(&health_timer_, &QTimer::timeout, this, &EngineConnection::checkHealth);
}

EngineConnection::~EngineConnection() {
  // Tasks reference `this`; the client must outlive them, and its destruction runs the
  // last on_done callbacks, which post (harmlessly) to this object while it still exists.
  ++generation_;
  ++attempt_;
  reconnect_timer_.stop();
  health_timer_.stop();
  pool_.waitForDone();
  watch_pool_.waitForDone();
  jobs_.clear();
  client_.reset();
  stopLocalEngine();
}

void EngineConnection::setState(State state, const QString& message) {
  state_ = state;
  state_message_ = message;
  if (state == State::Connected && options_.health_interval_ms > 0) {
    health_timer_.start(options_.health_interval_ms);
  } else if (state != State::Connected) {
    health_timer_.stop();
  }
  emit stateChanged(state, message);
}

qint64 EngineConnection::engineProcessId() const {
  return process_ && process_->state() != QProcess::NotRunning ? process_->processId() : 0;
}

void EngineConnection::run(std::function<void(client::Client&)> task) {
  std::shared_ptr<client::Client> c = client_;
  if (!c) return;
  pool_.start([c, task = std::move(task)] { task(*c); });
}

void EngineConnection::connectToEngine(const EngineOptions& options) {
  options_ = options;
  // Answers still coming for the previous client are dropped by generation; no waiting here,
  // so reconnecting never blocks the UI on a slow engine. A running reconnect loop ends here.
  ++generation_;
  ++attempt_;
  reconnect_timer_.stop();
  reconnect_attempts_ = 0;
  pool_.start([this] { jobs_.clear(); });
  models_.clear();
  const QString previous_endpoint = endpoint_;
  endpoint_ = options.endpoint;
  if (endpoint_.isEmpty()) {
    std::string buffer(infill_default_endpoint(nullptr, 0) + 1, '\0');
    infill_default_endpoint(buffer.data(), buffer.size());
    endpoint_ = QString::fromStdString(buffer.c_str());
  }
  // The engine this connection started stays "ours" (restarted when it dies) only while the
  // connection keeps its address.
  auto_started_ = auto_started_ && process_ != nullptr && endpoint_ == previous_endpoint;
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
    const ProbeOutcome r = probe_engine(c, after_start, ready_timeout_ms, [this, generation] { return generation == generation_; });
    QMetaObject::invokeMethod(this, [this, generation, after_start, r] {
      if (generation != generation_) return;
      if (r.failure.isEmpty()) {
        models_ = r.models;
        setState(State::Connected, tr("Connected to %1%2").arg(endpoint_, startedEngine() ? tr(" (started by the editor)") : QString()));
        return;
      }
      if (r.unreachable && !after_start && options_.auto_start && endpoint_.startsWith(QLatin1String("unix:"))) {
        startLocalEngine();
        return;
      }
      QString message = tr("Engine at %1 is not available: %2").arg(endpoint_, r.failure);
      if (after_start && !process_output_.isEmpty()) message += QStringLiteral("\n") + process_output_.right(800);
      setState(State::Failed, message);
    }, Qt::QueuedConnection);
  });
}

void EngineConnection::engineLost(const QString& why) {
  if (state_ != State::Connected) return;  // already reconnecting, or not connected at all
  if (!options_.auto_reconnect) {
    setState(State::Failed, tr("Lost the engine at %1: %2 (Engine > Connect to reconnect)").arg(endpoint_, why));
    return;
  }
  lost_reason_ = why;
  reconnect_attempts_ = 0;
  backoff_ms_ = std::max(1, options_.reconnect_initial_ms);
  setState(State::Reconnecting, tr("Engine lost (%1); reconnecting...").arg(why));
  reconnect_timer_.start(backoff_ms_);
}

void EngineConnection::scheduleReconnect(const QString& why) {
  setState(State::Reconnecting, tr("Engine lost; reconnecting in %1 s (attempt %2: %3)")
                                    .arg(backoff_ms_ / 1000.0, 0, 'f', 1).arg(reconnect_attempts_).arg(why));
  reconnect_timer_.start(backoff_ms_);
  backoff_ms_ = std::min(std::max(backoff_ms_, 1) * 2, std::max(options_.reconnect_max_ms, options_.reconnect_initial_ms));
}

void EngineConnection::attemptReconnect(bool after_restart) {
  if (state_ != State::Reconnecting || !client_) return;
  if (!after_restart) ++reconnect_attempts_;
  const int generation = generation_;
  const int attempt = ++attempt_;
  const int ready_timeout_ms = options_.ready_timeout_ms;
  std::shared_ptr<client::Client> c = client_;
  watch_pool_.start([this, c, generation, attempt, after_restart, ready_timeout_ms] {
    const ProbeOutcome r = probe_engine(*c, after_restart, ready_timeout_ms,
                                        [this, generation, attempt] { return generation == generation_ && attempt == attempt_; });
    QMetaObject::invokeMethod(this, [this, generation, attempt, after_restart, r] {
      if (generation != generation_ || attempt != attempt_ || state_ != State::Reconnecting) return;
      if (r.failure.isEmpty()) {
        models_ = r.models;
        reconnect_timer_.stop();
        setState(State::Connected, tr("Reconnected to %1%2 after losing it (%3)")
                                       .arg(endpoint_, after_restart ? tr(" (restarted by the editor)") : QString(), lost_reason_));
        return;
      }
      // Nothing answers and the engine this connection started is gone: start it again.
      const bool ours_dead = auto_started_ && (!process_ || process_->state() == QProcess::NotRunning);
      if (r.unreachable && !after_restart && ours_dead) {
        if (launchEngineProcess()) {
          setState(State::Reconnecting, tr("Engine lost; restarting the local engine (attempt %1)").arg(reconnect_attempts_));
          attemptReconnect(true);
          return;
        }
      }
      QString why = r.failure;
      if (after_restart && !process_output_.isEmpty()) why += QStringLiteral("\n") + process_output_.right(800);
      scheduleReconnect(why);
    }, Qt::QueuedConnection);
  });
}

void EngineConnection::checkHealth() {
  if (state_ != State::Connected || !client_ || health_running_.exchange(true)) return;
  const int generation = generation_;
  std::shared_ptr<client::Client> c = client_;
  watch_pool_.start([this, c, generation] {
    QString lost;
    try {
      // An engine that answers but is loading was restarted behind our back: its templates
      // are gone, so it counts as lost too (the loop waits for it to be ready).
      if (!c->health().ready) lost = tr("the engine is restarting");
    } catch (const client::Error& e) {
      if (e.code() == INFILL_ERROR_CONNECTION) lost = describe(e);
    }
    health_running_ = false;
    if (lost.isEmpty()) return;
    QMetaObject::invokeMethod(this, [this, generation, lost] {
      if (generation == generation_) engineLost(lost);
    }, Qt::QueuedConnection);
  });
}

QString EngineConnection::findEngineProgram() const {
  if (!options_.engine_program.isEmpty()) return options_.engine_program;
  const QString beside = QDir(QCoreApplication::applicationDirPath()).filePath(QStringLiteral("infill-engine"));
  if (QFileInfo(beside).isExecutable()) return beside;
  return QStandardPaths::findExecutable(QStringLiteral("infill-engine"));
}

bool EngineConnection::launchEngineProcess() {
  const QString program = findEngineProgram();
  if (program.isEmpty()) return false;
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
    } else if (state_ == State::Reconnecting) {
      ++attempt_;  // the attempt waiting for it gives up; the loop goes on
      scheduleReconnect(tr("cannot start %1: %2").arg(program, process_ ? process_->errorString() : QString()));
    }
  });
  connect(process_, &QProcess::finished, this, [this](int code, QProcess::ExitStatus status) {
    const QString why = status == QProcess::CrashExit ? tr("the engine started by the editor was killed or crashed")
                                                      : tr("the engine started by the editor exited with code %1").arg(code);
    if (state_ == State::StartingEngine) {
      ++generation_;
      setState(State::Failed, why + QStringLiteral("\n") + process_output_.right(800));
    } else if (state_ == State::Connected) {
      engineLost(why);
    } else if (state_ == State::Reconnecting && reconnect_timer_.isActive() == false) {
      ++attempt_;  // a restarted engine died while the loop waited for it
      scheduleReconnect(why + QStringLiteral("\n") + process_output_.right(800));
    }
  });
  QStringList args;
  args << QStringLiteral("--socket") << endpoint_.mid(5) << options_.engine_arguments;
  process_->start(program, args);
  auto_started_ = true;
  return true;
}

void EngineConnection::startLocalEngine() {
  setState(State::StartingEngine, tr("Starting %1").arg(findEngineProgram()));
  if (!launchEngineProcess()) {
    setState(State::Failed, tr("No engine answers at %1 and infill-engine was not found next to the editor or on PATH")
                                .arg(endpoint_));
    return;
  }
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

template <class Status, class Call>
quint64 EngineConnection::tagged_call(Call call, void (EngineConnection::*done)(quint64, const Status&),
                                      void (EngineConnection::*failed)(quint64, const QString&)) {
  const quint64 tag = next_tag_++;
  if (!client_) {
    QMetaObject::invokeMethod(this, [this, tag, failed] { emit(this->*failed)(tag, tr("Not connected to an engine")); },
                              Qt::QueuedConnection);
    return tag;
  }
  const int generation = generation_;
  run([this, tag, generation, call = std::move(call), done, failed](client::Client& c) {
    Status status;
    QString failure;
    bool lost = false;
    try {
      status = call(c);
    } catch (const client::Error& e) {
      failure = describe(e);
      lost = e.code() == INFILL_ERROR_CONNECTION;
    }
    QMetaObject::invokeMethod(this, [this, tag, generation, status, failure, lost, done, failed] {
      if (generation != generation_) return;
      if (lost) engineLost(failure);
      if (failure.isEmpty()) emit(this->*done)(tag, status);
      else emit(this->*failed)(tag, failure);
    }, Qt::QueuedConnection);
  });
  return tag;
}

quint64 EngineConnection::registerTemplate(const QString& path, const QByteArray& encoded, const QString& name) {
  return tagged_call<TemplateStatus>(
      [path, encoded, name](client::Client& c) {
        return to_status(path.isEmpty() ? c.upload_template(std::string_view(encoded.constData(), static_cast<size_t>(encoded.size())),
                                                            name.toStdString())
                                        : c.upload_template_file(path.toStdString()));
      },
      &EngineConnection::templateRegistered, &EngineConnection::templateFailed);
}

quint64 EngineConnection::uploadAdapter(const QString& path, const QString& model) {
  return tagged_call<AdapterStatus>(
      [path, model](client::Client& c) {
        const client::AdapterInfo a = c.upload_adapter_file(path.toStdString(), model.toStdString());
        AdapterStatus status;
        status.id = q(a.id);
        status.name = q(a.name);
        status.format = q(a.format);
        status.max_rank = static_cast<int>(a.max_rank);
        status.layers = static_cast<int>(a.layers);
        return status;
      },
      &EngineConnection::adapterUploaded, &EngineConnection::adapterFailed);
}

void EngineConnection::refreshTemplate(const QString& template_id) {
  const int generation = generation_;
  run([this, generation, template_id](client::Client& c) {
    try {
      TemplateStatus status = to_status(c.get_template(template_id.toStdString()));
      QMetaObject::invokeMethod(this, [this, generation, status] {
        if (generation == generation_) emit templateStatus(status);
      }, Qt::QueuedConnection);
    } catch (const client::Error& e) {
      // A missed poll is retried by the next one; a lost engine starts the reconnect loop.
      if (e.code() == INFILL_ERROR_CONNECTION) {
        const QString why = describe(e);
        QMetaObject::invokeMethod(this, [this, generation, why] {
          if (generation == generation_) engineLost(why);
        }, Qt::QueuedConnection);
      }
    }
  });
}

quint64 EngineConnection::submitEdit(const EditSubmission& edit) {
  const quint64 tag = next_tag_++;
  if (!client_ || state_ != State::Connected) {
    const QString why = state_message_.isEmpty() ? tr("Not connected to an engine") : state_message_;
    QMetaObject::invokeMethod(
        this, [this, tag, why] { emit editRejected(tag, why, QString()); }, Qt::QueuedConnection);
    return tag;
  }
  const int generation = generation_;
  run([this, tag, generation, edit](client::Client& c) {
    const QImage mask = edit.mask.format() == QImage::Format_Grayscale8 ? edit.mask
                                                                         : edit.mask.convertToFormat(QImage::Format_Grayscale8);
    client::EditRequest r;
    r.template_id = edit.template_id.toStdString();
    r.model = edit.model.toStdString();
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
    // The result in the template's own format: a 16-bit or float picture stays one.
    r.output_format = "template";
    for (const AdapterChoice& a : edit.adapters) r.adapters.push_back({a.id.toStdString(), a.strength});
    for (const QString& id : edit.references) r.references.push_back(id.toStdString());
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
        out.result_file = QByteArray(d.png.data(), static_cast<qsizetype>(d.png.size()));
        const LoadedImage shown = decode_image_file(out.result_file, QStringLiteral("result of edit %1").arg(d.edit_id));
        out.result = shown.image;
        if (out.result.isNull()) {
          out.state = INFILL_JOB_FAILED;
          out.error = QStringLiteral("the engine's result of edit %1 is not a readable image: %2").arg(d.edit_id).arg(shown.error);
        }
      } else if (d.error) {
        out.error = describe(*d.error);
        out.error_code = d.error->code();
      }
      QMetaObject::invokeMethod(this, [this, tag, out] {
        // The SDK gave the edit up: the engine went away, or restarted and forgot the edit
        // (and is back already). A health check tells the two apart.
        if (out.error_code == INFILL_ERROR_ENGINE_LOST) checkHealth();
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
      const QString engine_code = q(e.engine_code());
      const bool lost = e.code() == INFILL_ERROR_CONNECTION;
      QMetaObject::invokeMethod(
          this,
          [this, tag, why, engine_code, lost, generation] {
            if (lost && generation == generation_) engineLost(why);
            emit editRejected(tag, why, engine_code);
          },
          Qt::QueuedConnection);
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
