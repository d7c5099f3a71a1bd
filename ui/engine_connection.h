#pragma once
/// @file
/// The editor's link to an engine, through libinfill_client only.

#include <QImage>
#include <QList>
#include <QObject>
#include <QPointer>
#include <QProcess>
#include <QString>
#include <QStringList>
#include <QThreadPool>
#include <QTimer>

#include <atomic>
#include <map>
#include <memory>

#include "infill/infill_client.hpp"

namespace infill::ui {

/// Where the engine is and what to do when none answers.
struct EngineOptions {
  /// "unix:/path/engine.sock" or "http://host:port"; "" = $INFILL_ENDPOINT or the local
  /// engine's default socket.
  QString endpoint;
  /// Bearer token for TCP endpoints; "" = the library's default lookup.
  QString token;
  /// Start a local engine (the bundled model) when nothing answers on a Unix socket.
  bool auto_start = true;
  /// The engine binary; "" = infill-engine next to the editor's binary, else on PATH.
  QString engine_program;
  /// Extra arguments for a started engine (the socket is always passed).
  QStringList engine_arguments;
  /// How long a started (or loading) engine may take to become ready.
  int ready_timeout_ms = 60000;
  /// When a connected engine goes away (its event stream or a call fails with a connection
  /// error, a health check fails, the engine the editor started exits): reconnect on its own,
  /// waiting reconnect_initial_ms, doubling up to reconnect_max_ms between attempts, and
  /// start the local engine again when this connection had started it.
  bool auto_reconnect = true;
  int reconnect_initial_ms = 500;
  int reconnect_max_ms = 5000;
  /// A connected engine's /health is checked this often (off the GUI thread); 0 = never.
  int health_interval_ms = 1000;
};

/// One model the engine serves.
struct ModelDescription {
  QString id, name, description;
  int default_steps = 0;
  double default_guidance = 1.0;
  QStringList vocabulary;
  bool free_text = false;  ///< prompts are free text (a text encoder): no word checks
};

/// A template as the engine knows it.
struct TemplateStatus {
  QString id;
  QSize size, model_size;
  infill_template_state state = INFILL_TEMPLATE_READY;
  int edits_waiting = 0;
};

/// A LoRA in the engine's store, as its upload answered.
struct AdapterStatus {
  QString id;      ///< SHA-256 of the file's bytes: what an edit names
  QString name;    ///< the name it was uploaded under (the file name)
  QString format;  ///< "upstream", "kohya" or "diffusers"
  int max_rank = 0;
  int layers = 0;  ///< of the model, that it changes
};

/// One LoRA of an edit.
struct AdapterChoice {
  QString id;  ///< AdapterStatus::id
  double strength = 1.0;
  /// The LoRA file `id` was uploaded from: uploaded again when the engine no longer holds
  /// `id` (engine code unknown_adapter). Not sent with the edit.
  QString file;
  bool operator==(const AdapterChoice&) const = default;
};

/// A reference image of an edit, with what it was uploaded from: uploaded again when the engine
/// no longer knows `id` (engine code template_not_found naming `references[i]`).
struct ReferenceFile {
  QString id;       ///< TemplateStatus::id, what EditSubmission::references names
  QString name;     ///< the file's name, for uploads and messages
  QByteArray file;  ///< the encoded image, as uploaded
  bool operator==(const ReferenceFile&) const = default;
};

/// One edit to submit. The mask is copied (implicitly shared) and read on a worker thread.
struct EditSubmission {
  QString template_id;
  QString model;  ///< a ModelDescription id; "" = the engine's default model
  QImage mask;  ///< Grayscale8, the template's size
  QString prompt;
  quint64 seed = 0;
  int steps = 0;           ///< 0 = the model's default
  double strength = 1.0;
  double guidance = 0.0;   ///< 0 = the model's default
  double feather_px = -1;  ///< < 0 = the engine's default
  infill_edit_class edit_class = INFILL_CLASS_INTERACTIVE;
  double deadline_ms = 0;  ///< 0 = by class
  int preview_every_steps = 0;
  quint64 supersedes_tag = 0;  ///< an earlier submission (by tag) this one replaces
  QList<AdapterChoice> adapters;  ///< LoRAs applied in order (FLUX.2 models)
  QStringList references;         ///< reference images' template ids, in order (FLUX.2 models)
};

/// How an edit ended.
struct EditOutcome {
  quint64 edit_id = 0;
  infill_job_state state = INFILL_JOB_FAILED;
  QImage result;  ///< DONE: the template's size, RGBA8888, for display (decode_image_file)
  /// DONE: the result file in the template's own format and depth (output_format
  /// "template"): what Apply uploads and exports write.
  QByteArray result_file;
  QString error;  ///< otherwise: why
  /// Otherwise: the SDK's code (INFILL_ERROR_ENGINE_LOST: the engine went away meanwhile).
  infill_error_code error_code = INFILL_ERROR_INTERNAL;
  double engine_ms = 0;
  int steps_run = 0;
};

/// Owns one libinfill_client client and, when it started one, the local engine process.
///
/// Threading: lives on the GUI thread and emits every signal there. Calls that wait on the
/// network (health, upload, submit, cancel) run on a private one-thread pool, so the UI
/// never blocks on the engine and those calls keep their order; the SDK's callbacks (its
/// own thread) only decode images and post to the GUI thread with queued invocations. The
/// job handles live in `jobs_`, touched only by tasks on that pool. Health checks and
/// reconnect attempts run on a second one-thread pool, so that they are not queued behind an
/// upload and never wait on the GUI thread.
///
/// Losing the engine: a Connected engine that stops answering (a call or an edit fails with a
/// connection / engine-lost error, a health check fails or finds it loading, the engine the
/// connection started exits) moves to Reconnecting, and attempts follow with backoff until it
/// answers again (Connected: the controller then uploads its template again, since template
/// ids do not survive an engine restart). Edits in flight end through the SDK (engine_lost).
/// connectToEngine() stops the loop and starts over.
class EngineConnection : public QObject {
  Q_OBJECT

 public:
  enum class State { Disconnected, Connecting, StartingEngine, Connected, Failed, Reconnecting };
  Q_ENUM(State)

  explicit EngineConnection(QObject* parent = nullptr);
  ~EngineConnection() override;

  /// (Re)connects; reports through stateChanged(). Returns at once.
  void connectToEngine(const EngineOptions& options);
  State state() const { return state_; }
  QString stateMessage() const { return state_message_; }
  QString endpoint() const { return endpoint_; }
  const QList<ModelDescription>& models() const { return models_; }
  /// True when this connection started the engine it talks to.
  bool startedEngine() const { return process_ != nullptr; }
  /// The process id of the engine this connection started (0 when none runs).
  qint64 engineProcessId() const;
  /// Reconnect attempts since the engine was last lost.
  int reconnectAttempts() const { return reconnect_attempts_; }

  /// Uploads a template: the file itself when `path` is given (the engine decodes it with
  /// its own OpenImageIO), else `encoded` (the document's file at its own depth). Returns a tag that
  /// templateRegistered() / templateFailed() repeat.
  quint64 registerTemplate(const QString& path, const QByteArray& encoded, const QString& name);
  /// Asks for a template's state; answered by templateStatus().
  void refreshTemplate(const QString& template_id);

  /// Uploads the LoRA file at `path` (POST /v1/adapters), which the engine reads for `model`
  /// ("" = its default model) before it keeps it: a file that model cannot use is refused,
  /// naming the key at fault. Returns a tag that adapterUploaded() / adapterFailed() repeat.
  quint64 uploadAdapter(const QString& path, const QString& model);

  /// Submits an edit; returns its tag (never 0), which every later signal of it carries.
  quint64 submitEdit(const EditSubmission& edit);
  /// Cancels a submitted edit (no-op once it ended).
  void cancelEdit(quint64 tag);

 signals:
  void stateChanged(infill::ui::EngineConnection::State state, const QString& message);
  void templateRegistered(quint64 tag, const infill::ui::TemplateStatus& status);
  void templateFailed(quint64 tag, const QString& message);
  void templateStatus(const infill::ui::TemplateStatus& status);
  void adapterUploaded(quint64 tag, const infill::ui::AdapterStatus& status);
  void adapterFailed(quint64 tag, const QString& message);
  void editAccepted(quint64 tag, quint64 edit_id);
  /// `engine_code` is the engine's code when it refused the edit ("unknown_adapter",
  /// "template_not_found", ...; docs/api.md), "" when the edit never reached it.
  void editRejected(quint64 tag, const QString& message, const QString& engine_code);
  void editProgress(quint64 tag, int steps_done, int steps_total);
  void editPreview(quint64 tag, int steps_done, const QImage& preview);
  void editFinished(quint64 tag, const infill::ui::EditOutcome& outcome);

 private:
  void setState(State state, const QString& message);
  void probe(bool after_start);
  /// Starts the local engine process (the socket of endpoint_); false when the program is missing.
  bool launchEngineProcess();
  void startLocalEngine();
  /// The engine went away while Connected: starts the reconnect loop (or fails without it).
  void engineLost(const QString& why);
  void attemptReconnect(bool after_restart);
  void scheduleReconnect(const QString& why);
  void checkHealth();
  void stopLocalEngine();
  QString findEngineProgram() const;
  /// Runs `task` on the pool with the current client.
  void run(std::function<void(client::Client&)> task);
  // `call` (Client& -> Status) on the client's thread, answered on this one with `done(tag,
  // status)` or `failed(tag, message)` (at once when not connected); a lost connection is
  // reported too, and answers of an earlier connection are dropped.
  template <class Status, class Call>
  quint64 tagged_call(Call call, void (EngineConnection::*done)(quint64, const Status&),
                      void (EngineConnection::*failed)(quint64, const QString&));

  EngineOptions options_;
  State state_ = State::Disconnected;
  QString state_message_;
  QString endpoint_;
  QList<ModelDescription> models_;
  std::shared_ptr<client::Client> client_;
  QThreadPool pool_;
  quint64 next_tag_ = 1;
  // Bumps on reconnect, on a started engine's failure and on destruction: answers for an
  // older generation are dropped, and a task waiting for readiness gives up.
  std::atomic<int> generation_{0};
  std::map<quint64, std::shared_ptr<client::Job>> jobs_;  // pool thread only
  QProcess* process_ = nullptr;
  QString process_output_;
  bool auto_started_ = false;  // this connection started its engine: start it again if it dies

  QThreadPool watch_pool_;     // health checks and reconnect attempts
  QTimer health_timer_;        // while Connected
  std::atomic<bool> health_running_{false};
  QTimer reconnect_timer_;     // single shot: the next attempt
  int backoff_ms_ = 0;
  int reconnect_attempts_ = 0;
  QString lost_reason_;
  // Bumps per reconnect attempt: a task waiting for a restarted engine gives up when it changes.
  std::atomic<int> attempt_{0};
};

}  // namespace infill::ui

Q_DECLARE_METATYPE(infill::ui::TemplateStatus)
Q_DECLARE_METATYPE(infill::ui::AdapterStatus)
Q_DECLARE_METATYPE(infill::ui::EditOutcome)
