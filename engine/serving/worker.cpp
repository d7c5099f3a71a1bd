#include "serving/worker.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <exception>
#include <functional>
#include <limits>
#include <optional>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include "cache/load_plan.h"
#include "serving/device_fault.h"
#include "pipeline/cached_kv.h"
#include "pipeline/composite.h"
#include "pipeline/mask.h"
#include "pipeline/template_image.h"

namespace infill {
namespace {

std::atomic<int64_t> g_live_records{0};

std::string exception_text(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    // c10::Error messages carry a multi-line backtrace; the first line is the reason.
    std::string what = ex.what();
    const size_t nl = what.find('\n');
    return nl == std::string::npos ? what : what.substr(0, nl);
  } catch (...) {
    return "unknown exception";
  }
}

}  // namespace

// One request. Stage fields are touched by one thread at a time, handed over by messages:
// the pool during pre-processing, the loop while active, the pool again while finishing.
// The lifecycle is the exception: any thread may end a request, under `mu`.
struct Worker::Record {
  explicit Record(ServingRequest request, double submitted_ms)
      : req(std::move(request)), life(submitted_ms), submitted_ms(submitted_ms) {
    g_live_records.fetch_add(1);
  }
  ~Record() { g_live_records.fetch_sub(1); }

  ServingRequest req;
  const ServedModel* served = nullptr;  // the model of req, in the worker's list; set on submit
  const EditModel& model() const { return *served->model; }
  LiveCostModel* live_cost = nullptr;  // the served model's, on this worker
  std::shared_ptr<const StepCostModel> cost() const { return live_cost->current(); }
  std::mutex mu;
  RequestLifecycle life;  // guarded by mu
  std::atomic<bool> cancel_requested{false};
  std::atomic<bool> ended{false};  // set with the terminal transition
  Status cancel_reason;  // guarded by mu

  double submitted_ms = 0;
  double deadline_rel_ms = 0;
  double deadline_abs_ms = 0;
  double preprocess_ms = -1, ready_ms = -1, first_step_ms = -1, last_step_ms = -1, finish_ms = -1;
  std::atomic<double> post_start_ms{-1};  // written by the pool thread, read by whoever completes
  bool shared_prepare = false;
  // A streamed edit: its source (read speed measured after the steps), key and plan.
  std::shared_ptr<StreamedKvSource> streamed;
  std::optional<ActivationKey> streamed_key;
  int blocks = 0, recompute_blocks = 0;
  double slab_bytes = 0;

  std::shared_ptr<const TemplateImage> tmpl;
  std::shared_ptr<StepSession> session;
  int steps_total = 0;      // sampler steps of the schedule
  int steps_requested = 0;  // steps this edit runs (after strength)
  int steps_run = 0;
  // Denoising steps still planned; the scheduler may lower it (step reduction), and every
  // step then spreads the sampler levels left over the steps left.
  int steps_left = 0;
  int min_steps_total = 0;  // the class's floor on steps_run + steps_left
  int64_t tokens = 0;
  int64_t total_tokens = 0;
  double step_work_ms = 0;  // marginal cost of one of its steps
  std::atomic<double> remaining_work_ms{0.0};
  uint64_t ready_seq = 0;
  double last_advance_ms = 0;
  // The device team has it wait until then (now_ms()): its rank serves another's step.
  double team_hold_until_ms = 0;
  bool finishing = false;  // handed to the pool for post-processing

  // Callbacks to the client (progress, preview, completion) run on the pool but strictly in
  // the order they were posted, so no progress or preview can arrive after the completion.
  std::mutex callbacks_mu;
  std::deque<std::function<void()>> callbacks;  // guarded by callbacks_mu
  bool callbacks_draining = false;              // guarded by callbacks_mu
};

struct Worker::PrepareJob {
  std::shared_ptr<StepPrepare> run;
  const ServedModel* served = nullptr;
  uint64_t serial = 0;  // this worker's count of jobs: names it to the device team
  int steps_run = 0;
  double step_work_ms = 0;
  double deadline_abs_ms = 0;
  double team_hold_until_ms = 0;  // as Record's
  bool background = false;  // a prompt-keyed prepare nobody waits for (see worker.h)
  std::vector<std::shared_ptr<Record>> waiting;
};

struct Worker::Message {
  enum Kind {
    kReady,
    kNeedsPrepare,
    kCancel,
    kStored,
    kWantPromptPrepare,
    kBackgroundPrepare,
    kTask,
    kEndTeamHolds
  } kind = kReady;
  std::function<void()> task;             // kTask
  std::shared_ptr<Record> record;
  const ServedModel* served = nullptr;    // kWantPromptPrepare, kBackgroundPrepare
  std::shared_ptr<const TemplateImage> tmpl;
  std::string canonical;
  EditParams params;                      // kWantPromptPrepare
  std::shared_ptr<StepPrepare> prepare;   // kBackgroundPrepare; null when it could not be set up

  static Message of(Kind kind, std::shared_ptr<Record> record, std::shared_ptr<const TemplateImage> tmpl = nullptr,
                    std::string canonical = {}) {
    Message m;
    m.kind = kind;
    m.record = std::move(record);
    m.tmpl = std::move(tmpl);
    m.canonical = std::move(canonical);
    return m;
  }
};

int64_t Worker::live_records() { return g_live_records.load(); }

Worker::Worker(std::vector<ServedModel> models, std::shared_ptr<ActivationStore> store, TaskPool& pool,
               WorkerOptions options)
    : models_(std::move(models)),
      store_(std::move(store)),
      pool_(pool),
      options_(std::move(options)),
      device_(options_.device_label.empty() ? models_.front().model->device().name() : options_.device_label),
      selector_(options_.policy, options_.token_budget, options_.scheduler) {
  for (const ServedModel& m : models_) costs_.push_back(std::make_unique<LiveCostModel>(m.cost));
  metrics_.index = options_.index;
  metrics_.device = device_;
  thread_ = std::thread([this] { loop(); });
}

Worker::~Worker() {
  {
    std::lock_guard lock(inbox_mu_);
    stop_ = true;
  }
  inbox_cv_.notify_all();
  thread_.join();
  // Pool tasks may still reference this worker (pre/post-processing of its requests).
  pool_.wait_idle();
  std::vector<std::shared_ptr<Record>> left;
  {
    std::lock_guard lock(records_mu_);
    for (auto& [id, r] : records_) left.push_back(r);
  }
  for (auto& r : left) complete(r, RequestState::kCancelled, Status(ErrorCode::kCancelled, "worker stopped"));
  pool_.wait_idle();  // the on_complete callbacks just posted
}

double Worker::now_ms() const {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - options_.epoch).count();
}

void Worker::post(Message message) {
  {
    std::lock_guard lock(inbox_mu_);
    inbox_.push_back(std::move(message));
  }
  inbox_cv_.notify_one();
}

void Worker::run_on_loop(std::function<void()> task) {
  Message m;
  m.kind = Message::kTask;
  m.task = std::move(task);
  post(std::move(m));
}

void Worker::end_team_holds() {
  Message m;
  m.kind = Message::kEndTeamHolds;
  post(std::move(m));
}

const ServedModel* Worker::served_model(const EditModel* model) const {
  if (model == nullptr) return &models_.front();
  for (const ServedModel& m : models_)
    if (m.model.get() == model) return &m;
  return nullptr;
}

void Worker::submit(ServingRequest request, double submitted_ms) {
  auto r = std::make_shared<Record>(std::move(request), submitted_ms);
  r->served = served_model(r->req.model.get());
  if (r->served == nullptr) {
    // The runtime checks this first; a worker never runs a request on another model.
    r->served = &models_.front();
    r->live_cost = &cost_of(r->served);
    requests_.fetch_add(1);
    {
      std::lock_guard lock(records_mu_);
      records_[r->req.id] = r;
    }
    complete(r, RequestState::kFailed,
             invalid_argument("request " + std::to_string(r->req.id) + " names model " + r->req.model->name() +
                              ", which worker " + std::to_string(options_.index) + " does not serve"));
    return;
  }
  r->live_cost = &cost_of(r->served);
  r->deadline_rel_ms = r->req.deadline_ms.value_or(default_deadline_ms(r->req.cls));
  r->deadline_abs_ms = submitted_ms + r->deadline_rel_ms;
  // Until pre-processing knows the token count, charge the request by the mask's area.
  if (r->req.params.mask.defined() && r->req.tmpl) {
    const int steps = r->model().resolved_steps(r->req.params);
    const int p = r->model().token_pixels();
    const int64_t total = int64_t{(r->req.tmpl->model_width / p)} * (r->req.tmpl->model_height / p);
    const double ratio = r->req.params.mask.numel() > 0 ? (r->req.params.mask > 0).to(at::kFloat).mean().item<double>() : 0.0;
    r->tokens = static_cast<int64_t>(std::ceil(ratio * static_cast<double>(total)));
    r->total_tokens = total;
    r->remaining_work_ms = request_work_ms(*r->cost(), r->tokens, total, steps);
    work_ms_.fetch_add(r->remaining_work_ms.load());
    int cur = max_steps_left_.load();
    while (steps > cur && !max_steps_left_.compare_exchange_weak(cur, steps)) {
    }
  }
  requests_.fetch_add(1);
  {
    std::lock_guard lock(records_mu_);
    records_[r->req.id] = r;
  }
  pool_.post([this, r] { preprocess(r); });
}

bool Worker::cancel(uint64_t id, Status reason) {
  std::shared_ptr<Record> r;
  {
    std::lock_guard lock(records_mu_);
    auto it = records_.find(id);
    if (it == records_.end()) return false;
    r = it->second;
  }
  {
    std::lock_guard lock(r->mu);
    if (r->life.terminal()) return false;
    r->cancel_reason = reason.ok() ? Status(ErrorCode::kCancelled, "request " + std::to_string(id) + " cancelled")
                                   : std::move(reason);
  }
  r->cancel_requested = true;
  post(Message::of(Message::kCancel, r));
  return true;
}

WorkerLoad Worker::load() const {
  WorkerLoad l;
  l.requests = requests_.load();
  l.in_service = in_service_.load();
  // Each round pays the step intercept of the models in it: the dearest one stands for them.
  double backlog = 0;
  for (const auto& c : costs_) backlog = std::max(backlog, drain_ms(*c->current(), work_ms_.load(), max_steps_left_.load()));
  // Nothing held, nothing to drain (what the running sums of work left over is rounding).
  l.backlog_ms = l.requests > 0 ? backlog : 0.0;
  return l;
}

WorkerMetrics Worker::metrics() const {
  std::lock_guard lock(metrics_mu_);
  WorkerMetrics m = metrics_;
  m.uptime_ms = now_ms();
  for (size_t i = 0; i < models_.size(); ++i) {
    const LiveCostModel::Report c = costs_[i]->report();
    m.cost_by_model[models_[i].model->info().id] = {c.coefficients, c.samples, c.refits_adopted, c.mape};
    if (StepGraphStats g = models_[i].model->step_graph_stats(); g.budget_bytes > 0) {
      m.step_graphs_by_model[models_[i].model->info().id] = std::move(g);
    }
    if (const std::optional<int64_t> n = models_[i].model->codec_host_fallbacks()) {
      m.codec_host_fallbacks_by_model[models_[i].model->info().id] = *n;
    }
  }
  m.in_service = in_service_.load();
  {
    std::lock_guard fault_lock(fault_mu_);
    m.fault = fault_;
  }
  m.read_bytes_per_ms = read_bytes_per_ms_.load();
  if (m.recent_steps.size() > WorkerMetrics::kRecent) {
    m.recent_steps.erase(m.recent_steps.begin(), m.recent_steps.end() - WorkerMetrics::kRecent);
  }
  return m;
}

std::vector<RequestMetrics> Worker::recent_requests() const {
  std::lock_guard lock(metrics_mu_);
  return {recent_requests_.begin(), recent_requests_.end()};
}

bool Worker::wait_idle(double timeout_ms) const {
  std::unique_lock lock(records_mu_);
  return idle_cv_.wait_for(lock, std::chrono::duration<double, std::milli>(timeout_ms), [&] { return records_.empty(); });
}

void Worker::take_work(Record& r, double ms) {
  double cur = r.remaining_work_ms.load();
  double d = 0;
  do {
    d = std::min(ms, cur);
    if (d <= 0) return;
  } while (!r.remaining_work_ms.compare_exchange_weak(cur, cur - d));
  work_ms_.fetch_sub(d);
}

void Worker::complete(const std::shared_ptr<Record>& r, RequestState state, Status status, EditOutput output,
                      std::vector<std::byte> result_file, ImageFileFormat result_format) {
  auto result = std::make_shared<RequestResult>();
  const double now = now_ms();
  {
    std::lock_guard lock(r->mu);
    if (!r->life.transition(state, now).ok()) return;  // someone else ended it first
    r->ended = true;
    result->history = r->life.history();
  }
  work_ms_.fetch_sub(r->remaining_work_ms.exchange(0.0));
  RequestMetrics& m = result->metrics;
  m.id = r->req.id;
  m.worker = options_.index;
  const double pre_start = r->preprocess_ms >= 0 ? r->preprocess_ms : r->submitted_ms;
  m.prepare_ms = r->ready_ms >= 0 ? r->ready_ms - pre_start : 0.0;
  m.ready_ms = r->ready_ms >= 0 ? r->ready_ms - r->submitted_ms : 0.0;
  m.queue_ms = r->first_step_ms >= 0 ? std::max(0.0, r->first_step_ms - r->submitted_ms - m.prepare_ms) : 0.0;
  m.run_ms = r->first_step_ms >= 0 ? r->last_step_ms - r->first_step_ms : 0.0;
  m.post_ms = r->finish_ms >= 0 ? now - r->finish_ms : 0.0;
  m.post_work_ms = r->post_start_ms >= 0 ? now - r->post_start_ms : 0.0;
  if (state == RequestState::kDone && r->finish_ms >= 0) {
    // Running mean over the recent results, for the scheduler's deadlines (see run_step).
    const double before = post_estimate_ms_.load();
    post_estimate_ms_.store(before > 0 ? 0.9 * before + 0.1 * m.post_ms : m.post_ms);
  }
  m.total_ms = now - r->submitted_ms;
  m.steps_requested = r->steps_requested;
  m.steps_run = r->steps_run;
  m.steps_dropped = state == RequestState::kDone ? std::max(0, r->steps_requested - r->steps_run) : 0;
  m.masked_tokens = r->tokens;
  m.total_tokens = r->total_tokens;
  m.deadline_ms = r->deadline_rel_ms;
  m.deadline_met = state == RequestState::kDone && m.total_ms <= r->deadline_rel_ms;
  m.shared_prepare = r->shared_prepare;
  m.streamed = r->streamed_key.has_value();
  m.copied_to_device = output.copied_to_device;
  if (m.streamed || m.copied_to_device) {  // the load plan's split, from the disk or over the bus
    m.blocks_recomputed = m.streamed ? r->recompute_blocks : output.recomputed_blocks;
    m.blocks_loaded = r->blocks - m.blocks_recomputed;
  }
  result->id = r->req.id;
  result->state = state;
  result->status = std::move(status);
  result->output = std::move(output);
  result->result_file = std::move(result_file);
  result->result_format = result_format;
  {
    std::lock_guard lock(metrics_mu_);
    recent_requests_.push_back(m);
    if (recent_requests_.size() > kRecentRequests) recent_requests_.pop_front();
  }
  auto on_complete = std::move(r->req.on_complete);
  r->session.reset();
  r->tmpl.reset();
  requests_.fetch_sub(1);
  {
    std::lock_guard lock(records_mu_);
    records_.erase(r->req.id);
    if (records_.empty()) idle_cv_.notify_all();
  }
  if (on_complete) notify(r, [cb = std::move(on_complete), result] { cb(*result); });
}

void Worker::notify(const std::shared_ptr<Record>& r, std::function<void()> callback) {
  {
    std::lock_guard lock(r->callbacks_mu);
    r->callbacks.push_back(std::move(callback));
    if (r->callbacks_draining) return;  // the running drainer will get to it, in order
    r->callbacks_draining = true;
  }
  pool_.post([r] {
    for (;;) {
      std::function<void()> next;
      {
        std::lock_guard lock(r->callbacks_mu);
        if (r->callbacks.empty()) {
          r->callbacks_draining = false;
          return;
        }
        next = std::move(r->callbacks.front());
        r->callbacks.pop_front();
      }
      try {
        next();
      } catch (...) {
        // A client callback that throws must not stop the ones after it (the completion).
      }
    }
  });
}

// ---- pre-processing (pool) ----

void Worker::preprocess(const std::shared_ptr<Record>& r) {
  if (r->cancel_requested) {
    std::unique_lock lock(r->mu);
    Status why = r->cancel_reason;
    lock.unlock();
    complete(r, RequestState::kCancelled, std::move(why));
    return;
  }
  {
    std::lock_guard lock(r->mu);
    r->preprocess_ms = now_ms();
    if (!r->life.transition(RequestState::kPreparing, r->preprocess_ms).ok()) return;  // ended meanwhile
  }
  const uint64_t id = r->req.id;
  auto fail = [&](const std::string& what) {
    complete(r, RequestState::kFailed, invalid_argument("request " + std::to_string(id) + ": " + what));
  };
  try {
    std::shared_ptr<const TemplateImage> tmpl = r->req.tmpl;
    if (!tmpl) {
      if (r->req.template_bytes.empty()) return fail("has neither a template nor template bytes");
      auto made = r->model().make_template(r->req.template_bytes, "template of request " + std::to_string(id));
      if (!made.ok()) {
        complete(r, RequestState::kFailed, made.status());
        return;
      }
      tmpl = *made;
      r->req.template_bytes.clear();
      r->req.template_bytes.shrink_to_fit();
    }
    r->tmpl = tmpl;
    const at::Tensor& mask = r->req.params.mask;
    if (!mask.defined() || mask.dim() != 2) return fail("mask must be a 2-D [height, width] array");
    if (mask.size(0) != tmpl->height || mask.size(1) != tmpl->width) {
      return fail("mask is " + std::to_string(mask.size(1)) + "x" + std::to_string(mask.size(0)) + ", template is " +
                  std::to_string(tmpl->width) + "x" + std::to_string(tmpl->height));
    }
    const bool any_masked = (mask > 0).any().item<bool>();
    if (r->req.params.cache == CacheMode::kUse && any_masked) {
      std::shared_ptr<const ActivationEntry> prompt_entry;
      if (const auto prompt_key = r->model().prompt_cache_key(*tmpl, r->req.params)) {
        auto found = store_->get(*prompt_key);
        if (found.ok()) {
          prompt_entry = *found;
        } else if (r->req.cls == RequestClass::kLive) {
          Message want = Message::of(Message::kWantPromptPrepare, nullptr, tmpl, prompt_key->canonical());
          want.served = r->served;
          want.params = r->req.params;
          post(std::move(want));
        }
      }
      const ActivationKey key = r->model().cache_key(*tmpl, r->req.params);
      if (!prompt_entry && options_.stream_from_disk && store_->tier_of(key) == Tier::kDisk &&
          create_streamed_session(r, key))
        return;
      auto entry = store_->get(key);
      if (entry.ok() || prompt_entry) {
        create_session(r, entry.ok() ? *entry : nullptr, std::move(prompt_entry));
      } else {
        // The loop starts (or joins) the template's prepare job.
        post(Message::of(Message::kNeedsPrepare, r, tmpl, key.canonical()));
      }
      return;
    }
    create_session(r, nullptr);
  } catch (...) {
    fail("pre-processing threw: " + exception_text(std::current_exception()));
  }
}

bool Worker::create_streamed_session(const std::shared_ptr<Record>& r, const ActivationKey& key) {
  const EditModel& model = r->model();
  const int blocks = model.streamable_blocks();
  const std::optional<ActivationLayout> layout = store_->layout_of(key);
  if (blocks <= 0 || !layout || layout->blocks != blocks) return false;
  const double measured = read_bytes_per_ms_.load();
  const int recompute = planned_recompute(*r, *layout, measured > 0 ? measured : options_.assumed_read_bytes_per_ms);
  // On a GPU the slabs are pinned: each block crosses the bus by DMA once read.
  auto streamed = std::make_shared<StreamedKvSource>(store_, key, *layout, model.device().torch_device());
  auto session = model.create_streamed_session(r->tmpl, r->req.params, streamed, recompute);
  if (!session.ok() && session.status().code() == ErrorCode::kUnimplemented) return false;
  r->streamed = std::move(streamed);
  r->streamed_key = key;
  r->blocks = blocks;
  r->recompute_blocks = recompute;
  r->slab_bytes = static_cast<double>(layout->block_bytes());
  adopt_session(r, std::move(session));
  return true;
}

int Worker::planned_recompute(const Record& r, const ActivationLayout& layout, double bytes_per_ms) const {
  const EditModel& model = r.model();
  const int blocks = layout.blocks;
  // The plan's inputs, per block of one step: compute from the model's cost model on this
  // device (the step's marginal cost spread over its blocks), loads from the bus or disk speed.
  const int64_t total = layout.tokens;
  const int64_t masked = std::clamp<int64_t>(r.tokens, 1, total);
  const std::vector<double> load(blocks, static_cast<double>(layout.block_bytes()) / bytes_per_ms);
  const std::vector<double> masked_ms(blocks, request_work_ms(*r.cost(), masked, total, 1) / blocks);
  const std::vector<double> full_ms(blocks, request_work_ms(*r.cost(), total, total, 1) / blocks);
  const LoadPlan plan = plan_loads(load, masked_ms, full_ms, LoadPlanShape::kRecomputePrefix);
  int recompute = 0;
  for (BlockLoadChoice choice : plan.choices) recompute += choice == BlockLoadChoice::kRecompute;
  if (options_.force_recompute_blocks) recompute = std::clamp(options_.force_recompute_blocks(blocks), 0, blocks);
  return std::min(recompute, model.max_recompute_blocks());
}

void Worker::create_session(const std::shared_ptr<Record>& r, std::shared_ptr<const ActivationEntry> entry,
                            std::shared_ptr<const ActivationEntry> prompt_entry) {
  try {
    // On a GPU a host-resident entry may cross the bus at every step: the plan weighs each
    // block's copy against its recompute (the model applies it only if its device tier cannot
    // hold the entry).
    const EditModel& model = r->model();
    int recompute_if_copied = 0;
    if (const double bus = model.host_to_device_bytes_per_ms();
        bus > 0 && entry && entry->layout().blocks == model.streamable_blocks()) {
      recompute_if_copied = planned_recompute(*r, entry->layout(), bus);
      r->blocks = entry->layout().blocks;
    }
    adopt_session(r, model.create_session_planned(r->tmpl, r->req.params, std::move(entry), std::move(prompt_entry),
                                                  recompute_if_copied));
  } catch (...) {
    complete(r, RequestState::kFailed,
             invalid_argument("request " + std::to_string(r->req.id) +
                              ": session set-up threw: " + exception_text(std::current_exception())));
  }
}

void Worker::adopt_session(const std::shared_ptr<Record>& r, Result<std::unique_ptr<StepSession>> session) {
  try {
    if (!session.ok()) {
      complete(r, RequestState::kFailed, session.status());
      return;
    }
    r->session = std::move(*session);
    r->steps_total = r->session->steps();
    r->steps_requested = r->session->done() ? 0 : r->steps_total - r->session->first_step();
    r->steps_left = r->steps_requested;
    r->min_steps_total = min_steps_allowed(r->req.cls, r->steps_requested);
    r->tokens = r->session->tokens().count();
    r->total_tokens = int64_t{r->session->tokens().grid_w} * r->session->tokens().grid_h;
    const int segments = r->session->guided() ? 2 : 1;
    r->step_work_ms = request_work_ms(*r->cost(), r->tokens * segments, r->total_tokens, 1);
    // Replace the submit-time estimate by the exact one.
    const double exact = r->step_work_ms * r->steps_requested;
    const double before = r->remaining_work_ms.exchange(exact);
    work_ms_.fetch_add(exact - before);
    r->ready_ms = now_ms();
    post(Message::of(Message::kReady, r));
  } catch (...) {
    complete(r, RequestState::kFailed,
             invalid_argument("request " + std::to_string(r->req.id) +
                              ": session set-up threw: " + exception_text(std::current_exception())));
  }
}

// ---- post-processing (pool) ----

void Worker::finish(const std::shared_ptr<Record>& r) {
  const uint64_t id = r->req.id;
  r->post_start_ms = now_ms();
  try {
    if (options_.before_finish) {
      Status s = options_.before_finish(id);
      if (!s.ok()) {
        complete(r, RequestState::kFailed, std::move(s));
        return;
      }
    }
    auto out = r->session->finish();
    if (!out.ok()) {
      complete(r, RequestState::kFailed, out.status());
      return;
    }
    std::vector<std::byte> file;
    const ImageFileFormat format = r->req.result_format.value_or(native_file_format(out->image));
    if (r->req.encode_result) {
      auto encoded = encode_image(out->image, format);
      if (!encoded.ok()) {
        complete(r, RequestState::kFailed, encoded.status());
        return;
      }
      file = std::move(*encoded);
    }
    complete(r, RequestState::kDone, {}, std::move(*out), std::move(file), format);
    if (r->streamed) {
      // What this stream's reads took steers the next plans (a running mean over edits).
      const double ms = r->streamed->mean_slab_read_ms();
      if (ms > 0) {
        const double speed = r->slab_bytes / ms, before = read_bytes_per_ms_.load();
        read_bytes_per_ms_.store(before > 0 ? 0.7 * before + 0.3 * speed : speed);
      }
      r->streamed.reset();
      // Later edits of the template (live painting) read RAM: promote the entry now, after
      // this edit's result went out, where it fits the RAM tier at all.
      const std::optional<ActivationLayout> layout = store_->layout_of(*r->streamed_key);
      if (layout && layout->total_elements() * sizeof(uint16_t) <= store_->options().ram_budget_bytes)
        (void)store_->get(*r->streamed_key);
    }
  } catch (...) {
    complete(r, RequestState::kFailed,
             Status(ErrorCode::kInternal, "request " + std::to_string(id) +
                                              ": post-processing threw: " + exception_text(std::current_exception())));
  }
}

// ---- step loop ----

void Worker::loop() {
  at::set_num_threads(std::max(1, options_.compute_threads));
  c10::InferenceMode guard;
  for (;;) {
    std::vector<Message> messages;
    {
      std::unique_lock lock(inbox_mu_);
      const auto woken = [&] { return stop_ || !inbox_.empty() || runnable_; };
      // Work waiting only for adapters being read on the pool: looked at again every few ms
      // (a read takes far longer), not spun on. Work the device team holds back: looked at
      // again when its hold ends (or a message, such as the team's share, comes first).
      if (waiting_for_adapters_) {
        inbox_cv_.wait_for(lock, std::chrono::milliseconds(5), woken);
      } else if (std::isfinite(held_until_ms_)) {
        inbox_cv_.wait_for(lock, std::chrono::duration<double, std::milli>(std::max(0.0, held_until_ms_ - now_ms())), woken);
      } else {
        inbox_cv_.wait(lock, woken);
      }
      if (stop_) break;
      messages.swap(inbox_);
    }
    for (Message& m : messages) handle(m);
    if (!in_service_.load()) fail_all_out_of_service();
    retire_inactive();
    size_t ready = 0, waiting = 0;
    const double now = now_ms();
    held_until_ms_ = std::numeric_limits<double>::infinity();
    const auto held = [&](double until) {
      if (until <= now) return false;
      held_until_ms_ = std::min(held_until_ms_, until);
      return true;
    };
    for (const auto& r : active_) {
      if (r->finishing || held(r->team_hold_until_ms)) continue;
      ++(r->session->waiting_for_adapters() ? waiting : ready);
    }
    bool have_prepares = false;
    for (const auto& [key, job] : prepares_) {
      if (held(job->team_hold_until_ms)) continue;
      const bool waits = job->run->waiting_for_adapters();
      waiting += waits;
      have_prepares = have_prepares || !waits;
    }
    steps_held_ = ready > 0 && options_.may_step && !options_.may_step(ready);
    const bool have_steps = ready > 0 && !steps_held_;
    runnable_ = have_steps || have_prepares;
    waiting_for_adapters_ = waiting > 0;
    if (have_prepares && (prepare_turn_ || !have_steps)) {
      run_prepare_slice();
      prepare_turn_ = false;
    } else if (have_steps) {
      run_step();
      prepare_turn_ = true;
    }
    std::erase_if(active_, [](const auto& r) { return r->finishing; });
    publish_load();
  }
}

void Worker::handle(Message& m) {
  auto& r = m.record;
  switch (m.kind) {
    case Message::kReady:
      r->ready_seq = ++ready_seq_;
      r->last_advance_ms = now_ms();
      active_.push_back(r);
      break;
    case Message::kNeedsPrepare: {
      auto recent = recent_.find(m.canonical);
      if (recent != recent_.end()) {
        pool_.post([this, r, entry = recent->second] { create_session(r, entry); });
        break;
      }
      auto job = prepares_.find(m.canonical);
      if (job != prepares_.end()) {
        r->shared_prepare = true;
        job->second->waiting.push_back(r);
        job->second->deadline_abs_ms = std::min(job->second->deadline_abs_ms, r->deadline_abs_ms);
        break;
      }
      if (store_->contains(r->model().cache_key(*m.tmpl, r->req.params))) {
        // Stored after the pool looked: look again there (get() may read disk).
        pool_.post([this, r] {
          auto entry = store_->get(r->model().cache_key(*r->tmpl, r->req.params));
          if (entry.ok()) {
            create_session(r, *entry);
          } else {
            complete(r, RequestState::kFailed, entry.status());
          }
        });
        break;
      }
      start_prepare(r, m.tmpl);
      break;
    }
    case Message::kCancel:
      break;  // the flag is set; retire_inactive() acts on it at this boundary
    case Message::kTask: {
      m.task();
      {
        // Counted before the task is released: its leader goes on then (device_team.h), and
        // whoever reads the metrics after the leader's request ends must see this share.
        std::lock_guard lock(metrics_mu_);
        metrics_.team_shares += 1;
      }
      m.task = nullptr;
      break;
    }
    case Message::kStored:
      recent_.erase(m.canonical);
      break;
    case Message::kEndTeamHolds:
      // The ranks a held step waits for are free: it asks the team again now.
      for (const auto& r : active_) r->team_hold_until_ms = 0;
      for (const auto& [key, job] : prepares_) job->team_hold_until_ms = 0;
      break;
    case Message::kWantPromptPrepare: {
      if (prepares_.count(m.canonical) || recent_.count(m.canonical) || background_pending_.count(m.canonical)) break;
      background_pending_.insert(m.canonical);
      // Set up on the pool: it encodes the prompt (a cache hit after the edit's own session).
      pool_.post([this, served = m.served, tmpl = m.tmpl, params = m.params, canonical = m.canonical] {
        std::shared_ptr<StepPrepare> run;
        try {
          auto made = served->model->create_prompt_prepare(tmpl, params);
          if (made.ok()) run = std::move(*made);
        } catch (...) {
          // A background prepare that cannot be set up only costs later strokes their speed-up.
        }
        Message made = Message::of(Message::kBackgroundPrepare, nullptr, nullptr, canonical);
        made.served = served;
        made.prepare = std::move(run);
        post(std::move(made));
      });
      break;
    }
    case Message::kBackgroundPrepare: {
      background_pending_.erase(m.canonical);
      if (!m.prepare || prepares_.count(m.canonical)) break;
      auto job = std::make_unique<PrepareJob>();
      job->serial = ++prepare_serial_;
      const double tokens = double(m.prepare->tokens());
      job->served = m.served;
      job->step_work_ms = cost_of(m.served).current()->predict_ms(tokens, 1.0, m.prepare->attention_pairs());
      job->deadline_abs_ms = std::numeric_limits<double>::infinity();  // after every awaited prepare
      job->background = true;
      job->run = std::move(m.prepare);
      prepares_.emplace(m.canonical, std::move(job));
      break;
    }
  }
}

void Worker::start_prepare(const std::shared_ptr<Record>& r, std::shared_ptr<const TemplateImage> tmpl) {
  auto run = r->model().create_prepare(std::move(tmpl), r->req.params);
  if (!run.ok()) {
    complete(r, RequestState::kFailed, run.status());
    return;
  }
  auto job = std::make_unique<PrepareJob>();
  job->serial = ++prepare_serial_;
  job->run = std::move(*run);
  const StepPrepare& prepare = *job->run;
  const double tokens = double(prepare.tokens());
  job->deadline_abs_ms = r->deadline_abs_ms;
  job->served = r->served;
  job->step_work_ms = r->cost()->predict_ms(tokens, 1.0, prepare.attention_pairs());
  job->waiting.push_back(r);
  // The prepare's compute is part of this worker's backlog until it finishes.
  r->remaining_work_ms.fetch_add(job->step_work_ms * prepare.steps());
  work_ms_.fetch_add(job->step_work_ms * prepare.steps());
  const std::string canonical = prepare.key().canonical();
  prepares_.emplace(canonical, std::move(job));
}

TeamAsk Worker::team_ask(const ServedModel* served, uint64_t id, int64_t tokens, int steps_left, double deadline_abs_ms,
                         double single_ms) const {
  TeamAsk ask;
  ask.id = id;
  ask.tokens = tokens;
  ask.steps_left = steps_left;
  // The team's clock is another epoch's: the deadline travels as what is left of it.
  ask.deadline_ms = std::isfinite(deadline_abs_ms) ? DeviceTeam::clock_ms() + (deadline_abs_ms - now_ms()) : deadline_abs_ms;
  ask.single_ms = single_ms;
  ask.fixed_ms = std::max(0.0, cost_of(served).current()->coefficients()[0]);
  const EditModel::ParallelShape shape = served->model->parallel_shape();
  ask.hidden = shape.hidden;
  ask.attention_layers = shape.attention_layers;
  ask.prediction_channels = shape.prediction_channels;
  return ask;
}

at::Tensor Worker::forward_in_team(const ServedModel* served, std::span<const std::shared_ptr<Record>> records,
                                   std::span<StepSession* const> sessions, bool& held) {
  held = false;
  DeviceTeam* team = options_.team.get();
  if (team == nullptr || sessions.size() != 1 || records.size() != 1) return {};
  // A guided step's halves on two devices, one each, or a whole-sequence step (or a large
  // mask's) in sequence parallel, as the team's planner decides from the request's deadline
  // and predicted step.
  // Either runs alone: packed with other requests' rows it would wait on the slowest.
  StepSession& session = *sessions[0];
  Record& r = *records[0];
  // A masked step of a small mask stays here: splitting its few rows buys less than the
  // collectives cost, and the devices it would take serve masked edits of their own.
  const bool small_mask = session.reads_cached_kv() &&
                          double(r.tokens) < options_.team_masked_share * double(std::max<int64_t>(1, r.total_tokens));
  const int heads = small_mask ? 0 : session.parallel_heads();
  const bool may_split = session.splits_halves();
  if (heads <= 0 && !may_split) return {};
  const int64_t rows = r.tokens * (session.guided() ? 2 : 1);
  const double single_ms = cost_of(served).current()->predict_ms(double(rows), 1.0, double(rows) * double(r.total_tokens));
  TeamAsk ask = team_ask(served, r.req.id, r.tokens, std::max(1, r.steps_left), r.deadline_abs_ms, single_ms);
  ask.heads = heads;
  ask.guided = session.guided();
  ask.may_split = may_split;
  double hold_ms = 0;
  const std::unique_ptr<DeviceTeam::Lease> lease = team->lease(options_.team_rank, ask, &hold_ms);
  if (hold_ms > 0) {
    // Its rank serves another's step this round: it waits (the planner found it still on time
    // alone from the next round) and asks again when the hold ends.
    r.team_hold_until_ms = now_ms() + hold_ms;
    held = true;
    std::lock_guard lock(metrics_mu_);
    metrics_.team_holds += 1;
    return {};
  }
  if (r.steps_left <= 1) team->withdraw(options_.team_rank);  // its last step: it asks no more
  if (!lease) return {};
  const bool halves = lease->split();
  const bool halves_parallel = halves && lease->degree() > 1;  // each half over its own ranks
  const size_t slot = static_cast<size_t>(served - models_.data());
  const StepSession::ParallelForward share =
      halves_parallel ? nullptr : halves ? session.halves_step() : session.parallel_step();
  const StepSession::HalvesForward both = halves_parallel ? session.halves_parallel_step() : nullptr;
  at::Tensor mine;
  const Status ran = team->run(*lease, [&](SequenceGroup& member, int rank) {
    const std::shared_ptr<const EditModel> here = team->model(rank, slot);
    TORCH_CHECK(here != nullptr, "rank ", rank, " of the device team serves no model ", slot);
    at::Tensor out;
    if (halves_parallel) {
      SequenceGroup* half = lease->half_member(rank);
      TORCH_CHECK(half != nullptr, "rank ", rank, " of the device team is in neither half of the step");
      out = both(member, *half, *here);
    } else {
      out = share(member, *here);
    }
    if (rank == options_.team_rank) mine = std::move(out);
  });
  if (!ran.ok()) throw std::runtime_error(ran.message());
  std::lock_guard lock(metrics_mu_);
  metrics_.steps_parallel += 1;
  metrics_.steps_halves_split += halves ? 1 : 0;
  return mine;
}

Worker::TeamStep Worker::run_prepare_step_in_team(PrepareJob& job) {
  DeviceTeam* team = options_.team.get();
  const int heads = team != nullptr && job.served != nullptr ? job.run->parallel_heads() : 0;
  if (heads <= 0) return TeamStep::kAlone;
  // A prepare job's id: apart from every request's (the top bit) and every other rank's.
  const uint64_t id = (uint64_t{1} << 63) | (uint64_t(options_.team_rank) << 48) | job.serial;
  TeamAsk ask = team_ask(job.served, id, job.run->tokens(), std::max(1, job.run->steps() - job.steps_run),
                         job.deadline_abs_ms, job.step_work_ms);
  ask.heads = heads;
  double hold_ms = 0;
  const std::unique_ptr<DeviceTeam::Lease> lease = team->lease(options_.team_rank, ask, &hold_ms);
  if (hold_ms > 0) {
    job.team_hold_until_ms = now_ms() + hold_ms;
    std::lock_guard lock(metrics_mu_);
    metrics_.team_holds += 1;
    return TeamStep::kHeld;
  }
  if (!lease) return TeamStep::kAlone;
  const size_t slot = static_cast<size_t>(job.served - models_.data());
  const StepPrepare::ParallelShare share = job.run->parallel_step();
  const Status ran = team->run(*lease, [&](SequenceGroup& member, int rank) {
    const std::shared_ptr<const EditModel> here = team->model(rank, slot);
    TORCH_CHECK(here != nullptr, "rank ", rank, " of the device team serves no model ", slot);
    share(member, *here);
  });
  if (!ran.ok()) throw std::runtime_error(ran.message());
  job.run->parallel_step_done();
  return TeamStep::kParallel;
}

void Worker::run_prepare_slice() {
  // Earliest deadline first among jobs that can run (retire_inactive dropped those nobody
  // waits for).
  auto best = prepares_.end();
  const double now = now_ms();
  for (auto it = prepares_.begin(); it != prepares_.end(); ++it) {
    if (it->second->run->waiting_for_adapters() || it->second->team_hold_until_ms > now) continue;
    if (best == prepares_.end() || it->second->deadline_abs_ms < best->second->deadline_abs_ms) best = it;
  }
  if (best == prepares_.end()) return;
  PrepareJob& job = *best->second;
  const auto t0 = std::chrono::steady_clock::now();
  bool failed = false, parallel = false;
  std::string error;
  try {
    const TeamStep how = run_prepare_step_in_team(job);
    if (how == TeamStep::kHeld) return;  // its rank serves another's step this round
    parallel = how == TeamStep::kParallel;
    if (!parallel) job.run->run_step();
  } catch (...) {
    failed = true;
    error = exception_text(std::current_exception());
  }
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  job.steps_run += 1;
  // Its last step (or a failed one): the team's planner forgets it.
  if ((failed || job.run->done()) && options_.team) options_.team->withdraw(options_.team_rank);
  {
    std::lock_guard lock(metrics_mu_);
    metrics_.prepare_steps += 1;
    metrics_.prepare_steps_parallel += parallel ? 1 : 0;
    metrics_.prepare_ms_total += ms;
  }
  // The cost model is of this device's steps alone.
  if (!failed && !parallel && job.served != nullptr) {
    // A prepare slice is a full forward of one request: the far end of the cost model's range.
    cost_of(job.served).add({double(job.run->tokens()), 1.0, job.run->attention_pairs(), ms});
  }
  for (auto& r : job.waiting) take_work(*r, job.step_work_ms / double(job.waiting.size()));
  const std::string canonical = best->first;
  if (failed && classify_device_fault(error) == DeviceFault::kLost) {
    // As in run_step: the job's requests fail, the rest of what the worker holds goes elsewhere.
    error += "; worker " + std::to_string(options_.index) + " is out of service";
    take_out_of_service(device_ + " failed: " + error);
  }
  if (failed) {
    for (auto& r : job.waiting) {
      complete(r, RequestState::kFailed,
               Status(ErrorCode::kInternal,
                      "prepare of template " + job.run->template_id() + " failed: " + error));
    }
    prepares_.erase(best);
    return;
  }
  if (!job.run->done()) return;
  std::shared_ptr<const ActivationEntry> entry = job.run->entry();
  recent_[canonical] = entry;
  // put() may spill to disk: never on the loop.
  pool_.post([this, key = job.run->key(), entry, canonical] {
    (void)store_->put(key, entry);  // a full store only costs a later re-prepare
    post(Message::of(Message::kStored, nullptr, nullptr, canonical));
  });
  for (auto& r : job.waiting) {
    pool_.post([this, r, entry] { create_session(r, entry); });
  }
  prepares_.erase(best);
}

bool Worker::retire(const std::shared_ptr<Record>& r, double now) {
  if (r->ended) return true;
  if (const auto& load = r->req.params.adapter_load) {
    if (Status failed = load->failure(); !failed.ok()) {
      complete(r, RequestState::kFailed, std::move(failed));
      return true;
    }
  }
  if (r->cancel_requested) {
    std::unique_lock lock(r->mu);
    Status why = r->cancel_reason;
    lock.unlock();
    complete(r, RequestState::kCancelled, std::move(why));
    return true;
  }
  if (r->req.expire_at_deadline && now > r->deadline_abs_ms) {
    complete(r, RequestState::kExpired,
             out_of_range("request " + std::to_string(r->req.id) + " missed its deadline of " +
                          std::to_string(r->deadline_rel_ms) + " ms"));
    return true;
  }
  return false;
}

void Worker::retire_inactive() {
  const double now = now_ms();
  for (auto& [key, job] : prepares_) {
    std::erase_if(job->waiting, [&](const std::shared_ptr<Record>& r) { return retire(r, now); });
  }
  std::erase_if(prepares_, [](const auto& kv) { return kv.second->waiting.empty() && !kv.second->background; });
  std::erase_if(active_, [&](const std::shared_ptr<Record>& r) {
    if (retire(r, now)) return true;
    if (!r->finishing && r->session->done()) {
      // Nothing to denoise (empty mask, or steps complete): straight to post-processing.
      {
        std::lock_guard lock(r->mu);
        if (r->life.state() == RequestState::kPreparing) (void)r->life.transition(RequestState::kRunning, now);
      }
      r->finishing = true;
      r->finish_ms = now;
      pool_.post([this, r] { finish(r); });
      return true;
    }
    return false;
  });
}

void Worker::run_step() {
  const auto t0 = std::chrono::steady_clock::now();
  const double now = now_ms();
  std::vector<SchedCandidate> candidates;
  std::unordered_map<uint64_t, std::shared_ptr<Record>> by_id;
  // Per model among the candidates: packed tokens and the grid sizes, for the round's cost.
  struct ModelShare {
    double tokens = 0, total_sum = 0, requests = 0;
  };
  std::map<const ServedModel*, ModelShare> shares;
  double candidate_tokens = 0;
  for (const auto& r : active_) {
    if (r->finishing || r->session->waiting_for_adapters() || r->team_hold_until_ms > now) continue;
    SchedCandidate c;
    c.id = r->req.id;
    c.tokens = r->tokens * (r->session->guided() ? 2 : 1);
    c.steps_left = r->steps_left;
    c.min_steps_left = min_steps_left(r->min_steps_total, r->steps_run, r->steps_left);
    // The deadline is for the result: the steps must end a post-processing time earlier.
    c.deadline_ms = r->deadline_abs_ms - post_estimate_ms_.load();
    c.cls = r->req.cls;
    c.waiting_ms = now - r->last_advance_ms;
    candidates.push_back(c);
    by_id[c.id] = r;
    ModelShare& share = shares[r->served];
    share.tokens += double(c.tokens);
    share.total_sum += double(r->total_tokens);
    share.requests += 1;
    candidate_tokens += double(c.tokens);
  }
  if (candidates.empty()) return;
  // A round's predicted time: each model present runs its own forward on the shared device,
  // charged on its own cost model for its share of the round's tokens and requests.
  const auto step_ms = [&](int64_t tokens, int batch) {
    double ms = 0;
    for (const auto& [served, share] : shares) {
      const double f = candidate_tokens > 0 ? share.tokens / candidate_tokens : share.requests / double(candidates.size());
      const double t = double(tokens) * f;
      ms += cost_of(served).current()->predict_ms(t, std::max(1.0, double(batch) * f), t * share.total_sum / share.requests);
    }
    return ms;
  };
  const SchedDecision decision = selector_.select(candidates, now, step_ms);
  const auto t1 = std::chrono::steady_clock::now();
  if (decision.advance.empty()) return;

  for (const auto& [id, left] : decision.reduce_steps) {
    Record& r = *by_id.at(id);
    if (left <= 0 || left >= r.steps_left) continue;
    take_work(r, r.step_work_ms * (r.steps_left - left));  // the dropped steps' work
    r.steps_left = left;
  }

  // The batch by model, each model's requests and sessions in the scheduler's order.
  struct ModelBatch {
    const ServedModel* served;
    std::vector<std::shared_ptr<Record>> records;
    std::vector<StepSession*> sessions;
    std::vector<uint64_t> ids;
  };
  std::vector<ModelBatch> groups;
  int64_t step_tokens = 0;
  double step_attention = 0;
  size_t batch_size = 0;
  for (uint64_t id : decision.advance) {
    auto& r = by_id.at(id);
    auto g = std::find_if(groups.begin(), groups.end(), [&](const ModelBatch& x) { return x.served == r->served; });
    if (g == groups.end()) g = groups.insert(groups.end(), ModelBatch{r->served, {}, {}, {}});
    g->records.push_back(r);
    g->sessions.push_back(r->session.get());
    g->ids.push_back(id);
    const int64_t tokens = r->tokens * (r->session->guided() ? 2 : 1);
    step_tokens += tokens;
    step_attention += double(tokens) * double(r->total_tokens);
    ++batch_size;
  }
  const auto t2 = std::chrono::steady_clock::now();
  bool any_failed = false;
  std::vector<std::string> models_run;
  for (ModelBatch& g : groups) {
    bool failed = false;
    std::string error;
    at::Tensor rows;
    bool held = false;
    try {
      if (options_.before_step) options_.before_step(g.ids);
      rows = forward_in_team(g.served, g.records, g.sessions, held);
      if (!rows.defined() && !held) rows = g.served->model->forward(g.sessions);
    } catch (...) {
      failed = true;
      error = exception_text(std::current_exception());
    }
    if (held) {
      // Not stepped: the device team holds it back (forward_in_team); it stays as it was.
      for (const auto& r : g.records) {
        const int64_t tokens = r->tokens * (r->session->guided() ? 2 : 1);
        step_tokens -= tokens;
        step_attention -= double(tokens) * double(r->total_tokens);
        --batch_size;
      }
      continue;
    }
    if (failed && !any_failed) {
      // Counted before apply_rows fails the requests: whoever is told of the failure (a
      // drained runtime, a client) finds the step counted.
      std::lock_guard lock(metrics_mu_);
      metrics_.failed_steps += 1;
    }
    any_failed = any_failed || failed;
    if (!failed) models_run.push_back(g.served->model->info().id);
    const bool lost = failed && classify_device_fault(error) == DeviceFault::kLost;
    if (lost) {
      error += "; worker " + std::to_string(options_.index) + " is out of service";
      // Out of service before any of its requests is reported failed: a client told of the
      // failure finds /health already saying so.
      take_out_of_service(device_ + " failed: " + error);
    }
    apply_rows(g.records, failed, error, rows);
    if (lost) break;  // nothing more runs on this device
  }
  const auto t4 = std::chrono::steady_clock::now();
  auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  // The cost model is per (model, device): only a round of one model is a sample of one.
  const bool one_model = groups.size() == 1 && models_run.size() == 1;
  const StepSample sample{double(step_tokens), double(batch_size), step_attention, ms(t0, t4)};
  if (one_model) cost_of(groups.front().served).add(sample);  // may refit: outside the metrics lock
  std::lock_guard lock(metrics_mu_);
  WorkerMetrics& m = metrics_;
  if (models_run.empty()) return;
  m.steps += 1;
  for (const std::string& id : models_run) m.steps_by_model[id] += 1;
  m.requests_advanced += batch_size;
  m.max_batch = std::max<int>(m.max_batch, static_cast<int>(batch_size));
  m.sched_ms_total += ms(t0, t1);
  m.pack_ms_total += ms(t1, t2);
  m.step_ms_total += ms(t2, t4);
  // Trimmed in chunks: erasing the oldest sample every step would move 4096 of them each time.
  if (m.recent_steps.size() >= WorkerMetrics::kRecent + WorkerMetrics::kRecent / 4) {
    m.recent_steps.erase(m.recent_steps.begin(), m.recent_steps.end() - WorkerMetrics::kRecent);
  }
  if (one_model) m.recent_steps.push_back(sample);
  m.count_step_seconds(ms(t0, t4) / 1000.0);
}

void Worker::apply_rows(std::vector<std::shared_ptr<Record>>& batch, bool failed, const std::string& error,
                        const at::Tensor& rows) {
  const double step_start_ms = now_ms();
  int64_t offset = 0;
  for (auto& r : batch) {
    if (failed) {
      complete(r, RequestState::kFailed,
               Status(ErrorCode::kInternal, "step of request " + std::to_string(r->req.id) + " failed on " +
                                                device_ + ": " + error));
      continue;
    }
    const int64_t n = r->session->prediction_rows();
    Status applied;
    try {
      // Spread the sampler levels left over the steps left (one level each, unless the
      // scheduler cut the step count; the last step always lands on the final level).
      const int levels_left = r->steps_total - r->session->step();
      const int jump = (levels_left + r->steps_left - 1) / std::max(1, r->steps_left);
      applied = r->session->apply(rows.narrow(0, offset, n), r->session->step() + std::max(1, jump));
    } catch (...) {
      applied = Status(ErrorCode::kInternal, "sampler update of request " + std::to_string(r->req.id) +
                                                 " threw: " + exception_text(std::current_exception()));
    }
    offset += n;
    if (!applied.ok()) {
      complete(r, RequestState::kFailed, std::move(applied));
      continue;
    }
    {
      std::lock_guard lock(r->mu);
      if (r->life.state() == RequestState::kPreparing) (void)r->life.transition(RequestState::kRunning, step_start_ms);
    }
    if (r->first_step_ms < 0) r->first_step_ms = step_start_ms;
    r->last_step_ms = now_ms();
    r->last_advance_ms = r->last_step_ms;
    ++r->steps_run;
    r->steps_left = std::max(0, r->steps_left - 1);
    take_work(*r, r->step_work_ms);
    if (r->req.on_progress) {
      RequestProgress p{r->req.id, r->steps_run, r->steps_requested};
      notify(r, [cb = r->req.on_progress, p] { cb(p); });
    }
    const int every = r->req.preview_every_steps;
    // A live edit's painter waits for the first sight of the region: with previews asked for
    // at all, one follows the first step whatever the interval.
    const bool first_live = r->req.cls == RequestClass::kLive && r->steps_run == 1;
    if (every > 0 && r->req.on_preview && (r->steps_run % every == 0 || first_live) && !r->session->done()) {
      at::Tensor latent = r->session->predicted_latent();
      notify(r, [r, latent, done = r->steps_run] {
        // A superseded or cancelled edit's queued previews would only delay newer work.
        if (r->cancel_requested.load() || r->ended.load()) return;
        try {
          const PixelRect box = bounding_box(r->req.params.mask, 0, r->model().codec_factor());
          const at::Tensor rgb = r->model().decode_preview(latent, box);
          if (!rgb.defined()) return;
          r->req.on_preview(r->req.id, done, rgb);
        } catch (...) {
          // A failed preview does not fail the edit; the final result still comes.
        }
      });
    }
  }
}

void Worker::take_out_of_service(const std::string& fault) {
  {
    std::lock_guard lock(fault_mu_);
    fault_ = fault;
  }
  in_service_.store(false);  // the loop fails what it still holds at its next boundary
}

bool Worker::hand_back(const std::shared_ptr<Record>& r) {
  if (!options_.reroute || r->cancel_requested) return false;
  {
    std::lock_guard lock(r->mu);
    // Ends here (first caller wins, as in complete()); the request goes on at another worker,
    // which reports it.
    if (!r->life.transition(RequestState::kCancelled, now_ms()).ok()) return false;
    r->ended = true;
  }
  work_ms_.fetch_sub(r->remaining_work_ms.exchange(0.0));
  // A copy: a preview callback on the pool may still read the record's request.
  ServingRequest request = r->req;
  if (!request.tmpl) request.tmpl = r->tmpl;  // decoded here from template_bytes, now cleared
  r->session.reset();
  r->tmpl.reset();
  requests_.fetch_sub(1);
  {
    std::lock_guard lock(records_mu_);
    records_.erase(request.id);
    if (records_.empty()) idle_cv_.notify_all();
  }
  {
    std::lock_guard lock(metrics_mu_);
    metrics_.rerouted += 1;
  }
  options_.reroute(std::move(request), r->submitted_ms);
  return true;
}

void Worker::fail_all_out_of_service() {
  std::string fault;
  {
    std::lock_guard lock(fault_mu_);
    fault = fault_;
  }
  auto fail = [&](const std::shared_ptr<Record>& r) {
    if (hand_back(r)) return;
    complete(r, RequestState::kFailed,
             Status(ErrorCode::kUnavailable, "request " + std::to_string(r->req.id) + " not run: worker " +
                                                 std::to_string(options_.index) + " is out of service (" + fault +
                                                 "); restart the engine to use the device again"));
  };
  for (auto& r : active_)
    if (!r->finishing) fail(r);
  std::erase_if(active_, [](const auto& r) { return !r->finishing; });
  for (auto& [key, job] : prepares_)
    for (auto& r : job->waiting) fail(r);
  prepares_.clear();
}

void Worker::publish_load() {
  int max_left = 0;
  for (const auto& r : active_) {
    if (!r->finishing && r->session) max_left = std::max(max_left, r->steps_left);
  }
  max_steps_left_.store(max_left);
  holds_prepares_.store(!prepares_.empty());
}

bool Worker::idle() const { return requests_.load() == 0 && !holds_prepares_.load(); }

}  // namespace infill
