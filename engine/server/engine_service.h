#pragma once
/// The engine behind the API: templates, edits, events, models, metrics and health, in terms
/// of bytes and JSON. It owns the model, the activation store and the serving runtime; the
/// HTTP server (http_server.h) only parses requests and frames these replies.
///
/// Several models may be loaded at once: the first is the default, an edit names another by
/// id ("model"). One serving runtime runs them all, with workers on each of the engine's
/// devices; the activation store is shared (its keys include the model id).
///
/// It is made of parts with one job each: ModelRegistry (models, runtimes, store),
/// TemplateRegistry, EditLedger (ids, limits, states, results, TTL), EventPublisher,
/// parse_edit_request and decode_edit_mask, and the JournalWriter; the service orders an
/// edit's life across them.
///
/// This header is torch-free on purpose (the transport must not compile libtorch headers).
///
/// Threading: every public method is safe from any thread and returns quickly; decoding
/// uploads and masks runs on the service's own task pool and ends in the `done` callback,
/// called once, on a pool thread. Events go to the sink set with set_event_sink, on pool
/// threads; the sink must not block.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "server/api_reply.h"
#include "server/event_publisher.h"
#include "server/server_config.h"

namespace infill {

struct ServiceOptions {
  std::string model_path;     ///< a model folder (manifest.json + weights): the default model
  /// More model folders, served next to the default one and chosen by an edit's "model".
  std::vector<std::string> extra_model_paths;
  /// Where the models compute: "cpu", "cuda" (every visible GPU), "cuda:N", or a
  /// comma-separated list of those (serving/device_list.h): one set of workers per device.
  std::string device = "cpu";
  /// Workers per device.
  int workers = 1;
  int threads_per_worker = 1;
  int pool_threads = 1;       ///< upload / mask decoding and post-processing
  /// With two or more devices: whole-sequence steps may run over idle devices (the device
  /// team, RuntimeOptions::sequence_parallel), each collective within `team_timeout_ms`.
  bool sequence_parallel = true;
  double team_timeout_ms = 60000;
  /// ModelRegistryOptions::team_round_ms, team_link and team_masked_share.
  double team_round_ms = 50;
  std::optional<DeviceTeamLink> team_link;
  double team_masked_share = 0.25;
  /// ModelRegistryOptions::step_graph_bytes, ::float8_weights, ::fused_norms and
  /// ::device_cache_bytes.
  int64_t step_graph_bytes = 0;
  bool float8_weights = false;
  bool fused_norms = false;
  int64_t device_cache_bytes = int64_t{8} << 30;
  std::string cache_dir;      ///< disk tier; "" = RAM only
  uint64_t ram_cache_bytes = uint64_t{1} << 30;
  /// Time the step cost model at load (cached in calibration_path when set); false = a fixed
  /// plausible model (tests, --check).
  bool calibrate = false;
  /// The default model's calibration cache; every other model uses this path with ".<n>"
  /// (its position, 1 = the first extra model) before the extension.
  std::string calibration_path;
  /// SQLite journal of accepted `batch` edits (job_journal.h); "" = batch edits are not
  /// durable. load() resumes the unfinished ones it finds there.
  std::string journal_path;
  ServerLimits limits;
  /// Test seam: runs on every worker's step loop before each batched step (WorkerOptions::
  /// before_step), so a test can hold an edit "while it runs" without guessing step times.
  std::function<void(std::span<const uint64_t> ids)> before_step;
  /// Test seam: WorkerOptions::may_step of every worker (no batched step while it says no).
  std::function<bool(size_t ready)> may_step;
  /// Test seam: ModelRegistryOptions::before_load (an error stands for that device's load
  /// failing, e.g. out of device memory).
  std::function<Status(const std::string& device, const std::string& path)> before_load;
  /// The adapter store's folder (LoRA files, pipeline/adapter_store.h); "" = `cache_dir`/adapters,
  /// or a private folder removed at exit when there is no cache_dir.
  std::string adapter_dir;
  /// LoRAs read for a model and kept in host memory, and copies kept on a GPU model's device
  /// (each tier an LRU within its budget; pipeline/adapter_store.h).
  int64_t adapter_ram_bytes = int64_t{2} << 30;
  int64_t adapter_device_bytes = int64_t{1} << 30;
};

struct ModelRegistryOptions;
/// What load() hands the model registry for `options` (`infill-engine --check` loads the
/// models through it the same way).
ModelRegistryOptions model_registry_options(const ServiceOptions& options);

/// An edit as submitted: JSON parameters (see docs/api.md) and, optionally, the mask as an
/// encoded image (a multipart part); the JSON may instead carry mask_png_base64 or mask_rect.
struct EditSubmission {
  std::string client = "default";
  nlohmann::json params;
  std::string mask_bytes;
};

class JournalWriter;

class EngineService {
 public:
  explicit EngineService(ServiceOptions options);
  /// Cancels live edits and stops the runtime.
  ~EngineService();
  EngineService(const EngineService&) = delete;
  EngineService& operator=(const EngineService&) = delete;

  /// Loads the models, opens the store, builds the cost models and starts each model's
  /// workers; the service answers 503 until this returned ok. Call once, from any thread.
  /// Two folders holding the same model (same id) are an error naming both.
  Status load();
  bool ready() const;

  /// Receives every event; replaces the previous sink. Pass {} to detach (waits for calls
  /// in progress to return).
  void set_event_sink(std::function<void(const ServiceEvent&)> sink);

  ApiReply health() const;
  ApiReply models() const;
  /// `GET /v1/metrics`: JSON.
  ApiReply metrics() const;
  /// `GET /metrics`: the same snapshot in the Prometheus text format.
  ApiReply prometheus_metrics() const;
  /// Decodes and encodes an uploaded image (on the pool); replies 201 with the template.
  void create_template(std::string bytes, std::string name, std::function<void(ApiReply)> done);
  ApiReply template_status(std::string_view id) const;
  /// Reads an uploaded LoRA file for model `model` ("" = the default) on the pool and keeps it:
  /// 201 with the adapter's JSON (200 for bytes already kept), 400 naming the key when the model
  /// cannot use it, 404 for an unknown model.
  void create_adapter(std::string bytes, std::string name, std::string model, std::function<void(ApiReply)> done);
  /// `GET /v1/adapters`.
  ApiReply adapters() const;
  /// `GET /v1/adapters/{id}`.
  ApiReply adapter_status(std::string_view id) const;
  /// `DELETE /v1/adapters/{id}`.
  ApiReply delete_adapter(std::string_view id);
  /// Validates, decodes the mask (on the pool) and queues the edit; replies 202 with its id.
  void submit_edit(EditSubmission submission, std::function<void(ApiReply)> done);
  /// {"id","state",...}; the result file with `want_result` when done (409 before), as the
  /// edit's output_format asked (PNG, TIFF or OpenEXR; Content-Type says which).
  ApiReply edit_status(std::string_view id, bool want_result);
  ApiReply cancel_edit(std::string_view id);

  /// Edits not yet finished.
  size_t live_edits() const;
  /// Waits up to `timeout_ms` for live edits to finish; then cancels the rest and waits up
  /// to `cancel_timeout_ms` more. True when nothing is live in the end. Journaled batch edits
  /// cancelled here (or by the destructor) stay unfinished in the journal: the next load()
  /// resumes them.
  bool drain(double timeout_ms, double cancel_timeout_ms);

  /// The journal's writer (tests hold it to stand for a slow disk); load() with a journal
  /// must have succeeded.
  JournalWriter& journal_writer_for_test();

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace infill
