#pragma once
/// Every edit the engine knows, from acceptance to the expiry of its result: ids, per-client
/// and engine-wide limits, state, progress, the result's bytes and metrics, TTL and the
/// result cap, and the counters /metrics reports. It decides; it does not run anything: the
/// service hands accepted edits to a runtime and reports back here.
///
/// Torch-free. Threading: every method is safe from any thread and never waits on anything but
/// its own mutex (no I/O under it: journal forgets are handed to the callback after unlocking).

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "server/api_reply.h"
#include "server/server_config.h"
#include "serving/request_state.h"

namespace infill {

struct ServiceMetrics;

struct EditRecord {
  uint64_t id = 0;
  std::string client;
  std::string template_id;
  std::string model_id;  ///< the model it runs on
  size_t slot = 0;       ///< that model's slot in the ModelRegistry
  RequestState state = RequestState::kQueued;
  bool started = false;
  int steps_done = 0;
  int steps_total = 0;
  std::string result_file;        ///< the encoded result (done only)
  std::string result_media_type;  ///< its media type, e.g. "image/png"
  Status status;
  double submitted_ms = 0;
  bool finished = false;
  /// Ledger time of the end; negative for a result restored from before this engine started.
  double finished_ms = 0;
  nlohmann::json metrics;
  bool journaled = false;  ///< a batch edit in the job journal
};

/// What the service knows of an edit it is about to hand to a runtime.
struct EditAdmission {
  std::string client;
  std::string template_id;
  std::string model_id;
  size_t slot = 0;
  /// != 0: an edit resumed from the journal, under this old id and past the limits.
  uint64_t replay_id = 0;
  bool journaled = false;
  uint64_t supersedes = 0;  ///< the edit's "supersedes" (0 = none)
};

struct AdmittedEdit {
  uint64_t id = 0;
  uint64_t client_index = 0;  ///< a small number per client name (the scheduler's fairness key)
  /// What the runtime should supersede (of the same client, on any model).
  uint64_t supersedes = 0;
};

/// How an edit ended, as its runtime reported it.
struct EditOutcome {
  uint64_t id = 0;
  RequestState state = RequestState::kDone;
  Status status;
  std::string result_file;        ///< done only: the encoded result
  std::string result_media_type;  ///< its media type, e.g. "image/png"
  nlohmann::json metrics;
};

/// The ledger's view of an edit a progress or completion touched.
struct EditNote {
  std::string client;
  std::string model_id;
  std::string template_id;
  bool first_step = false;  ///< progress: this was its first step
  bool started = false;     ///< completion: it had run a step
  bool journaled = false;
};

class EditLedger {
 public:
  /// `reserve_ids`: ids are handed out only below a high-water mark recorded elsewhere first
  /// (the journal), so that a restart never reuses one a client holds. `forget_journaled` is
  /// called (outside the mutex) with each journaled edit whose result expired.
  EditLedger(ServerLimits limits, bool reserve_ids, std::function<void(uint64_t id)> forget_journaled);

  /// Ids from here on are above `max_id` (the journal's highest).
  void ids_start_after(uint64_t max_id);
  /// The mark to reserve up to before the next admission, or 0 when enough ids are reserved.
  uint64_t id_reservation_needed() const;
  void ids_reserved(uint64_t up_to);

  /// Counts the edit against the limits and gives it an id, or the refusal (429 over a limit,
  /// 503 when its id is not reserved yet, 400 for superseding another client's edit).
  std::variant<AdmittedEdit, ApiReply> admit(const EditAdmission& a);
  /// Takes back an admitted edit that never reached a runtime.
  void withdraw(uint64_t id);
  /// A finished edit read back from the journal (or one that could not be resumed), which
  /// ended `age_ms` ago (its result expires on the wall clock, across restarts).
  void restore(EditRecord record, double age_ms);

  /// Records a step; nullopt for an unknown or ended edit.
  std::optional<EditNote> progress(uint64_t id, int steps_done, int steps_total);
  /// Records the end; nullopt for an unknown edit.
  std::optional<EditNote> complete(EditOutcome outcome);
  /// The edit's client, or "" when unknown.
  std::string client_of(uint64_t id) const;

  /// `GET /v1/edits/{id}` (JSON) or its `/result` (the result file with `want_result`).
  ApiReply status(uint64_t id, bool want_result);
  /// The slot of the runtime running live edit `id`, or the reply (404 unknown, 409 ended).
  std::variant<size_t, ApiReply> cancel_target(uint64_t id) const;
  /// (id, slot) of every live edit.
  std::vector<std::pair<uint64_t, size_t>> live() const;
  size_t live_count() const;
  /// Adds the ledger's counters and states.
  void collect(ServiceMetrics& m) const;

 private:
  std::variant<AdmittedEdit, ApiReply> admit_locked(const EditAdmission& a);
  static nlohmann::json json_of(const EditRecord& e);
  double now_ms() const;
  /// Drops expired results; returns the journaled ids among them.
  std::vector<uint64_t> expire_locked(double now);
  void forget(const std::vector<uint64_t>& ids) const;

  const ServerLimits limits_;
  const bool reserve_ids_;
  const std::function<void(uint64_t)> forget_journaled_;
  const std::chrono::steady_clock::time_point epoch_ = std::chrono::steady_clock::now();

  mutable std::mutex mu_;  // guards everything below
  std::map<uint64_t, EditRecord> edits_;
  std::map<std::string, uint64_t> client_index_;
  std::map<std::string, int> live_per_client_;
  int live_total_ = 0;
  uint64_t next_id_ = 1;
  uint64_t ids_reserved_ = 0;
  uint64_t submitted_ = 0, rejected_ = 0;
  std::map<std::string, uint64_t> finished_;  // by terminal state name
};

}  // namespace infill
