#include "server/edit_ledger.h"

#include <algorithm>

#include "server/service_metrics.h"

namespace infill {

EditLedger::EditLedger(ServerLimits limits, bool reserve_ids, std::function<void(uint64_t id)> forget_journaled)
    : limits_(limits), reserve_ids_(reserve_ids), forget_journaled_(std::move(forget_journaled)) {}

double EditLedger::now_ms() const {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - epoch_).count();
}

void EditLedger::ids_start_after(uint64_t max_id) {
  std::lock_guard lock(mu_);
  next_id_ = std::max(next_id_, max_id + 1);
}

uint64_t EditLedger::id_reservation_needed() const {
  // Reserved in blocks: one journal write per thousand edits.
  constexpr uint64_t kIdBlock = 1000;
  std::lock_guard lock(mu_);
  return reserve_ids_ && next_id_ > ids_reserved_ ? next_id_ + kIdBlock : 0;
}

void EditLedger::ids_reserved(uint64_t up_to) {
  std::lock_guard lock(mu_);
  ids_reserved_ = std::max(ids_reserved_, up_to);
}

std::vector<uint64_t> EditLedger::expire_locked(double now) {
  std::vector<uint64_t> forgotten;
  auto drop = [&](std::map<uint64_t, EditRecord>::iterator it) {
    if (it->second.journaled) forgotten.push_back(it->first);
    return edits_.erase(it);
  };
  // Past their TTL first, then the oldest finished beyond the result cap.
  size_t finished = 0;
  for (auto it = edits_.begin(); it != edits_.end();) {
    if (it->second.finished && now - it->second.finished_ms > limits_.result_ttl_ms) {
      it = drop(it);
    } else {
      finished += it->second.finished ? 1 : 0;
      ++it;
    }
  }
  for (auto it = edits_.begin(); it != edits_.end() && finished > static_cast<size_t>(limits_.max_results);) {
    if (it->second.finished) {
      it = drop(it);
      --finished;
    } else {
      ++it;
    }
  }
  return forgotten;
}

void EditLedger::forget(const std::vector<uint64_t>& ids) const {
  if (!forget_journaled_) return;
  for (uint64_t id : ids) forget_journaled_(id);
}

std::variant<AdmittedEdit, ApiReply> EditLedger::admit(const EditAdmission& a) {
  std::vector<uint64_t> forgotten;
  std::variant<AdmittedEdit, ApiReply> answer;
  {
    std::lock_guard lock(mu_);
    forgotten = expire_locked(now_ms());
    answer = admit_locked(a);
  }
  forget(forgotten);
  return answer;
}

std::variant<AdmittedEdit, ApiReply> EditLedger::admit_locked(const EditAdmission& a) {
  AdmittedEdit admitted;
  admitted.supersedes = a.supersedes;
  if (a.supersedes != 0) {
    // The runtime replaces the old edit whatever its model; the ledger names the clients.
    auto old = edits_.find(a.supersedes);
    if (old != edits_.end() && !old->second.finished && old->second.client != a.client)
      return error_reply(400, "invalid_parameter",
                         "supersedes names edit " + std::to_string(a.supersedes) + " of client " + old->second.client +
                             ", expected one of client " + a.client);
  }
  const bool resumed = a.replay_id != 0;
  if (!resumed && live_per_client_[a.client] >= limits_.max_queued_per_client) {
    ++rejected_;
    ApiReply r = error_reply(429, "too_many_edits",
                             "client " + a.client + " has " + std::to_string(live_per_client_[a.client]) +
                                 " edits in flight, the limit is " + std::to_string(limits_.max_queued_per_client));
    r.retry_after_s = 1;
    return r;
  }
  if (!resumed && live_total_ >= limits_.max_live_edits) {
    ++rejected_;
    ApiReply r = error_reply(429, "engine_busy", "the engine has " + std::to_string(live_total_) +
                                                     " edits in flight, the limit is " + std::to_string(limits_.max_live_edits));
    r.retry_after_s = 1;
    return r;
  }
  if (!resumed && reserve_ids_ && next_id_ > ids_reserved_) {
    // More submissions at once than one reserved block holds: refuse rather than hand out an
    // id a restart could reuse.
    ApiReply r = error_reply(503, "journal_unavailable", "the edit was not accepted: its id is not reserved yet");
    r.retry_after_s = 1;
    return r;
  }
  admitted.id = resumed ? a.replay_id : next_id_++;
  admitted.client_index = client_index_.try_emplace(a.client, client_index_.size() + 1).first->second;
  EditRecord& e = edits_[admitted.id];
  e.id = admitted.id;
  e.client = a.client;
  e.template_id = a.template_id;
  e.model_id = a.model_id;
  e.slot = a.slot;
  e.submitted_ms = now_ms();
  e.journaled = a.journaled;
  ++live_per_client_[a.client];
  ++live_total_;
  ++submitted_;
  return admitted;
}

void EditLedger::withdraw(uint64_t id) {
  std::lock_guard lock(mu_);
  auto it = edits_.find(id);
  if (it == edits_.end() || it->second.finished) return;
  if (--live_per_client_[it->second.client] <= 0) live_per_client_.erase(it->second.client);
  --live_total_;
  --submitted_;
  edits_.erase(it);
}

void EditLedger::restore(EditRecord record, double age_ms) {
  std::lock_guard lock(mu_);
  record.finished = true;
  record.finished_ms = now_ms() - age_ms;
  const uint64_t id = record.id;
  edits_[id] = std::move(record);
}

std::optional<EditNote> EditLedger::progress(uint64_t id, int steps_done, int steps_total) {
  std::lock_guard lock(mu_);
  auto it = edits_.find(id);
  if (it == edits_.end()) return std::nullopt;
  EditRecord& e = it->second;
  if (e.finished) return std::nullopt;  // the worker orders callbacks; this guards the record anyway
  e.steps_done = steps_done;
  e.steps_total = steps_total;
  EditNote note{e.client, e.model_id, e.template_id};
  if (!e.started) {
    e.started = true;
    e.state = RequestState::kRunning;
    note.first_step = true;
  }
  note.started = true;
  note.journaled = e.journaled;
  return note;
}

std::optional<EditNote> EditLedger::complete(EditOutcome outcome) {
  std::lock_guard lock(mu_);
  auto it = edits_.find(outcome.id);
  if (it == edits_.end()) return std::nullopt;
  EditRecord& e = it->second;
  EditNote note{e.client, e.model_id, e.template_id};
  note.started = e.started;
  note.journaled = e.journaled;
  if (e.finished) return note;  // reported twice: the first end stands
  e.state = outcome.state;
  e.status = outcome.state == RequestState::kDone ? Status() : std::move(outcome.status);
  e.result_file = std::move(outcome.result_file);
  e.result_media_type = std::move(outcome.result_media_type);
  e.finished = true;
  e.finished_ms = now_ms();
  e.metrics = std::move(outcome.metrics);
  if (e.metrics.is_object() && e.metrics.contains("steps_run")) e.steps_done = e.metrics["steps_run"].get<int>();
  finished_[request_state_name(e.state)] += 1;
  if (--live_per_client_[e.client] <= 0) live_per_client_.erase(e.client);
  --live_total_;
  return note;
}

std::string EditLedger::client_of(uint64_t id) const {
  std::lock_guard lock(mu_);
  auto it = edits_.find(id);
  return it == edits_.end() ? std::string() : it->second.client;
}

nlohmann::json EditLedger::json_of(const EditRecord& e) {
  nlohmann::json j = {{"id", e.id},
                      {"client", e.client},
                      {"template", e.template_id},
                      {"model", e.model_id},
                      {"state", request_state_name(e.state)},
                      {"steps_done", e.steps_done},
                      {"steps_total", e.steps_total}};
  if (e.state == RequestState::kDone) j["result"] = "/v1/edits/" + std::to_string(e.id) + "/result";
  if (!e.status.ok()) j["error"] = {{"code", error_code_name(e.status.code())}, {"message", e.status.message()}};
  if (!e.metrics.is_null()) j["metrics"] = e.metrics;
  return j;
}

ApiReply EditLedger::status(uint64_t id, bool want_result) {
  std::vector<uint64_t> forgotten;
  ApiReply reply;
  {
    std::lock_guard lock(mu_);
    forgotten = expire_locked(now_ms());
    auto it = edits_.find(id);
    if (it == edits_.end()) {
      reply = error_reply(404, "edit_not_found",
                          "edit " + std::to_string(id) + " is not known (never submitted, or its result expired)");
    } else if (!want_result) {
      reply = json_reply(200, json_of(it->second));
    } else if (it->second.state != RequestState::kDone) {
      reply = error_reply(409, "edit_not_done",
                          "edit " + std::to_string(id) + " is " + request_state_name(it->second.state) + ", not done");
    } else {
      reply.content_type = it->second.result_media_type;
      reply.body = it->second.result_file;
    }
  }
  forget(forgotten);
  return reply;
}

std::variant<size_t, ApiReply> EditLedger::cancel_target(uint64_t id) const {
  std::lock_guard lock(mu_);
  auto it = edits_.find(id);
  if (it == edits_.end()) return error_reply(404, "edit_not_found", "edit " + std::to_string(id) + " is not known");
  if (it->second.finished)
    return error_reply(409, "edit_finished",
                       "edit " + std::to_string(id) + " already ended as " + request_state_name(it->second.state));
  return it->second.slot;
}

std::vector<std::pair<uint64_t, size_t>> EditLedger::live() const {
  std::lock_guard lock(mu_);
  std::vector<std::pair<uint64_t, size_t>> out;
  for (const auto& [id, e] : edits_)
    if (!e.finished) out.emplace_back(id, e.slot);
  return out;
}

size_t EditLedger::live_count() const {
  std::lock_guard lock(mu_);
  return static_cast<size_t>(std::max(0, live_total_));
}

void EditLedger::collect(ServiceMetrics& m) const {
  std::lock_guard lock(mu_);
  m.live_edits = live_total_;
  m.edits_submitted = submitted_;
  m.edits_rejected = rejected_;
  m.edits_finished = finished_;
  for (const auto& [id, e] : edits_) m.edits_by_state[request_state_name(e.state)] += 1;
  m.results_kept = edits_.size();
}

}  // namespace infill
