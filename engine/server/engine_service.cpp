#include "server/engine_service.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <stdlib.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <variant>

#include "cache/activation_store.h"
#include "common/remove_tree.h"
#include "model/lora_adapter.h"
#include "pipeline/adapter_store.h"
#include "pipeline/edit_model.h"
#include "pipeline/image_io.h"
#include "pipeline/template_image.h"
#include "serving/serving_runtime.h"
#include "serving/task_pool.h"
#include "server/daemon_log.h"
#include "server/edit_ledger.h"
#include "server/edit_mask.h"
#include "server/edit_request.h"
#include "server/job_journal.h"
#include "server/journal_writer.h"
#include "server/model_registry.h"
#include "server/multipart.h"
#include "server/prometheus_metrics.h"
#include "server/service_metrics.h"
#include "server/template_registry.h"

namespace infill {
namespace {

using nlohmann::json;

std::string bytes_to_string(const std::vector<std::byte>& b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

// Edit ids in paths are decimal numbers.
std::optional<uint64_t> parse_id(std::string_view text) {
  if (text.empty() || text.size() > 19) return std::nullopt;
  uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  return v == 0 ? std::nullopt : std::optional<uint64_t>(v);
}

ApiReply invalid_id_reply(std::string_view text) {
  return error_reply(400, "invalid_edit_id", "edit id '" + std::string(text) + "' is not a positive integer");
}

json request_metrics_json(const RequestMetrics& m) {
  return {{"worker", m.worker},       {"queue_ms", m.queue_ms},
          {"prepare_ms", m.prepare_ms}, {"run_ms", m.run_ms},
          {"post_ms", m.post_ms},     {"total_ms", m.total_ms},
          {"steps_requested", m.steps_requested}, {"steps_run", m.steps_run},
          {"steps_dropped", m.steps_dropped}, {"masked_tokens", m.masked_tokens},
          {"total_tokens", m.total_tokens}, {"deadline_ms", m.deadline_ms},
          {"deadline_met", m.deadline_met}, {"shared_prepare", m.shared_prepare},
          {"streamed", m.streamed}, {"copied_to_device", m.copied_to_device}, {"blocks_loaded", m.blocks_loaded},
          {"blocks_recomputed", m.blocks_recomputed}};
}

// Inverse of error_code_name for codes read back from the journal (unknown -> internal).
ErrorCode error_code_from_name(const std::string& name) {
  for (int c = 1; c <= static_cast<int>(ErrorCode::kCancelled); ++c)
    if (name == error_code_name(static_cast<ErrorCode>(c))) return static_cast<ErrorCode>(c);
  return ErrorCode::kInternal;
}

// The model id a journaled edit was submitted to ("" for edits journaled before edits named
// their model: those ran on the default model).
std::string journaled_model_id(const std::string& params_json) {
  const json p = json::parse(params_json, nullptr, false);
  return p.is_object() && p.contains("model") && p["model"].is_string() ? p["model"].get<std::string>() : std::string();
}

int64_t unix_now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

// The service wires its parts together: the model registry (models and their runtimes), the
// template registry, the edit ledger, the journal's writer and the event publisher. It owns
// the order of an edit's life: parse, find the template, decode the mask, admit, journal,
// hand to the runtime, and report the runtime's callbacks to the ledger and the events.
struct EngineService::Impl {
  ServiceOptions options;
  std::chrono::steady_clock::time_point epoch = std::chrono::steady_clock::now();
  std::unique_ptr<TaskPool> pool;
  EventPublisher events;
  // Made in the constructor: live_edits() may be asked before load() ends.
  std::unique_ptr<EditLedger> ledger;

  std::atomic<bool> ready{false};
  std::atomic<bool> loading{false};
  // Written once by load() before `ready` is set; read-only afterwards.
  std::unique_ptr<ModelRegistry> models;
  std::unique_ptr<TemplateRegistry> templates;
  std::shared_ptr<AdapterStore> adapters;
  std::string private_adapter_dir;  // removed at exit: the store's folder without a cache_dir
  std::unique_ptr<JobJournal> journal;  // null without options.journal_path
  // Every journal write after load() goes through it: off the io thread and off every lock.
  std::unique_ptr<JournalWriter> journal_writer;
  std::mutex reserve_mu;  // one id reservation at a time (a journal write; held by pool threads only)
  std::atomic<uint64_t> edits_resumed{0};
  // Set when the engine stops: edits cancelled from here on stay unfinished in the journal,
  // so the next start resumes them.
  std::atomic<bool> shutting_down{false};

  mutable std::mutex load_mu;
  std::string load_error;

  ApiReply not_ready() const {
    std::string why;
    {
      std::lock_guard lock(load_mu);
      why = load_error.empty() ? "the engine is loading its model" : "the model failed to load: " + load_error;
    }
    ApiReply r = error_reply(503, "not_ready", why);
    r.retry_after_s = 1;
    return r;
  }

  // What GET /v1/metrics and GET /metrics render.
  ServiceMetrics snapshot() const;
  /// `replay_id` != 0: an edit resumed from the journal, under its old id and past the limits.
  ApiReply submit_now(EditSubmission s, uint64_t replay_id = 0);
  /// Reserves the next block of ids in the journal when the ledger needs it (a pool thread
  /// waits for the write; the io thread never does).
  Status reserve_ids();
  /// Writes an accepted batch edit (and its template, the first time) to the journal.
  // `files`: the template's and the references' files the journal does not hold yet.
  Status journal_edit(uint64_t id, const EditSubmission& sub, const EditRequestFields& f, const std::string& model_id,
                      const std::vector<JournaledTemplate>& files);
  Status resume_journal();
  /// Binds an edit's LoRAs to `model`'s instance: ready on its device, they are resolved now;
  /// otherwise read and copied on the pool while the edit is set up and runs its first
  /// adapters_from_step steps (pipeline/adapter_load.h). A model that takes no adapters
  /// refuses now, with its own read_adapter's error. Errors: not_found for an adapter the
  /// store lacks, others for one the model cannot use.
  Status bind_adapters(EditParams& params, const std::vector<std::pair<std::string, double>>& uses,
                       const std::shared_ptr<const EditModel>& model);
  void on_progress(uint64_t id, const RequestProgress& p);
  void on_preview(uint64_t id, int steps_done, const at::Tensor& rgb);
  void on_complete(const RequestResult& r);
};

EngineService::EngineService(ServiceOptions options) : impl_(std::make_shared<Impl>()) {
  Impl& s = *impl_;
  s.options = std::move(options);
  s.pool = std::make_unique<TaskPool>(std::max(1, s.options.pool_threads), 1);
  // A dropped result leaves the journal too (best effort: a leftover row expires again at start).
  Impl* self = impl_.get();
  s.ledger = std::make_unique<EditLedger>(s.options.limits, !s.options.journal_path.empty(), [self](uint64_t id) {
    if (self->journal_writer) self->journal_writer->post([id](JobJournal& j) { return j.forget_edit(id); });
  });
}

EngineService::~EngineService() {
  // The runtimes first: their callbacks reach into the parts below.
  impl_->shutting_down.store(true);
  if (impl_->models) impl_->models->stop();
  impl_->pool.reset();
  impl_->journal_writer.reset();  // runs the writes still queued (their events go out first)
  set_event_sink({});
  if (!impl_->private_adapter_dir.empty()) remove_tree(impl_->private_adapter_dir);
}

ModelRegistryOptions model_registry_options(const ServiceOptions& options) {
  ModelRegistryOptions mo;
  mo.paths = {options.model_path};
  mo.paths.insert(mo.paths.end(), options.extra_model_paths.begin(),
                  options.extra_model_paths.end());
  mo.device = options.device;
  mo.workers = options.workers;
  mo.threads_per_worker = options.threads_per_worker;
  mo.pool_threads = options.pool_threads;
  mo.sequence_parallel = options.sequence_parallel;
  mo.team_timeout_ms = options.team_timeout_ms;
  mo.team_round_ms = options.team_round_ms;
  mo.team_link = options.team_link;
  mo.team_masked_share = options.team_masked_share;
  mo.step_graph_bytes = options.step_graph_bytes;
  mo.float8_weights = options.float8_weights;
  mo.fused_norms = options.fused_norms;
  mo.device_cache_bytes = options.device_cache_bytes;
  mo.cache_dir = options.cache_dir;
  mo.ram_cache_bytes = options.ram_cache_bytes;
  mo.calibrate = options.calibrate;
  mo.calibration_path = options.calibration_path;
  mo.before_step = options.before_step;
  mo.may_step = options.may_step;
  mo.before_load = options.before_load;
  return mo;
}

Status EngineService::load() {
  Impl& s = *impl_;
  if (s.loading.exchange(true)) return invalid_argument("EngineService::load called twice");
  auto fail = [&](const Status& st) {
    std::lock_guard lock(s.load_mu);
    s.load_error = st.message();
    return st;
  };
  auto models = ModelRegistry::load(model_registry_options(s.options));
  if (!models.ok()) return fail(models.status());
  s.models = std::move(*models);
  for (const RegistryDevice& d : s.models->devices()) {
    if (!d.loaded) log_line(LogLevel::kWarning, "device left out, serving on the others: " + d.fault);
  }
  const bool journaled = !s.options.journal_path.empty();
  s.templates = std::make_unique<TemplateRegistry>(*s.models, s.options.limits.max_templates,
                                                   s.options.limits.max_image_pixels, journaled);
  std::string adapter_dir = s.options.adapter_dir;
  if (adapter_dir.empty() && !s.options.cache_dir.empty()) adapter_dir = s.options.cache_dir + "/adapters";
  if (adapter_dir.empty()) {
    std::string pattern = (std::getenv("TMPDIR") ? std::string(std::getenv("TMPDIR")) : "/tmp") + "/infill-adapters-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) return fail(io_error("cannot create a folder for the adapter store: " + pattern));
    adapter_dir = s.private_adapter_dir = pattern;
  }
  auto adapters = AdapterStore::open(adapter_dir, {s.options.adapter_ram_bytes, s.options.adapter_device_bytes});
  if (!adapters.ok()) return fail(adapters.status());
  s.adapters = std::move(*adapters);
  if (journaled) {
    auto journal = JobJournal::open(s.options.journal_path);
    if (!journal.ok()) return fail(journal.status());
    s.journal = std::move(*journal);
    s.journal_writer = std::make_unique<JournalWriter>(*s.journal);
    Status resumed = s.resume_journal();
    if (!resumed.ok()) return fail(resumed);
  }
  s.ready.store(true, std::memory_order_release);
  return {};
}

// Runs on the loading thread before the service is ready: the journal is read directly.
Status EngineService::Impl::resume_journal() {
  auto max_id = journal->max_edit_id();
  if (!max_id.ok()) return max_id.status();
  auto journaled = journal->edits();
  if (!journaled.ok()) return journaled.status();
  ledger->ids_start_after(*max_id);
  const int64_t unix_now = unix_now_ms();
  const std::string& default_model = models->id(0);
  for (JournaledEdit& je : *journaled) {
    const std::string model_id = journaled_model_id(je.params_json);
    EditRecord ended;
    ended.id = je.id;
    ended.client = je.client;
    ended.template_id = je.template_id;
    ended.model_id = model_id.empty() ? default_model : model_id;
    ended.started = true;
    ended.journaled = true;
    if (!je.final_state.empty()) {
      // Finished before the restart: keep the result until it expires, on the wall clock.
      const double age_ms = double(std::max<int64_t>(0, unix_now - je.finished_unix_ms));
      if (age_ms > options.limits.result_ttl_ms) {
        (void)journal->forget_edit(je.id);
        continue;
      }
      auto state = parse_request_state(je.final_state);
      ended.state = state.ok() ? *state : RequestState::kFailed;
      ended.result_file = std::move(je.result_png);
      const auto format = sniff_image_file_format(std::as_bytes(std::span<const char>(ended.result_file)));
      ended.result_media_type = image_media_type(format.value_or(ImageFileFormat::kPng));
      if (ended.state != RequestState::kDone) ended.status = Status(error_code_from_name(je.error_code), je.error_message);
      ledger->restore(std::move(ended), age_ms);
      continue;
    }
    // Unfinished: decode its template again (once) and submit it under its old id, on the
    // model it was submitted to.
    auto fail_resume = [&](const Status& why) {
      const std::string message = "could not be resumed after a restart: " + why.message();
      (void)journal->finish_edit(je.id, "failed", "", error_code_name(why.code()), message, unix_now);
      // Its client learns why from GET /v1/edits/{id}, as for an edit that failed while running.
      EditRecord failed = ended;
      failed.state = RequestState::kFailed;
      failed.status = Status(why.code(), message);
      ledger->restore(std::move(failed), 0);
    };
    if (!model_id.empty() && models->find(model_id) < 0) {
      fail_resume(not_found("edit " + std::to_string(je.id) + " was submitted to model " + model_id +
                            ", which this engine does not serve now (loaded: " + models->ids_text() + ")"));
      continue;
    }
    if (!templates->contains(je.template_id)) {
      auto t = journal->template_bytes(je.template_id);
      if (!t.ok()) {
        fail_resume(t.status());
        continue;
      }
      ApiReply made = templates->upload(t->bytes, t->name);
      if (made.status != 200 && made.status != 201) {
        fail_resume(io_error("template " + je.template_id + ": " + made.body));
        continue;
      }
      templates->journaled(je.template_id);
    }
    EditSubmission sub;
    sub.client = je.client;
    sub.params = json::parse(je.params_json, nullptr, false);
    sub.mask_bytes = std::move(je.mask_bytes);
    ApiReply r = submit_now(std::move(sub), je.id);
    if (r.status != 202) {
      fail_resume(io_error("resubmission: " + r.body));
      continue;
    }
    ++edits_resumed;
  }
  return {};
}

JournalWriter& EngineService::journal_writer_for_test() { return *impl_->journal_writer; }

bool EngineService::ready() const { return impl_->ready.load(std::memory_order_acquire); }

void EngineService::set_event_sink(std::function<void(const ServiceEvent&)> sink) { impl_->events.set_sink(std::move(sink)); }

ApiReply EngineService::health() const {
  if (!ready()) return impl_->not_ready();
  json ids = json::array();
  for (size_t i = 0; i < impl_->models->size(); ++i) ids.push_back(impl_->models->id(i));
  // Each step loop and its device: a worker whose device failed for good (a sticky CUDA
  // error) is out of service, and so is a device left out at load (it could not hold the
  // models); with no worker left the engine cannot edit and says 503, so that a supervisor
  // restarts it.
  const std::vector<WorkerMetrics> worker_metrics = impl_->models->runtime().worker_metrics();
  json workers = json::array();
  size_t in_service = 0;
  for (const WorkerMetrics& w : worker_metrics) {
    json entry = {{"index", w.index}, {"device", w.device}, {"in_service", w.in_service}};
    if (!w.in_service) entry["fault"] = w.fault;
    in_service += w.in_service ? 1 : 0;
    workers.push_back(std::move(entry));
  }
  json devices = json::array();
  bool every_device = true;
  for (const ServiceDevice& d : impl_->models->device_states(worker_metrics)) {
    json entry = {{"device", d.device}, {"in_service", d.in_service}, {"workers", d.workers}};
    if (!d.in_service) entry["fault"] = d.fault;
    every_device = every_device && d.in_service;
    devices.push_back(std::move(entry));
  }
  const std::string status =
      in_service == workers.size() && every_device ? "ok" : in_service > 0 ? "degraded" : "failed";
  // Whether prepare steps run in sequence parallel over idle devices (serving/device_team.h).
  const Status team = impl_->models->runtime().team_status();
  const json device_team = team.ok() ? json{{"in_use", true}} : json{{"in_use", false}, {"why", team.message()}};
  return json_reply(in_service > 0 ? 200 : 503, {{"status", status},
                                                 {"model", impl_->models->id(0)},
                                                 {"models", ids},
                                                 {"devices", devices},
                                                 {"workers", workers},
                                                 {"device_team", device_team},
                                                 {"live_edits", live_edits()}});
}

ApiReply EngineService::models() const {
  if (!ready()) return impl_->not_ready();
  return json_reply(200, {{"models", impl_->models->models_json(impl_->options.limits.max_image_pixels)}});
}

ServiceMetrics EngineService::Impl::snapshot() const {
  ServiceMetrics m;
  models->collect(m);
  ledger->collect(m);
  m.resident_bytes = process_resident_bytes();
  m.uptime_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch).count();
  m.edits_resumed = edits_resumed.load();
  m.journal_path = journal ? journal->path() : std::string();
  m.journal_pending = journal_writer ? journal_writer->pending() : 0;
  m.templates = templates->size();
  m.templates_created = templates->created();
  m.adapters = adapters->stats();
  return m;
}

ApiReply EngineService::metrics() const {
  if (!ready()) return impl_->not_ready();
  return json_reply(200, service_metrics_json(impl_->snapshot()));
}

ApiReply EngineService::prometheus_metrics() const {
  if (!ready()) return impl_->not_ready();
  ApiReply r;
  r.content_type = kPrometheusContentType;
  r.body = prometheus_metrics_text(impl_->snapshot());
  return r;
}

void EngineService::create_template(std::string bytes, std::string name, std::function<void(ApiReply)> done) {
  if (!ready()) return done(impl_->not_ready());
  std::shared_ptr<Impl> s = impl_;
  s->pool->post([s, bytes = std::move(bytes), name = std::move(name), done = std::move(done)]() {
    ApiReply reply;
    try {
      c10::InferenceMode guard;
      reply = s->templates->upload(bytes, name);
    } catch (const std::exception& e) {  // never across the pool thread
      reply = error_reply(500, "internal", std::string("template decoding failed: ") + e.what());
    }
    done(std::move(reply));
  });
}

namespace {

json adapter_json(const StoredAdapter& a) {
  return {{"id", a.id},        {"name", a.name},         {"format", a.format}, {"rank", a.max_rank},
          {"min_rank", a.min_rank}, {"layers", a.layers}, {"bytes", a.file_bytes}};
}

}  // namespace

void EngineService::create_adapter(std::string bytes, std::string name, std::string model, std::function<void(ApiReply)> done) {
  if (!ready()) return done(impl_->not_ready());
  std::shared_ptr<Impl> s = impl_;
  s->pool->post([s, bytes = std::move(bytes), name = std::move(name), model = std::move(model), done = std::move(done)]() {
    ApiReply reply;
    try {
      c10::InferenceMode guard;
      size_t slot = 0;
      if (!model.empty()) {
        const int found = s->models->find(model);
        if (found < 0) {
          return done(error_reply(404, "unknown_model", "model '" + model + "' is not loaded (loaded: " +
                                                             s->models->ids_text() + "; see GET /v1/models)"));
        }
        slot = static_cast<size_t>(found);
      }
      bool created = false;
      auto added = s->adapters->add(bytes, name, s->models->model(slot), created);
      if (!added.ok()) {
        reply = added.status().code() == ErrorCode::kIoError ? status_reply(added.status())
                                                               : error_reply(400, "invalid_adapter", added.status().message());
      } else {
        reply = json_reply(created ? 201 : 200, adapter_json(*added));
      }
    } catch (const std::exception& e) {  // never across the pool thread
      reply = error_reply(500, "internal", std::string("adapter upload failed: ") + e.what());
    }
    done(std::move(reply));
  });
}

ApiReply EngineService::adapters() const {
  if (!ready()) return impl_->not_ready();
  json list = json::array();
  for (const StoredAdapter& a : impl_->adapters->list()) list.push_back(adapter_json(a));
  return json_reply(200, {{"adapters", list}});
}

ApiReply EngineService::adapter_status(std::string_view id) const {
  if (!ready()) return impl_->not_ready();
  const auto found = impl_->adapters->find(std::string(id));
  if (!found) return error_reply(404, "unknown_adapter", "adapter '" + std::string(id) + "' is not in the store");
  return json_reply(200, adapter_json(*found));
}

ApiReply EngineService::delete_adapter(std::string_view id) {
  if (!ready()) return impl_->not_ready();
  const std::string adapter(id);
  if (Status st = impl_->adapters->remove(adapter); !st.ok()) return error_reply(404, "unknown_adapter", st.message());
  // The activation entries recorded with it (every tier: GBs each on disk at real sizes) would
  // only wait for the LRU: no edit can name the adapter any more. Edits running with it keep
  // theirs until they end.
  const size_t entries = impl_->models->store().erase_if([&](std::string_view canonical) {
    return adapter_set_key_holds(canonical_key_field(canonical, "adapters"), adapter);
  });
  impl_->models->release_unused();  // step graphs stacked with it, device copies of those entries
  return json_reply(200, {{"id", adapter}, {"state", "deleted"}, {"cache_entries_dropped", entries}});
}

ApiReply EngineService::template_status(std::string_view id) const {
  if (!ready()) return impl_->not_ready();
  return impl_->templates->status(id);
}

void EngineService::submit_edit(EditSubmission submission, std::function<void(ApiReply)> done) {
  if (!ready()) return done(impl_->not_ready());
  std::shared_ptr<Impl> s = impl_;
  s->pool->post([s, sub = std::move(submission), done = std::move(done)]() mutable {
    ApiReply reply;
    try {
      reply = s->submit_now(std::move(sub));
    } catch (const std::exception& e) {
      reply = error_reply(500, "internal", std::string("edit submission failed: ") + e.what());
    }
    done(std::move(reply));
  });
}

Status EngineService::Impl::reserve_ids() {
  std::lock_guard reserving(reserve_mu);
  const uint64_t want = ledger->id_reservation_needed();
  if (want == 0) return {};
  Status st = journal_writer->run([want](JobJournal& j) { return j.reserve_ids(want); });
  if (st.ok()) ledger->ids_reserved(want);
  return st;
}

Status EngineService::Impl::journal_edit(uint64_t id, const EditSubmission& sub, const EditRequestFields& f,
                                         const std::string& model_id, const std::vector<JournaledTemplate>& files) {
  for (const JournaledTemplate& file : files) {
    Status st = journal_writer->run([&](JobJournal& j) { return j.add_template(file); });
    if (!st.ok()) return st;
    templates->journaled(file.id);
  }
  json stored = sub.params;
  stored.erase("mask_png_base64");  // kept once, as the mask bytes
  stored.erase("supersedes");       // a resumed edit supersedes nothing
  stored["model"] = model_id;       // resumed on its own model, even if the default changed
  JournaledEdit je;
  je.id = id;
  je.client = sub.client;
  je.template_id = f.template_id;
  je.params_json = stored.dump();
  je.mask_bytes = f.mask_bytes;
  return journal_writer->run([&](JobJournal& j) { return j.add_edit(je); });
}

Status EngineService::Impl::bind_adapters(EditParams& params, const std::vector<std::pair<std::string, double>>& uses,
                                          const std::shared_ptr<const EditModel>& model) {
  bool all_in_memory = true;
  for (const auto& [adapter_id, strength] : uses) all_in_memory = all_in_memory && adapters->ready(adapter_id, *model);
  params.adapters = {};
  params.adapter_load.reset();
  if (all_in_memory || !model->takes_adapters()) {
    auto resolved = adapters->resolve(uses, *model);
    if (!resolved.ok()) return resolved.status();
    params.adapters = std::move(*resolved);
    return {};
  }
  params.adapter_load = std::make_shared<AdapterLoad>(uses);
  pool->post([load = params.adapter_load, store = adapters, uses, model] {
    c10::InferenceMode guard;
    load->finish(store->resolve(uses, *model));
  });
  return {};
}

ApiReply EngineService::Impl::submit_now(EditSubmission sub, uint64_t replay_id) {
  c10::InferenceMode guard;
  auto parsed = parse_edit_request(sub.params, std::move(sub.mask_bytes));
  if (auto* refused = std::get_if<ApiReply>(&parsed)) return *refused;
  const EditRequestFields& f = std::get<EditRequestFields>(parsed);
  const std::string& template_id = f.template_id;
  size_t slot = 0;  // "" = the default model
  if (!f.model.empty()) {
    const int found = models->find(f.model);
    if (found < 0)
      return error_reply(400, "unknown_model",
                         "model '" + f.model + "' is not loaded (loaded: " + models->ids_text() + "; see GET /v1/models)");
    slot = static_cast<size_t>(found);
  }
  const EditModel& model_used = models->model(slot);
  const std::string& model_id = model_used.info().id;
  const RequestClass cls = f.cls;
  for (const auto& [adapter_id, strength] : f.adapters) {
    if (!adapters->find(adapter_id))
      return error_reply(404, "unknown_adapter", "adapter " + adapter_id + " is not in the store (upload it with POST /v1/adapters)");
  }
  EditParams bound_adapters;
  if (Status bound = bind_adapters(bound_adapters, f.adapters, models->shared_model(slot)); !bound.ok()) {
    if (bound.code() == ErrorCode::kNotFound) return error_reply(404, "unknown_adapter", bound.message());
    return error_reply(400, "invalid_adapter", bound.message());
  }

  std::vector<ReferenceImage> references;
  for (size_t i = 0; i < f.references.size(); ++i) {
    const std::string at = "references[" + std::to_string(i) + "]";
    auto found = templates->for_model(f.references[i], slot);
    if (auto* failed = std::get_if<ApiReply>(&found)) {
      json body = json::parse(failed->body);  // the registry's error, naming the reference
      body["error"]["message"] = at + ": " + body["error"]["message"].get<std::string>();
      failed->body = body.dump();
      return *failed;
    }
    auto made = model_used.make_reference(*std::get<std::shared_ptr<const TemplateImage>>(found));
    if (!made.ok()) return error_reply(400, "invalid_reference", at + ": " + made.status().message());
    references.push_back(std::move(*made));
  }

  auto found_template = templates->for_model(template_id, slot);
  if (auto* failed = std::get_if<ApiReply>(&found_template)) return *failed;
  const std::shared_ptr<const TemplateImage> tmpl = std::get<std::shared_ptr<const TemplateImage>>(found_template);
  auto mask = decode_edit_mask(f.mask_bytes, f.mask_rect, *tmpl, options.limits.max_image_pixels);
  if (!mask.ok()) {
    // A mask that decodes but does not fit (size, rectangle) is the documented invalid_mask;
    // undecodable bytes and pixel limits keep their own codes.
    if (mask.status().code() == ErrorCode::kInvalidArgument) return error_reply(400, "invalid_mask", mask.status().message());
    return status_reply(mask.status(), true);
  }
  ServingRequest req;
  if (Status prompted = model_used.set_prompt(req.params, f.prompt); !prompted.ok())
    return error_reply(400, "invalid_prompt", "prompt: " + prompted.message());
  req.tmpl = tmpl;
  req.model = models->shared_model(slot);
  req.params.mask = *mask;
  req.params.adapters = std::move(bound_adapters.adapters);
  req.params.adapter_load = std::move(bound_adapters.adapter_load);
  if (!f.adapters.empty()) {
    // Routed to another GPU (its own instance of the model): the LoRAs bound there instead.
    req.rebind = [this, uses = f.adapters](EditParams& params, const std::shared_ptr<const EditModel>& model) {
      return bind_adapters(params, uses, model);
    };
  }
  if (f.adapters_from_step) req.params.adapters_from_step = static_cast<int>(*f.adapters_from_step);
  req.params.references = std::move(references);
  req.params.guidance_scale = f.guidance ? *f.guidance : model_used.info().default_guidance;
  req.params.seed = f.seed ? static_cast<uint64_t>(*f.seed) : 0;
  if (f.strength) req.params.strength = *f.strength;
  if (f.steps) req.params.schedule.steps = static_cast<int>(*f.steps);
  if (!f.sampler.empty()) req.params.schedule.sampler = f.sampler;
  if (f.halo_tokens) req.params.halo_tokens = static_cast<int>(*f.halo_tokens);
  if (f.feather_px) req.params.feather_px = static_cast<float>(*f.feather_px);
  req.cls = cls;
  if (f.deadline_ms) req.deadline_ms = *f.deadline_ms;
  req.preview_every_steps = f.preview_every_steps ? static_cast<int>(*f.preview_every_steps) : 0;
  req.encode_result = true;
  if (!f.output_format.empty() && f.output_format != "template")
    req.result_format = parse_image_file_format(f.output_format);  // one of the table's choices
  if (Status check = model_used.check_schedule(req.params); !check.ok())
    return error_reply(400, "invalid_parameter", check.message());

  // Ids are reserved in blocks so that a restart never hands out one a client still holds.
  if (replay_id == 0 && journal_writer) {
    if (Status st = reserve_ids(); !st.ok())
      return error_reply(503, "journal_unavailable", "the edit was not accepted: " + st.message());
  }
  EditAdmission admission;
  admission.client = sub.client;
  admission.template_id = template_id;
  admission.model_id = model_id;
  admission.slot = slot;
  admission.replay_id = replay_id;
  admission.journaled = journal && cls == RequestClass::kBatch;
  admission.supersedes = f.supersedes ? static_cast<uint64_t>(*f.supersedes) : 0;
  auto admitted_or = ledger->admit(admission);
  if (auto* refused = std::get_if<ApiReply>(&admitted_or)) return *refused;
  const AdmittedEdit admitted = std::get<AdmittedEdit>(admitted_or);
  const uint64_t id = admitted.id;
  const bool journal_now = admission.journaled && replay_id == 0;
  std::vector<JournaledTemplate> journal_files;
  if (auto file = templates->edit_waiting(template_id, journal_now)) journal_files.push_back(std::move(*file));
  if (journal_now) {
    for (const std::string& ref : f.references)
      if (auto file = templates->unjournaled_file(ref)) journal_files.push_back(std::move(*file));
  }
  auto withdraw = [&] {
    ledger->withdraw(id);
    templates->edit_stopped_waiting(template_id, false);
  };
  if (journal_now) {
    // Accepted means journaled: the 202 goes out only after the commit.
    if (Status st = journal_edit(id, sub, f, model_id, journal_files); !st.ok()) {
      withdraw();
      return error_reply(503, "journal_unavailable", "the batch edit was not accepted: " + st.message());
    }
  }
  req.id = id;
  req.client_id = admitted.client_index;
  req.supersedes = admitted.supersedes;
  const std::string client = sub.client;
  req.on_progress = [this, id](const RequestProgress& pr) { on_progress(id, pr); };
  if (req.preview_every_steps > 0)
    req.on_preview = [this](uint64_t rid, int steps_done, const at::Tensor& rgb) { on_preview(rid, steps_done, rgb); };
  req.on_complete = [this](const RequestResult& r) { on_complete(r); };
  // Queued goes out before the runtime can report progress.
  events.emit(client, "queued", {{"id", id}, {"template", template_id}, {"model", model_id}, {"class", request_class_name(cls)}});
  if (Status st = models->runtime().submit(std::move(req)); !st.ok()) {
    withdraw();
    if (journal_now) journal_writer->post([id](JobJournal& j) { return j.forget_edit(id); });
    events.emit(client, "failed",
                {{"id", id}, {"state", "failed"}, {"error", {{"code", error_code_name(st.code())}, {"message", st.message()}}}});
    return status_reply(st);
  }
  return json_reply(202, {{"id", id}, {"state", "queued"}, {"template", template_id}, {"model", model_id}, {"client", client},
                          {"class", request_class_name(cls)}, {"status_url", "/v1/edits/" + std::to_string(id)}});
}

void EngineService::Impl::on_progress(uint64_t id, const RequestProgress& p) {
  auto note = ledger->progress(id, p.steps_done, p.steps_total);
  if (!note) return;
  if (note->first_step) {
    templates->edit_stopped_waiting(note->template_id, true);
    events.emit(note->client, "started", {{"id", id}, {"model", note->model_id}, {"steps_total", p.steps_total}});
  }
  events.emit(note->client, "progress", {{"id", id}, {"steps_done", p.steps_done}, {"steps_total", p.steps_total}});
}

void EngineService::Impl::on_preview(uint64_t id, int steps_done, const at::Tensor& rgb) {
  const std::string client = ledger->client_of(id);
  if (client.empty()) return;
  c10::InferenceMode guard;
  // [3, h, w] float in [0, 1] -> interleaved u8.
  at::Tensor u8 = (rgb.detach().to(at::kFloat).clamp(0, 1) * 255).round().to(at::kByte).permute({1, 2, 0}).contiguous();
  PixelImage img = PixelImage::allocate(static_cast<int>(u8.size(1)), static_cast<int>(u8.size(0)), 3, PixelFormat::kU8);
  std::memcpy(img.data.data(), u8.data_ptr<uint8_t>(), img.data.size());
  auto png = encode_png(img);
  if (!png.ok()) return;  // a preview is best effort; the result still comes
  events.emit(client, "preview", {{"id", id}, {"steps_done", steps_done}, {"width", img.width}, {"height", img.height},
                                  {"png_base64", base64_encode(bytes_to_string(*png))}});
}

void EngineService::Impl::on_complete(const RequestResult& r) {
  const bool done = r.state == RequestState::kDone;
  EditOutcome outcome;
  outcome.id = r.id;
  outcome.state = r.state;
  outcome.status = r.status;
  outcome.result_file = bytes_to_string(r.result_file);
  outcome.result_media_type = image_media_type(r.result_format);
  outcome.metrics = request_metrics_json(r.metrics);
  if (done) {
    outcome.metrics["cache_mode"] = r.output.cache_mode;
    outcome.metrics["prompt_truncated"] = r.output.prompt_truncated;
    outcome.metrics["adapters_from_step"] = r.output.adapters_from_step;
  }
  auto note = ledger->complete(std::move(outcome));
  if (!note) return;
  if (!note->started) templates->edit_stopped_waiting(note->template_id, false);
  json data = {{"id", r.id}, {"state", request_state_name(r.state)}, {"model", note->model_id}};
  if (done) {
    data["result"] = "/v1/edits/" + std::to_string(r.id) + "/result";
    data["steps_run"] = r.metrics.steps_run;
    data["total_ms"] = r.metrics.total_ms;
    data["cache_mode"] = r.output.cache_mode;
    data["prompt_truncated"] = r.output.prompt_truncated;
    data["adapters_from_step"] = r.output.adapters_from_step;
  } else {
    data["error"] = {{"code", error_code_name(r.status.code())}, {"message", r.status.message()}};
  }
  const std::string type = done ? "done" : "failed";
  // Cancelled by the shutdown, not by the client: it stays unfinished, to resume next time.
  const bool journal_end = note->journaled && !(r.state == RequestState::kCancelled && shutting_down.load());
  if (!journal_end) {
    events.emit(note->client, type, std::move(data));
    return;
  }
  // The event after the commit: a client told "done" can count on the result surviving a
  // restart. The write runs on the journal's thread; this (worker) thread goes on.
  journal_writer->post(
      [id = r.id, state = std::string(request_state_name(r.state)), file = done ? bytes_to_string(r.result_file) : std::string(),
       code = done ? std::string() : std::string(error_code_name(r.status.code())),
       message = done ? std::string() : r.status.message(), when = unix_now_ms()](JobJournal& j) {
        return j.finish_edit(id, state, file, code, message, when);
      },
      [this, client = note->client, type, data = std::move(data)](Status st) mutable {
        if (!st.ok()) log_line(LogLevel::kError, "journal: " + st.message());
        events.emit(client, type, std::move(data));
      });
}

ApiReply EngineService::edit_status(std::string_view id_text, bool want_result) {
  if (!ready()) return impl_->not_ready();
  auto id = parse_id(id_text);
  if (!id) return invalid_id_reply(id_text);
  return impl_->ledger->status(*id, want_result);
}

ApiReply EngineService::cancel_edit(std::string_view id_text) {
  if (!ready()) return impl_->not_ready();
  auto id = parse_id(id_text);
  if (!id) return invalid_id_reply(id_text);
  auto target = impl_->ledger->cancel_target(*id);
  if (auto* refused = std::get_if<ApiReply>(&target)) return *refused;
  const bool live = impl_->models->runtime().cancel(*id);
  return json_reply(202, {{"id", *id}, {"cancelling", live}});
}

size_t EngineService::live_edits() const { return impl_->ledger->live_count(); }

bool EngineService::drain(double timeout_ms, double cancel_timeout_ms) {
  if (!ready()) return true;
  if (impl_->models->drain(timeout_ms)) return true;
  const auto live = impl_->ledger->live();
  impl_->shutting_down.store(true);
  for (const auto& [id, slot] : live) impl_->models->runtime().cancel(id);
  return impl_->models->drain(cancel_timeout_ms);
}

}  // namespace infill
