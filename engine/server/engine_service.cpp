#include "server/engine_service.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <variant>

#include "cache/activation_store.h"
#include "model/model.h"
#include "model/prompt_encoder.h"
#include "pipeline/edit_session.h"
#include "pipeline/load_edit_model.h"
#include "pipeline/image_io.h"
#include "pipeline/template_image.h"
#include "serving/cost_calibration.h"
#include "serving/serving_runtime.h"
#include "serving/task_pool.h"
#include "server/job_journal.h"
#include "server/edit_request.h"
#include "server/journal_writer.h"
#include "server/multipart.h"
#include "server/prometheus_metrics.h"
#include "server/service_metrics.h"

namespace infill {
namespace {

using nlohmann::json;

// Plausible coefficients for when the cost model is not calibrated (tests, --check): the
// router and scheduler need one, and only their ordering decisions depend on it.
std::string bytes_to_string(const std::vector<std::byte>& b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

std::span<const std::byte> as_bytes(const std::string& s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
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

json request_metrics_json(const RequestMetrics& m) {
  return {{"worker", m.worker},       {"queue_ms", m.queue_ms},
          {"prepare_ms", m.prepare_ms}, {"run_ms", m.run_ms},
          {"post_ms", m.post_ms},     {"total_ms", m.total_ms},
          {"steps_requested", m.steps_requested}, {"steps_run", m.steps_run},
          {"steps_dropped", m.steps_dropped}, {"masked_tokens", m.masked_tokens},
          {"total_tokens", m.total_tokens}, {"deadline_ms", m.deadline_ms},
          {"deadline_met", m.deadline_met}, {"shared_prepare", m.shared_prepare}};
}

// Inverse of error_code_name for codes read back from the journal (unknown -> internal).
ErrorCode error_code_from_name(const std::string& name) {
  for (int c = 1; c <= static_cast<int>(ErrorCode::kCancelled); ++c)
    if (name == error_code_name(static_cast<ErrorCode>(c))) return static_cast<ErrorCode>(c);
  return ErrorCode::kInternal;
}

struct TemplateRecord {
  std::shared_ptr<const TemplateImage> tmpl;  // encoded by the default model
  // Encoded by another model, keyed by its id: made on the first edit that names the model
  // (see Impl::template_for), dropped with the template.
  std::map<std::string, std::shared_ptr<const TemplateImage>> other_models;
  std::string name;
  double last_used_ms = 0;
  int waiting = 0;       // edits on it that have not run a step yet
  bool prepared = false; // an edit on it ran a step (its prepare job finished)
  // With a journal or several models: the uploaded file, written to the journal with its
  // first batch edit and encoded again for another model.
  std::shared_ptr<const std::string> bytes;
  bool journaled = false;
};

struct EditRecord {
  uint64_t id = 0;
  std::string client;
  std::string template_id;
  std::string model_id;  // the model it runs on
  size_t slot = 0;       // that model's index in Impl::slots
  RequestState state = RequestState::kQueued;
  bool started = false;
  int steps_done = 0;
  int steps_total = 0;
  std::string png;
  Status status;
  double submitted_ms = 0;
  double finished_ms = -1;
  json metrics;
  bool journaled = false;  // a batch edit in the job journal
};

// One loaded model and the runtime whose workers run its edits.
struct ModelSlot {
  std::shared_ptr<const EditModel> model;  // any family
  std::shared_ptr<const Model> dit;        // the same model when it is of the DiT family (calibration)
  std::unique_ptr<ServingRuntime> runtime;
};

// The model id a journaled edit was submitted to ("" for edits journaled before edits named
// their model: those ran on the default model).
std::string journaled_model_id(const std::string& params_json) {
  const json p = json::parse(params_json, nullptr, false);
  return p.is_object() && p.contains("model") && p["model"].is_string() ? p["model"].get<std::string>() : std::string();
}

}  // namespace

struct EngineService::Impl {
  ServiceOptions options;
  std::chrono::steady_clock::time_point epoch = std::chrono::steady_clock::now();
  std::unique_ptr<TaskPool> pool;

  std::atomic<bool> ready{false};
  std::atomic<bool> loading{false};
  // Written once by load() before `ready` is set; read-only afterwards (the runtimes' own
  // methods are thread-safe).
  std::vector<ModelSlot> slots;        // slots[0] is the default model
  std::shared_ptr<const EditModel> model;  // the default model, slots[0].model
  std::shared_ptr<ActivationStore> store;
  std::unique_ptr<JobJournal> journal;  // null without options.journal_path
  // Every journal write after load() goes through it: off the io thread and off `mu`.
  std::unique_ptr<JournalWriter> journal_writer;
  std::mutex reserve_mu;  // one id reservation at a time (held without `mu`)
  uint64_t edits_resumed = 0;
  uint64_t ids_reserved = 0;  // with a journal: ids up to here are recorded as handed out
  static constexpr uint64_t kIdBlock = 1000;
  // Set when the engine stops: edits cancelled from here on stay unfinished in the journal,
  // so the next start resumes them.
  std::atomic<bool> shutting_down{false};

  mutable std::mutex mu;  // guards everything below; never held while computing
  std::string load_error;
  std::map<std::string, TemplateRecord> templates;
  std::map<uint64_t, EditRecord> edits;
  std::map<std::string, uint64_t> client_ids;
  std::map<std::string, int> live_per_client;
  int live_total = 0;
  uint64_t next_id = 1;
  uint64_t templates_created = 0, edits_submitted = 0, edits_rejected = 0;
  std::map<std::string, uint64_t> edits_finished;  // by terminal state name

  std::mutex sink_mu;  // held while the sink runs, so detaching waits for calls in progress
  std::function<void(const ServiceEvent&)> sink;

  static int64_t unix_now_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  }

  double now_ms() const {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - epoch).count();
  }

  void emit(const std::string& client, const std::string& type, json data) {
    data["type"] = type;
    ServiceEvent e{client, type, data.dump(-1, ' ', false, json::error_handler_t::replace)};
    std::lock_guard lock(sink_mu);
    if (sink) sink(e);
  }

  // What GET /v1/metrics and GET /metrics render.
  ServiceMetrics snapshot() const;

  ApiReply not_ready() const {
    std::string why;
    {
      std::lock_guard lock(mu);
      why = load_error.empty() ? "the engine is loading its model" : "the model failed to load: " + load_error;
    }
    ApiReply r = error_reply(503, "not_ready", why);
    r.retry_after_s = 1;
    return r;
  }

  // A dropped result leaves the journal too (best effort: a leftover row expires again at start).
  void forget_locked(const EditRecord& e) {
    if (e.journaled && journal_writer)
      journal_writer->post([id = e.id](JobJournal& j) { return j.forget_edit(id); });
  }

  // Drops finished edits past their TTL, then the oldest finished ones beyond max_results.
  void expire_results_locked(double now) {
    size_t finished = 0;
    for (auto it = edits.begin(); it != edits.end();) {
      if (it->second.finished_ms >= 0 && now - it->second.finished_ms > options.limits.result_ttl_ms) {
        forget_locked(it->second);
        it = edits.erase(it);
      } else {
        finished += it->second.finished_ms >= 0 ? 1 : 0;
        ++it;
      }
    }
    for (auto it = edits.begin(); it != edits.end() && finished > static_cast<size_t>(options.limits.max_results);) {
      if (it->second.finished_ms >= 0) {
        forget_locked(it->second);
        it = edits.erase(it);
        --finished;
      } else {
        ++it;
      }
    }
  }

  json template_json_locked(const TemplateRecord& t) const {
    std::string state = "ready";
    if (t.prepared || store->contains(model->cache_key(*t.tmpl, EditParams{}))) state = "prepared";
    else if (t.waiting > 0) state = "preparing";
    return {{"id", t.tmpl->id},
            {"name", t.name},
            {"width", t.tmpl->width},
            {"height", t.tmpl->height},
            {"model_width", t.tmpl->model_width},
            {"model_height", t.tmpl->model_height},
            {"format", pixel_format_name(t.tmpl->pixels.format)},
            {"channels", t.tmpl->pixels.channels},
            {"state", state},
            {"edits_waiting", t.waiting}};
  }

  json edit_json_locked(const EditRecord& e) const {
    json j = {{"id", e.id},
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

  /// The slot of the model with `id`, or -1.
  int find_slot(const std::string& id) const {
    for (size_t i = 0; i < slots.size(); ++i)
      if (slots[i].model->info().id == id) return static_cast<int>(i);
    return -1;
  }
  /// "a, b" (for messages).
  std::string model_ids() const {
    std::string ids;
    for (const ModelSlot& m : slots) ids += (ids.empty() ? "" : ", ") + m.model->info().id;
    return ids;
  }

  ApiReply make_template_now(const std::string& bytes, const std::string& name);
  /// The template as model `slot` sees it, or the reply that says why not.
  std::variant<std::shared_ptr<const TemplateImage>, ApiReply> template_for(const std::string& template_id, size_t slot);
  /// Takes back an edit that submit_now had counted but could not hand to the runtime.
  void unaccept(uint64_t id, const std::string& client, const std::string& template_id) {
    std::lock_guard lock(mu);
    edits.erase(id);
    --live_per_client[client];
    --live_total;
    if (auto t = templates.find(template_id); t != templates.end()) --t->second.waiting;
  }
  /// `replay_id` != 0: an edit resumed from the journal, under its old id and past the limits.
  ApiReply submit_now(EditSubmission s, uint64_t replay_id = 0);
  Status resume_journal();
  Result<at::Tensor> decode_mask(const std::string& bytes, const json& rect, const TemplateImage& tmpl) const;
  void on_progress(uint64_t id, const RequestProgress& p);
  void on_preview(uint64_t id, int steps_done, const at::Tensor& rgb);
  void on_complete(const RequestResult& r);
};

EngineService::EngineService(ServiceOptions options) : impl_(std::make_shared<Impl>()) {
  impl_->options = std::move(options);
  impl_->pool = std::make_unique<TaskPool>(std::max(1, impl_->options.pool_threads), 1);
}

EngineService::~EngineService() {
  // The runtime first: its callbacks reach into the records below.
  impl_->shutting_down.store(true);
  for (ModelSlot& m : impl_->slots) m.runtime.reset();
  impl_->pool.reset();
  impl_->journal_writer.reset();  // runs the writes still queued (their events go out first)
  set_event_sink({});
}

namespace {

// The calibration cache of the model at `index`: the configured path for the default model,
// "<stem>.<index><ext>" for the others (each file holds one model's timings).
std::string calibration_path_for(const std::string& path, size_t index) {
  if (path.empty() || index == 0) return path;
  const size_t slash = path.find_last_of('/');
  const size_t dot = path.find_last_of('.');
  const size_t cut = dot != std::string::npos && (slash == std::string::npos || dot > slash) ? dot : path.size();
  return path.substr(0, cut) + "." + std::to_string(index) + path.substr(cut);
}

}  // namespace

Status EngineService::load() {
  Impl& s = *impl_;
  if (s.loading.exchange(true)) return invalid_argument("EngineService::load called twice");
  auto fail = [&](const Status& st) {
    std::lock_guard lock(s.mu);
    s.load_error = st.message();
    return st;
  };
  std::vector<std::string> paths = {s.options.model_path};
  paths.insert(paths.end(), s.options.extra_model_paths.begin(), s.options.extra_model_paths.end());
  std::vector<LoadedEditModel> models;
  for (size_t i = 0; i < paths.size(); ++i) {
    auto model = load_edit_model(paths[i]);
    if (!model.ok()) return fail(paths.size() == 1 ? model.status() : Status(model.status().code(), paths[i] + ": " + model.status().message()));
    const std::string& id = model->model->info().id;
    for (size_t j = 0; j < models.size(); ++j) {
      if (models[j].model->info().id == id)
        return fail(invalid_argument("models " + paths[j] + " and " + paths[i] + " are the same model (" + id +
                                     "); give each model once"));
    }
    models.push_back(std::move(*model));
  }
  ActivationStoreOptions store_options;
  store_options.ram_budget_bytes = s.options.ram_cache_bytes;
  store_options.disk_dir = s.options.cache_dir;
  auto store = ActivationStore::open(store_options);
  if (!store.ok()) return fail(store.status());
  std::shared_ptr<ActivationStore> shared_store(std::move(*store));
  std::vector<ModelSlot> slots;
  for (size_t i = 0; i < models.size(); ++i) {
    std::shared_ptr<const StepCostModel> cost;
    // The calibration runs the DiT family's forward; other families start from the plausible
    // coefficients (their scheduler deadlines are then estimates).
    if (s.options.calibrate && models[i].dit) {
      CalibrationOptions co;
      co.threads = s.options.threads_per_worker;
      co.cache_path = calibration_path_for(s.options.calibration_path, i);
      auto cal = load_or_calibrate(*models[i].dit, co);
      if (!cal.ok()) return fail(cal.status());
      cost = std::make_shared<const StepCostModel>(cal->model);
    } else {
      cost = std::make_shared<const StepCostModel>(StepCostModel::plausible());
    }
    RuntimeOptions ro;
    ro.workers = s.options.workers;
    ro.threads_per_worker = s.options.threads_per_worker;
    ro.pool_threads = std::max(1, s.options.pool_threads);
    ro.worker.before_step = s.options.before_step;
    auto runtime = ServingRuntime::create(models[i].model, shared_store, cost, ro);
    if (!runtime.ok()) return fail(runtime.status());
    slots.push_back({models[i].model, models[i].dit, std::move(*runtime)});
  }
  s.slots = std::move(slots);
  s.model = s.slots.front().model;
  s.store = shared_store;
  if (!s.options.journal_path.empty()) {
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

Status EngineService::Impl::resume_journal() {
  auto max_id = journal->max_edit_id();
  if (!max_id.ok()) return max_id.status();
  auto journaled = journal->edits();
  if (!journaled.ok()) return journaled.status();
  {
    std::lock_guard lock(mu);
    next_id = std::max(next_id, *max_id + 1);
  }
  const int64_t unix_now = unix_now_ms();
  for (JournaledEdit& je : *journaled) {
    if (!je.final_state.empty()) {
      // Finished before the restart: keep the result until it expires, on the wall clock.
      const double age_ms = double(std::max<int64_t>(0, unix_now - je.finished_unix_ms));
      if (age_ms > options.limits.result_ttl_ms) {
        (void)journal->forget_edit(je.id);
        continue;
      }
      auto state = parse_request_state(je.final_state);
      std::lock_guard lock(mu);
      EditRecord& e = edits[je.id];
      e.id = je.id;
      e.client = je.client;
      e.template_id = je.template_id;
      e.model_id = journaled_model_id(je.params_json);
      if (e.model_id.empty()) e.model_id = model->info().id;
      e.state = state.ok() ? *state : RequestState::kFailed;
      e.started = true;
      e.png = std::move(je.result_png);
      if (e.state != RequestState::kDone)
        e.status = Status(error_code_from_name(je.error_code), je.error_message);
      e.finished_ms = now_ms() - age_ms;
      e.journaled = true;
      continue;
    }
    // Unfinished: decode its template again (once) and submit it under its old id, on the
    // model it was submitted to.
    const std::string model_id = journaled_model_id(je.params_json);
    auto fail_resume = [&](const Status& why) {
      const std::string message = "could not be resumed after a restart: " + why.message();
      (void)journal->finish_edit(je.id, "failed", "", error_code_name(why.code()), message, unix_now);
      // Its client learns why from GET /v1/edits/{id}, as for an edit that failed while running.
      std::lock_guard lock(mu);
      EditRecord& e = edits[je.id];
      e.id = je.id;
      e.client = je.client;
      e.template_id = je.template_id;
      e.model_id = model_id.empty() ? model->info().id : model_id;
      e.state = RequestState::kFailed;
      e.started = true;
      e.status = Status(why.code(), message);
      e.finished_ms = now_ms();
      e.journaled = true;
    };
    if (!model_id.empty() && find_slot(model_id) < 0) {
      fail_resume(not_found("edit " + std::to_string(je.id) + " was submitted to model " + model_id +
                            ", which this engine does not serve now (loaded: " + model_ids() + ")"));
      continue;
    }
    bool known = false;
    {
      std::lock_guard lock(mu);
      known = templates.count(je.template_id) > 0;
    }
    if (!known) {
      auto t = journal->template_bytes(je.template_id);
      if (!t.ok()) {
        fail_resume(t.status());
        continue;
      }
      ApiReply made = make_template_now(t->bytes, t->name);
      if (made.status != 200 && made.status != 201) {
        fail_resume(io_error("template " + je.template_id + ": " + made.body));
        continue;
      }
      std::lock_guard lock(mu);
      if (auto it = templates.find(je.template_id); it != templates.end()) it->second.journaled = true;
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

void EngineService::set_event_sink(std::function<void(const ServiceEvent&)> sink) {
  std::lock_guard lock(impl_->sink_mu);
  impl_->sink = std::move(sink);
}

ApiReply EngineService::health() const {
  if (!ready()) return impl_->not_ready();
  json ids = json::array();
  for (const ModelSlot& m : impl_->slots) ids.push_back(m.model->info().id);
  return json_reply(200, {{"status", "ok"}, {"model", impl_->model->info().id}, {"models", ids}, {"live_edits", live_edits()}});
}

ApiReply EngineService::models() const {
  if (!ready()) return impl_->not_ready();
  json list = json::array();
  for (size_t i = 0; i < impl_->slots.size(); ++i) {
    const EditModel& model = *impl_->slots[i].model;
    const EditModelInfo& m = model.info();
    list.push_back({{"id", m.id},
                    {"name", m.name},
                    {"description", m.description},
                    {"family", m.family},
                    {"default", i == 0},
                    {"max_image_pixels", std::min<int64_t>(m.max_image_pixels, impl_->options.limits.max_image_pixels)},
                    {"default_steps", m.default_steps},
                    {"default_sampler", m.default_sampler},
                    {"default_guidance", m.default_guidance},
                    {"prompt", m.free_text ? "free_text" : "vocabulary"},
                    {"vocabulary", m.vocabulary},
                    {"grid_pixels", model.token_pixels()}});
  }
  return json_reply(200, {{"models", list}});
}

ServiceMetrics EngineService::Impl::snapshot() const {
  ServiceMetrics m;
  for (const ModelSlot& slot : slots) {
    const std::string& id = slot.model->info().id;
    for (WorkerMetrics& w : slot.runtime->worker_metrics()) m.workers.push_back({id, std::move(w)});
    int index = 0;
    for (const WorkerLoad& l : slot.runtime->loads()) m.loads.push_back({id, index++, l});
    const auto more = slot.runtime->request_metrics();
    m.recent_requests.insert(m.recent_requests.end(), more.begin(), more.end());
  }
  m.cache = store->stats();
  m.resident_bytes = process_resident_bytes();
  m.uptime_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch).count();
  m.edits_resumed = edits_resumed;
  m.journal_path = journal ? journal->path() : std::string();
  m.journal_pending = journal_writer ? journal_writer->pending() : 0;
  std::lock_guard lock(mu);
  m.live_edits = live_total;
  m.templates = templates.size();
  m.templates_created = templates_created;
  m.edits_submitted = edits_submitted;
  m.edits_rejected = edits_rejected;
  m.edits_finished = edits_finished;
  for (const auto& [id, e] : edits) m.edits_by_state[request_state_name(e.state)] += 1;
  m.results_kept = edits.size();
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
      reply = s->make_template_now(bytes, name);
    } catch (const std::exception& e) {  // never across the pool thread
      reply = error_reply(500, "internal", std::string("template decoding failed: ") + e.what());
    }
    done(std::move(reply));
  });
}

ApiReply EngineService::Impl::make_template_now(const std::string& bytes, const std::string& name) {
  if (bytes.empty()) return error_reply(400, "empty_body", "template upload " + name + " is empty; send the image file as the body");
  // The server's pixel limit is checked from the header before the full decode (make_template
  // applies only the model's own limit).
  if (options.limits.max_image_pixels < model->info().max_image_pixels) {
    auto probe = decode_image(as_bytes(bytes), name, options.limits.max_image_pixels);
    if (!probe.ok()) return status_reply(probe.status(), true);
  }
  auto t = model->make_template(as_bytes(bytes), name);
  if (!t.ok()) return status_reply(t.status(), true);
  std::lock_guard lock(mu);
  const double now = now_ms();
  auto [it, inserted] = templates.try_emplace((*t)->id);
  if (inserted) {
    it->second.tmpl = *t;
    it->second.name = name;
    if (journal || slots.size() > 1) it->second.bytes = std::make_shared<const std::string>(bytes);
    ++templates_created;
  }
  it->second.last_used_ms = now;
  // LRU beyond the limit; live edits keep their own reference to the pixels.
  while (templates.size() > static_cast<size_t>(options.limits.max_templates)) {
    auto victim = templates.begin();
    for (auto i = templates.begin(); i != templates.end(); ++i)
      if (i->second.last_used_ms < victim->second.last_used_ms) victim = i;
    templates.erase(victim);
  }
  return json_reply(inserted ? 201 : 200, template_json_locked(it->second));
}

// The default model's encoding is made at upload (its errors are the upload's answer). Another
// model's is made lazily, on the first edit that names that model, from the kept file bytes,
// and then kept with the template (evicted with it): an upload costs one encode however many
// models are loaded, and a template edited with one model never pays for the others. The
// encoding runs here, on the service pool, outside the lock; two edits racing to encode the
// same pair both compute it and the first stored wins (the results are identical).
std::variant<std::shared_ptr<const TemplateImage>, ApiReply> EngineService::Impl::template_for(const std::string& template_id,
                                                                                               size_t slot) {
  const EditModel& m = *slots[slot].model;
  const std::string& model_id = m.info().id;
  std::shared_ptr<const std::string> bytes;
  std::string name;
  {
    std::lock_guard lock(mu);
    auto it = templates.find(template_id);
    if (it == templates.end())
      return error_reply(404, "template_not_found", "template " + template_id + " is not known (upload it with POST /v1/templates)");
    it->second.last_used_ms = now_ms();
    if (slot == 0) return it->second.tmpl;
    if (auto e = it->second.other_models.find(model_id); e != it->second.other_models.end()) return e->second;
    bytes = it->second.bytes;
    name = it->second.name;
  }
  if (!bytes)  // kept whenever several models are loaded; a bug otherwise
    return error_reply(500, "internal", "template " + template_id + " has no kept file to encode for model " + model_id);
  auto t = m.make_template(as_bytes(*bytes), name);
  if (!t.ok()) {
    ApiReply r = status_reply(Status(t.status().code(), "template " + template_id + " for model " + model_id + ": " + t.status().message()), true);
    return r;
  }
  std::lock_guard lock(mu);
  auto it = templates.find(template_id);
  if (it == templates.end()) return *t;  // evicted meanwhile: the edit keeps its own reference
  return it->second.other_models.try_emplace(model_id, *t).first->second;
}

ApiReply EngineService::template_status(std::string_view id) const {
  if (!ready()) return impl_->not_ready();
  std::lock_guard lock(impl_->mu);
  auto it = impl_->templates.find(std::string(id));
  if (it == impl_->templates.end())
    return error_reply(404, "template_not_found", "template " + std::string(id) + " is not known (upload it with POST /v1/templates)");
  return json_reply(200, impl_->template_json_locked(it->second));
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

Result<at::Tensor> EngineService::Impl::decode_mask(const std::string& bytes, const json& rect,
                                                    const TemplateImage& tmpl) const {
  if (!rect.is_null()) {
    if (!rect.is_array() || rect.size() != 4 || !std::all_of(rect.begin(), rect.end(), [](const json& v) { return v.is_number_integer(); }))
      return invalid_argument("mask_rect must be [x, y, width, height] in integer pixels");
    const int64_t x = rect[0].get<int64_t>(), y = rect[1].get<int64_t>(), w = rect[2].get<int64_t>(), h = rect[3].get<int64_t>();
    if (x < 0 || y < 0 || w <= 0 || h <= 0 || x + w > tmpl.width || y + h > tmpl.height)
      return invalid_argument("mask_rect [" + std::to_string(x) + ", " + std::to_string(y) + ", " + std::to_string(w) + ", " +
                              std::to_string(h) + "] is not inside the " + std::to_string(tmpl.width) + "x" +
                              std::to_string(tmpl.height) + " template");
    at::Tensor m = at::zeros({tmpl.height, tmpl.width});
    m.narrow(0, y, h).narrow(1, x, w).fill_(1.0);
    return m;
  }
  auto image = decode_image(as_bytes(bytes), "mask", options.limits.max_image_pixels);
  if (!image.ok()) return image.status();
  if (image->width != tmpl.width || image->height != tmpl.height)
    return invalid_argument("mask is " + std::to_string(image->width) + "x" + std::to_string(image->height) +
                            ", template is " + std::to_string(tmpl.width) + "x" + std::to_string(tmpl.height));
  // Grey is replicated to RGB, alpha dropped: the mean is the grey value, or RGB's mean.
  return to_rgb_tensor(*image).mean(0).contiguous();
}

ApiReply EngineService::Impl::submit_now(EditSubmission sub, uint64_t replay_id) {
  c10::InferenceMode guard;
  const json& p = sub.params;
  auto parsed = parse_edit_request(p, std::move(sub.mask_bytes));
  if (auto* refused = std::get_if<ApiReply>(&parsed)) return *refused;
  EditRequestFields& f = std::get<EditRequestFields>(parsed);
  const std::string& template_id = f.template_id;
  size_t slot = 0;  // "" = the default model
  if (!f.model.empty()) {
    const int found = find_slot(f.model);
    if (found < 0)
      return error_reply(400, "unknown_model", "model '" + f.model + "' is not loaded (loaded: " + model_ids() + "; see GET /v1/models)");
    slot = static_cast<size_t>(found);
  }
  const EditModel& model_used = *slots[slot].model;
  const std::string& model_id = model_used.info().id;
  const RequestClass cls = f.cls;

  auto found_template = template_for(template_id, slot);
  if (auto* failed = std::get_if<ApiReply>(&found_template)) return *failed;
  const std::shared_ptr<const TemplateImage> tmpl = std::get<std::shared_ptr<const TemplateImage>>(found_template);
  auto mask = decode_mask(f.mask_bytes, f.mask_rect, *tmpl);
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
  req.params.mask = *mask;
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
  req.supersedes = f.supersedes ? static_cast<uint64_t>(*f.supersedes) : 0;
  {
    Status check = model_used.check_schedule(req.params);
    if (!check.ok()) return error_reply(400, "invalid_parameter", check.message());
  }
  req.encode_png = true;
  {
    Status check = model_used.check_schedule(req.params);
    if (!check.ok()) return error_reply(400, "invalid_parameter", check.message());
  }

  uint64_t id = 0;
  std::optional<JournaledTemplate> journal_template;
  bool journal_edit = false;
  // An edit superseding a live edit of another model: each runtime only knows its own
  // requests, so the service cancels that one itself once this one is queued.
  uint64_t cancel_other = 0;
  size_t cancel_other_slot = 0;
  if (replay_id == 0 && journal_writer) {
    // Ids are reserved in blocks so that a restart never hands out one a client still holds.
    // The write runs here, on the pool thread, not under `mu` (which the io thread takes).
    std::lock_guard reserving(reserve_mu);
    uint64_t next = 0, reserved = 0;
    {
      std::lock_guard lock(mu);
      next = next_id;
      reserved = ids_reserved;
    }
    if (next > reserved) {
      Status st = journal_writer->run([want = next + kIdBlock](JobJournal& j) { return j.reserve_ids(want); });
      if (!st.ok()) return error_reply(503, "journal_unavailable", "the edit was not accepted: " + st.message());
      std::lock_guard lock(mu);
      ids_reserved = std::max(ids_reserved, next + kIdBlock);
    }
  }
  {
    std::lock_guard lock(mu);
    expire_results_locked(now_ms());
    if (req.supersedes != 0) {
      auto old = edits.find(req.supersedes);
      if (old != edits.end() && old->second.finished_ms < 0 && old->second.slot != slot) {
        if (old->second.client != sub.client)
          return error_reply(400, "invalid_parameter", "supersedes names edit " + std::to_string(req.supersedes) +
                                                           " of client " + old->second.client + ", expected one of client " +
                                                           sub.client);
        cancel_other = req.supersedes;
        cancel_other_slot = old->second.slot;
        req.supersedes = 0;
      }
    }
    if (replay_id == 0 && live_per_client[sub.client] >= options.limits.max_queued_per_client) {
      ++edits_rejected;
      ApiReply r = error_reply(429, "too_many_edits",
                               "client " + sub.client + " has " + std::to_string(live_per_client[sub.client]) +
                                   " edits in flight, the limit is " + std::to_string(options.limits.max_queued_per_client));
      r.retry_after_s = 1;
      return r;
    }
    if (replay_id == 0 && live_total >= options.limits.max_live_edits) {
      ++edits_rejected;
      ApiReply r = error_reply(429, "engine_busy", "the engine has " + std::to_string(live_total) +
                                                       " edits in flight, the limit is " + std::to_string(options.limits.max_live_edits));
      r.retry_after_s = 1;
      return r;
    }
    if (replay_id == 0 && journal && next_id > ids_reserved) {
      // More submissions at once than one reserved block holds: refuse rather than hand out
      // an id a restart could reuse.
      ApiReply r = error_reply(503, "journal_unavailable", "the edit was not accepted: its id is not reserved yet");
      r.retry_after_s = 1;
      return r;
    }
    id = replay_id != 0 ? replay_id : next_id++;
    auto [cit, fresh] = client_ids.try_emplace(sub.client, client_ids.size() + 1);
    (void)fresh;
    req.client_id = cit->second;
    EditRecord& e = edits[id];
    e.id = id;
    e.client = sub.client;
    e.template_id = template_id;
    e.model_id = model_id;
    e.slot = slot;
    e.submitted_ms = now_ms();
    e.journaled = journal && cls == RequestClass::kBatch;
    ++live_per_client[sub.client];
    ++live_total;
    ++edits_submitted;
    // The template may have been evicted meanwhile; the request holds its own reference.
    if (auto t = templates.find(template_id); t != templates.end()) {
      ++t->second.waiting;
      if (e.journaled && replay_id == 0 && !t->second.journaled && t->second.bytes) {
        journal_template = JournaledTemplate{template_id, t->second.name, *t->second.bytes};
      }
    }
    journal_edit = e.journaled && replay_id == 0;
  }
  if (journal_edit) {
    // Accepted means journaled: the 202 goes out only after the commit.
    Status st;
    if (journal_template) {
      st = journal_writer->run([&](JobJournal& j) { return j.add_template(*journal_template); });
      if (st.ok()) {
        std::lock_guard lock(mu);
        if (auto t = templates.find(template_id); t != templates.end()) t->second.journaled = true;
      }
    }
    if (st.ok()) {
      json stored = p;
      stored.erase("mask_png_base64");  // kept once, as the mask bytes
      stored.erase("supersedes");       // a resumed edit supersedes nothing
      stored["model"] = model_id;  // resumed on its own model, even if the default changed
      JournaledEdit je;
      je.id = id;
      je.client = sub.client;
      je.template_id = template_id;
      je.params_json = stored.dump();
      je.mask_bytes = f.mask_bytes;
      st = journal_writer->run([&](JobJournal& j) { return j.add_edit(je); });
    }
    if (!st.ok()) {
      unaccept(id, sub.client, template_id);
      return error_reply(503, "journal_unavailable", "the batch edit was not accepted: " + st.message());
    }
  }
  req.id = id;
  const std::string client = sub.client;
  req.on_progress = [this, id](const RequestProgress& pr) { on_progress(id, pr); };
  if (req.preview_every_steps > 0)
    req.on_preview = [this](uint64_t rid, int steps_done, const at::Tensor& rgb) { on_preview(rid, steps_done, rgb); };
  req.on_complete = [this](const RequestResult& r) { on_complete(r); };
  // Queued goes out before the runtime can report progress.
  emit(client, "queued", {{"id", id}, {"template", template_id}, {"model", model_id}, {"class", request_class_name(cls)}});
  Status st = slots[slot].runtime->submit(std::move(req));
  if (!st.ok()) {
    unaccept(id, client, template_id);
    if (journal_edit) journal_writer->post([id](JobJournal& j) { return j.forget_edit(id); });
    emit(client, "failed", {{"id", id}, {"state", "failed"}, {"error", {{"code", error_code_name(st.code())}, {"message", st.message()}}}});
    return status_reply(st);
  }
  if (cancel_other != 0) slots[cancel_other_slot].runtime->cancel(cancel_other);
  return json_reply(202, {{"id", id}, {"state", "queued"}, {"template", template_id}, {"model", model_id}, {"client", client},
                          {"class", request_class_name(cls)}, {"status_url", "/v1/edits/" + std::to_string(id)}});
}

void EngineService::Impl::on_progress(uint64_t id, const RequestProgress& p) {
  std::string client, model_id;
  bool first = false;
  {
    std::lock_guard lock(mu);
    auto it = edits.find(id);
    if (it == edits.end()) return;
    EditRecord& e = it->second;
    if (e.finished_ms >= 0) return;  // the worker orders callbacks; this guards the record anyway
    e.steps_done = p.steps_done;
    e.steps_total = p.steps_total;
    if (!e.started) {
      e.started = true;
      first = true;
      e.state = RequestState::kRunning;
      if (auto t = templates.find(e.template_id); t != templates.end()) {
        t->second.waiting = std::max(0, t->second.waiting - 1);
        t->second.prepared = true;
      }
    }
    client = e.client;
    model_id = e.model_id;
  }
  if (first) emit(client, "started", {{"id", id}, {"model", model_id}, {"steps_total", p.steps_total}});
  emit(client, "progress", {{"id", id}, {"steps_done", p.steps_done}, {"steps_total", p.steps_total}});
}

void EngineService::Impl::on_preview(uint64_t id, int steps_done, const at::Tensor& rgb) {
  std::string client;
  {
    std::lock_guard lock(mu);
    auto it = edits.find(id);
    if (it == edits.end()) return;
    client = it->second.client;
  }
  c10::InferenceMode guard;
  // [3, h, w] float in [0, 1] -> interleaved u8.
  at::Tensor u8 = (rgb.detach().to(at::kFloat).clamp(0, 1) * 255).round().to(at::kByte).permute({1, 2, 0}).contiguous();
  PixelImage img = PixelImage::allocate(static_cast<int>(u8.size(1)), static_cast<int>(u8.size(0)), 3, PixelFormat::kU8);
  std::memcpy(img.data.data(), u8.data_ptr<uint8_t>(), img.data.size());
  auto png = encode_png(img);
  if (!png.ok()) return;  // a preview is best effort; the result still comes
  emit(client, "preview", {{"id", id}, {"steps_done", steps_done}, {"width", img.width}, {"height", img.height},
                           {"png_base64", base64_encode(bytes_to_string(*png))}});
}

void EngineService::Impl::on_complete(const RequestResult& r) {
  std::string client;
  json data = {{"id", r.id}, {"state", request_state_name(r.state)}};
  bool journaled = false;
  {
    std::lock_guard lock(mu);
    auto it = edits.find(r.id);
    if (it == edits.end()) return;
    EditRecord& e = it->second;
    journaled = e.journaled;
    if (!e.started) {
      if (auto t = templates.find(e.template_id); t != templates.end()) t->second.waiting = std::max(0, t->second.waiting - 1);
    }
    e.state = r.state;
    e.status = r.status;
    if (r.state == RequestState::kDone && !r.status.ok()) e.status = Status();
    e.png = bytes_to_string(r.png);
    e.finished_ms = now_ms();
    e.metrics = request_metrics_json(r.metrics);
    if (r.state == RequestState::kDone) {
      e.metrics["cache_mode"] = r.output.cache_mode;
      e.metrics["prompt_truncated"] = r.output.prompt_truncated;
    }
    e.steps_done = r.metrics.steps_run;
    edits_finished[request_state_name(r.state)] += 1;
    client = e.client;
    data["model"] = e.model_id;
    if (--live_per_client[client] <= 0) live_per_client.erase(client);
    --live_total;
    if (r.state == RequestState::kDone) {
      data["result"] = "/v1/edits/" + std::to_string(r.id) + "/result";
      data["steps_run"] = r.metrics.steps_run;
      data["total_ms"] = r.metrics.total_ms;
      data["cache_mode"] = r.output.cache_mode;
      data["prompt_truncated"] = r.output.prompt_truncated;
    } else {
      data["error"] = {{"code", error_code_name(r.status.code())}, {"message", r.status.message()}};
    }
  }
  if (journaled && r.state == RequestState::kCancelled && shutting_down.load()) {
    journaled = false;  // cancelled by the shutdown, not by the client: resume it next time
  }
  const std::string type = r.state == RequestState::kDone ? "done" : "failed";
  if (journaled) {
    // The event after the commit: a client told "done" can count on the result surviving a
    // restart. The write runs on the journal's thread; this (worker) thread goes on.
    const bool done = r.state == RequestState::kDone;
    journal_writer->post(
        [id = r.id, state = std::string(request_state_name(r.state)), png = done ? bytes_to_string(r.png) : std::string(),
         code = done ? std::string() : std::string(error_code_name(r.status.code())),
         message = done ? std::string() : r.status.message(), when = unix_now_ms()](JobJournal& j) {
          return j.finish_edit(id, state, png, code, message, when);
        },
        [this, client, type, data = std::move(data)](Status st) mutable {
          if (!st.ok()) std::fprintf(stderr, "infill-engine: journal: %s\n", st.message().c_str());
          emit(client, type, std::move(data));
        });
    return;
  }
  emit(client, type, std::move(data));
}

ApiReply EngineService::edit_status(std::string_view id_text, bool want_png) {
  if (!ready()) return impl_->not_ready();
  auto id = parse_id(id_text);
  if (!id) return error_reply(400, "invalid_edit_id", "edit id '" + std::string(id_text) + "' is not a positive integer");
  std::lock_guard lock(impl_->mu);
  impl_->expire_results_locked(impl_->now_ms());
  auto it = impl_->edits.find(*id);
  if (it == impl_->edits.end())
    return error_reply(404, "edit_not_found", "edit " + std::to_string(*id) + " is not known (never submitted, or its result expired)");
  const EditRecord& e = it->second;
  if (!want_png) return json_reply(200, impl_->edit_json_locked(e));
  if (e.state != RequestState::kDone)
    return error_reply(409, "edit_not_done", "edit " + std::to_string(*id) + " is " + request_state_name(e.state) + ", not done");
  ApiReply r;
  r.content_type = "image/png";
  r.body = e.png;
  return r;
}

ApiReply EngineService::cancel_edit(std::string_view id_text) {
  if (!ready()) return impl_->not_ready();
  auto id = parse_id(id_text);
  if (!id) return error_reply(400, "invalid_edit_id", "edit id '" + std::string(id_text) + "' is not a positive integer");
  size_t slot = 0;
  {
    std::lock_guard lock(impl_->mu);
    auto it = impl_->edits.find(*id);
    if (it == impl_->edits.end()) return error_reply(404, "edit_not_found", "edit " + std::to_string(*id) + " is not known");
    if (it->second.finished_ms >= 0)
      return error_reply(409, "edit_finished", "edit " + std::to_string(*id) + " already ended as " + request_state_name(it->second.state));
    slot = it->second.slot;
  }
  const bool live = impl_->slots[slot].runtime->cancel(*id);
  return json_reply(202, {{"id", *id}, {"cancelling", live}});
}

size_t EngineService::live_edits() const {
  std::lock_guard lock(impl_->mu);
  return static_cast<size_t>(std::max(0, impl_->live_total));
}

bool EngineService::drain(double timeout_ms, double cancel_timeout_ms) {
  if (!ready()) return true;
  // One deadline over all runtimes: each drains with what is left of it.
  auto drain_all = [&](double budget_ms) {
    const auto start = std::chrono::steady_clock::now();
    bool idle = true;
    for (const ModelSlot& m : impl_->slots) {
      const double spent = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      idle = m.runtime->drain(std::max(0.0, budget_ms - spent)) && idle;
    }
    return idle;
  };
  if (drain_all(timeout_ms)) return true;
  std::vector<std::pair<uint64_t, size_t>> live;
  {
    std::lock_guard lock(impl_->mu);
    for (const auto& [id, e] : impl_->edits)
      if (e.finished_ms < 0) live.emplace_back(id, e.slot);
  }
  impl_->shutting_down.store(true);
  for (const auto& [id, slot] : live) impl_->slots[slot].runtime->cancel(id);
  return drain_all(cancel_timeout_ms);
}

}  // namespace infill
