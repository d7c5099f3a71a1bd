#pragma once
/// @file
/// Generate and live mode: turns the image, the mask and the parameters into edits.

#include <QElapsedTimer>
#include <QImage>
#include <QObject>
#include <QRect>
#include <QTimer>

#include <map>
#include <set>

#include "ui/engine_connection.h"
#include "ui/mask_document.h"

namespace infill::ui {

/// What the parameters panel sets.
struct GenerationParams {
  QString prompt;
  quint64 seed = 0;
  bool random_seed = false;  ///< a new seed per Generate (the one used is reported)
  int steps = 0;             ///< 0 = the model's default
  double strength = 1.0;
  double guidance = 0.0;     ///< 0 = the model's default
  int variations = 1;        ///< edits per Generate, seeds seed, seed + 1, ...
  double feather_px = 4.0;
  QString model_id;          ///< the engine's model to use; "" = its default
  QList<AdapterChoice> adapters;  ///< uploaded LoRAs, applied in order
  QStringList references;         ///< uploaded reference images' template ids, in order
  /// The files of `references` (by id): uploaded again when the engine no longer knows one.
  QList<ReferenceFile> reference_files;
};

/// One finished variation.
struct GenerationResult {
  QImage image;  ///< for display: the template's size; outside the (feathered) mask, the template's pixels
  QByteArray file;  ///< the engine's result file, in the template's own format and depth
  QImage mask;   ///< the mask it was made with
  QString prompt;
  quint64 seed = 0;
  bool live = false;
  double latency_ms = 0;  ///< Generate click (or stroke end, live) to result, on this side
  double engine_ms = 0;
};

/// Runs on the GUI thread. Registers the image as a template, submits Generate batches
/// (previews, progress with ETA, cancel) and, in live mode, one edit per finished mask edit
/// (after a short debounce), each superseding the previous one so only the last result is shown.
///
/// An edit the engine refuses with `unknown_adapter` (its adapter store no longer holds a LoRA
/// uploaded earlier: it restarted with another store, or the adapter was deleted) makes it
/// upload the files of GenerationParams::adapters again and submit the edit (the Generate
/// batch, or the newest live edit) once more; refused again, the refusal is shown. A reference
/// image the engine no longer knows (`template_not_found` naming `references[i]`: evicted, or
/// the engine restarted) makes it upload GenerationParams::reference_files again the same way,
/// and a second refusal names the image. A lost image (the template the edits start from) is
/// uploaded again too.
class EditController : public QObject {
  Q_OBJECT

 public:
  /// Live mode's default wait between a finished mask edit and its submission. Short on
  /// purpose: it only merges edits that land together (a double-click dab, a repeated
  /// shortcut); slower strokes each get an edit and the engine's supersede drops the stale
  /// one, so the painter's first preview is not held back by the wait.
  static constexpr int kDefaultLiveDebounceMs = 50;

  EditController(EngineConnection* engine, MaskDocument* mask, QObject* parent = nullptr);

  /// The picture edits start from: `image` as shown, `file` its encoded file at full depth
  /// (what the engine is sent; an empty `file` sends `image` as PNG), `name` labels it.
  /// Registers it with the engine now or once connected.
  void setImage(const QImage& image, const QByteArray& file = {}, const QString& name = {});
  const QImage& image() const { return image_; }
  QString templateId() const { return template_.id; }
  /// "not registered", "uploading", "ready", "preparing", "prepared".
  QString templateStateText() const;

  void setParameters(const GenerationParams& params) { params_ = params; }
  const GenerationParams& parameters() const { return params_; }

  /// Submits `variations` edits. False (with message()) when it cannot: no image, empty
  /// mask, engine not connected. Waits for the template upload when it is still running.
  bool generate();
  /// Cancels the running Generate batch and the live edit.
  void cancel();
  bool busy() const { return !batch_.empty(); }

  void setLiveMode(bool on);
  bool liveMode() const { return live_; }
  /// The wait after a finished mask edit before live mode submits it; a stroke that begins
  /// meanwhile cancels it (its own end starts the wait again).
  void setLiveDebounceMs(int ms) { debounce_.setInterval(ms); }
  int liveDebounceMs() const { return debounce_.interval(); }

  /// Live-mode counters since the last setLiveMode(true).
  struct LiveStats {
    int submitted = 0;
    int superseded = 0;  ///< ended cancelled because a newer edit replaced them
    int stale = 0;       ///< finished, but a newer edit was already on its way: not shown
    int results = 0;     ///< shown
    double last_latency_ms = 0;
  };
  const LiveStats& liveStats() const { return live_stats_; }

 signals:
  void templateStateChanged(const QString& text);
  /// A preview of the masked region; `where` is in image coordinates.
  void previewArrived(const QImage& preview, const QRect& where);
  void progressChanged(int steps_done, int steps_total, double eta_s);
  void resultArrived(const infill::ui::GenerationResult& result);
  void busyChanged(bool busy);
  /// Something the user should read in the status bar; error = true for failures.
  void message(const QString& text, bool error);
  void liveLatency(double ms);

 private:
  struct Pending {
    GenerationResult result;
    QElapsedTimer clock;
    int steps_done = 0, steps_total = 0;
    bool live = false;
    quint64 template_epoch = 0;  // template_epoch_ when it was submitted
    // Submitted after uploading its LoRAs again: refused again, it is not retried.
    bool adapters_uploaded_again = false;
    // Submitted after uploading its reference images again: refused again, it is not retried.
    bool references_uploaded_again = false;
  };
  void uploadTemplate();
  void onEngineState(EngineConnection::State state);
  void onTemplateRegistered(quint64 tag, const TemplateStatus& status);
  void onTemplateFailed(quint64 tag, const QString& message);
  void onTemplateStatus(const TemplateStatus& status);
  void onProgress(quint64 tag, int done, int total);
  void onPreview(quint64 tag, int done, const QImage& preview);
  void onFinished(quint64 tag, const EditOutcome& outcome);
  void onRejected(quint64 tag, const QString& message, const QString& engine_code);
  /// Uploads the files of params_.adapters again (the engine no longer holds one); false when
  /// no adapter names a file.
  bool uploadAdaptersAgain();
  void onAdapterUploaded(quint64 tag, const AdapterStatus& status);
  void onAdapterFailed(quint64 tag, const QString& message);
  /// Every upload of uploadAdaptersAgain() answered: submits what waited for them, or says
  /// why not.
  void adaptersUploadedAgain();
  /// Uploads params_.reference_files again (the engine no longer knows one); false when there
  /// is none to upload.
  bool uploadReferencesAgain();
  /// A template upload answered: true when it was one of uploadReferencesAgain()'s.
  bool onReferenceRegistered(quint64 tag, const TemplateStatus& status);
  /// A template upload failed: true when it was one of uploadReferencesAgain()'s.
  bool onReferenceFailed(quint64 tag, const QString& message);
  /// Every upload of uploadReferencesAgain() answered: submits what waited for them, or says
  /// why not.
  void referencesUploadedAgain();
  /// What both of those do once their uploads answered: with a `failure`, says it and drops
  /// what waited; else submits what waited once more, `uploaded_again` set meanwhile (a
  /// refusal of that try is not retried).
  void resubmitAfterUploads(QString& failure, bool& uploaded_again);
  /// The file name of the reference image whose id `text` (an engine refusal) names; "" if none.
  QString referenceNamedIn(const QString& text) const;
  /// True while the image, the LoRA files or the reference images are being uploaded: edits
  /// wait for them.
  bool uploadsRunning() const {
    return template_dirty_ || template_tag_ != 0 || !adapter_uploads_.empty() ||
           !reference_uploads_.empty();
  }
  void onMaskEdited();
  void submitLive();
  bool submitBatch();
  EditSubmission baseSubmission(quint64 seed) const;
  QRect previewRect(const QImage& preview) const;
  void finishTag(quint64 tag);

  EngineConnection* engine_;
  MaskDocument* mask_;
  QImage image_;
  QString name_;  // labels the uploads (the file name, or "edited")
  QByteArray encoded_;
  TemplateStatus template_;
  quint64 template_tag_ = 0;  // upload in flight
  bool template_dirty_ = true;
  bool generate_waiting_ = false;  // Generate pressed while the upload runs
  bool template_retried_ = false;  // this Generate already uploaded the image again once
  quint64 template_epoch_ = 0;     // counts registrations of the image with the engine
  // LoRA files uploaded again after an edit was refused with unknown_adapter, by upload tag.
  std::map<quint64, QString> adapter_uploads_;
  QString adapter_upload_failure_;        // the first of those uploads that failed
  bool adapters_uploaded_again_ = false;  // set while submitting right after those uploads
  bool live_waiting_ = false;  // a live edit waits for those (or the references') uploads
  // Reference images uploaded again after an edit was refused naming one, by upload tag: the
  // id the edits named.
  std::map<quint64, QString> reference_uploads_;
  QString reference_upload_failure_;        // the first of those uploads that failed
  bool references_uploaded_again_ = false;  // set while submitting right after those uploads
  GenerationParams params_;

  std::map<quint64, Pending> pending_;  // every edit in flight, by tag
  std::set<quint64> batch_;             // tags of the running Generate
  QElapsedTimer batch_clock_;

  bool live_ = false;
  quint64 live_tag_ = 0;  // the newest live edit
  QElapsedTimer live_edit_clock_;  // since the mask edit the live edit answers
  QTimer debounce_;
  LiveStats live_stats_;
  QTimer template_poll_;
};

}  // namespace infill::ui

Q_DECLARE_METATYPE(infill::ui::GenerationResult)
