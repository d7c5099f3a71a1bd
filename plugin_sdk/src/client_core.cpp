#include "client_core.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>
#include <exception>

#include "codec.h"

namespace infill::sdk {
namespace {

namespace asio = boost::asio;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

uint32_t u32(const json& j, const char* key) {
  if (!j.contains(key) || !j[key].is_number()) return 0;
  const double v = j[key].get<double>();
  return v <= 0 ? 0u : static_cast<uint32_t>(v);
}

double number(const json& j, const char* key) {
  return j.contains(key) && j[key].is_number() ? j[key].get<double>() : 0.0;
}

}  // namespace

ClientCore::ClientCore(CoreOptions options)
    : options_(std::move(options)),
      http_(std::make_shared<const HttpConfig>([this] {
        HttpConfig h = options_.http;
        if (!h.pool) h.pool = make_connection_pool();  // calls of this client reuse connections
        return h;
      }())),
      wake_(ioc_),
      work_(asio::make_work_guard(ioc_)) {
  thread_ = std::thread([this] {
    // No exception crosses the thread: the loop catches its own; this is the last resort.
    for (;;) {
      try {
        ioc_.run();
        break;
      } catch (const std::exception&) {
        if (stopping_) break;
      }
    }
    if (self_destruct_) {
      close_remaining();
      delete this;
    }
  });
  io_thread_id_ = thread_.get_id();
  // Spawned once the thread id is known: callbacks compare against it.
  asio::co_spawn(ioc_, main_loop(), asio::detached);
}

ClientCore::~ClientCore() = default;

bool ClientCore::wanted() const {
  std::lock_guard lock(mu_);
  return want_ || !jobs_.empty() || submits_in_flight_.load() > 0;
}

Status ClientCore::ensure_stream() {
  std::unique_lock lock(mu_);
  if (connected_) return Status();
  if (on_io_thread())
    return make_error(INFILL_ERROR_CONNECTION, "the event stream from " + http_->endpoint.text +
                                                   " is down; a callback cannot wait for it to reconnect");
  const uint64_t start = attempts_;
  want_ = true;
  asio::post(ioc_, [this] { wake_.cancel(); });
  const auto deadline = Clock::now() + std::chrono::milliseconds(options_.http.connect_timeout_ms) +
                        std::chrono::milliseconds(options_.http.request_timeout_ms);
  for (;;) {
    if (connected_) return Status();
    if (stopping_) return make_error(INFILL_ERROR_CLIENT_CLOSED, "the client is being destroyed");
    // A failed attempt that started after us (or was under way) answers; a stream that opened
    // and dropped again gets another attempt.
    if (attempts_ > start && !last_attempt_opened_) return last_error_;
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && !connected_)
      return make_error(INFILL_ERROR_TIMEOUT, "subscribing to the events of " + http_->endpoint.text + " timed out");
  }
}

Result<std::shared_ptr<Job>> ClientCore::submit(const json& params, Callbacks callbacks) {
  if (stopping_) return make_error(INFILL_ERROR_CLIENT_CLOSED, "the client is being destroyed");
  // Counted before the stream is needed, so that the io thread keeps the stream and holds
  // back events of ids it does not know yet (they may beat the POST's answer).
  submits_in_flight_.fetch_add(1);
  Status st = ensure_stream();
  if (!st.ok()) {
    asio::post(ioc_, [this] { submit_ended(); });
    return st.error();
  }
  std::string body;
  try {
    body = params.dump();
  } catch (const json::exception& e) {
    asio::post(ioc_, [this] { submit_ended(); });
    return make_error(INFILL_ERROR_INVALID_ARGUMENT, std::string("edit parameters: a string is not valid UTF-8 (") + e.what() + ")");
  }
  auto r = http_call(*http_, "POST", "/v1/edits", body, "application/json");
  if (!r.ok() || r->status != 202) {
    asio::post(ioc_, [this] { submit_ended(); });
    if (!r.ok()) return r.error();
    return response_error(*http_, *r, "submitting the edit");
  }
  const json j = json::parse(r->body, nullptr, false);
  if (!j.is_object() || !j.contains("id") || !j["id"].is_number_unsigned()) {
    asio::post(ioc_, [this] { submit_ended(); });
    return make_error(INFILL_ERROR_PROTOCOL, "the engine accepted the edit but its answer has no id: " + r->body.substr(0, 200));
  }
  auto job = std::make_shared<Job>();
  job->id = j["id"].get<uint64_t>();
  job->callbacks = callbacks;
  job->http = http_;
  job->io_thread = io_thread_id_;
  {
    // Until the io thread registers it; a destroy meanwhile still ends it (close_remaining).
    std::lock_guard lock(mu_);
    pending_.push_back(job);
  }
  asio::post(ioc_, [this, job] { register_job(job); });
  return job;
}

void ClientCore::submit_ended() {
  if (submits_in_flight_.fetch_sub(1) == 1) unclaimed_.clear();  // nobody waits for those ids
}

void ClientCore::register_job(std::shared_ptr<Job> job) {
  if (auto old = jobs_.find(job->id); old != jobs_.end()) {
    // The engine reused the id of an edit still in flight here: it forgot the old one.
    const std::shared_ptr<Job> stale = old->second;
    finish(stale, INFILL_JOB_FAILED,
           make_error(INFILL_ERROR_ENGINE_LOST, "edit " + std::to_string(stale->id) + " is no longer known to the engine at " +
                                                    http_->endpoint.text + " (it restarted and reused the id)"));
  }
  {
    std::lock_guard lock(mu_);
    jobs_[job->id] = job;
    pending_.erase(std::remove(pending_.begin(), pending_.end(), job), pending_.end());
  }
  auto held = unclaimed_.find(job->id);
  if (held != unclaimed_.end()) {
    auto events = std::move(held->second);
    unclaimed_.erase(held);
    for (const auto& [type, data] : events) {
      if (job->done_called || stopping_) break;
      dispatch(job, type, json::parse(data, nullptr, false));
    }
  }
  submit_ended();
}

asio::awaitable<void> ClientCore::main_loop() {
  while (!stopping_) {
    if (!wanted()) {
      boost::system::error_code ec;
      wake_.expires_after(std::chrono::hours(24 * 365));
      co_await wake_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      continue;
    }
    {
      std::lock_guard lock(mu_);
      last_attempt_opened_ = false;
    }
    Status st;
    try {
      st = co_await run_event_stream(
          *http_, options_.stream_idle_timeout_ms, [this] { return on_open(); },
          [this](const std::string& type, const std::string& data) { on_event(type, data); });
    } catch (const std::exception& e) {
      st = make_error(INFILL_ERROR_INTERNAL, std::string("event stream: ") + e.what());
    }
    if (stopping_) break;
    bool idle = false;
    {
      std::lock_guard lock(mu_);
      connected_ = false;
      ++attempts_;
      last_error_ = st.ok() ? make_error(INFILL_ERROR_CONNECTION, "the event stream ended") : st.error();
      idle = jobs_.empty() && submits_in_flight_.load() == 0;
      if (idle) want_ = false;
    }
    cv_.notify_all();
    if (idle) {
      need_reconcile_ = false;
      down_since_.reset();
      continue;
    }
    need_reconcile_ = true;
    const auto now = Clock::now();
    if (!down_since_) down_since_ = now;
    if (now - *down_since_ >= std::chrono::milliseconds(options_.engine_lost_timeout_ms)) {
      end_all(INFILL_ERROR_ENGINE_LOST, "the engine at " + http_->endpoint.text + " has been unreachable for " +
                                            std::to_string(options_.engine_lost_timeout_ms) + " ms: " + last_error_.message);
      down_since_.reset();
      need_reconcile_ = false;
      continue;
    }
    boost::system::error_code ec;
    wake_.expires_after(std::chrono::milliseconds(options_.reconnect_interval_ms));
    co_await wake_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  }
}

Status ClientCore::on_open() {
  // Reconcile before submits may go on: an engine that restarted without its journal hands
  // out ids again, and a fresh edit must not be taken for an old one. A poll that fails gives
  // the stream up, so that the next connection reconciles again.
  if (need_reconcile_) {
    Status st = reconcile();
    if (!st.ok()) return st;
    need_reconcile_ = false;
  }
  down_since_.reset();
  {
    std::lock_guard lock(mu_);
    connected_ = true;
    last_attempt_opened_ = true;
  }
  cv_.notify_all();
  return Status();
}

void ClientCore::on_event(const std::string& type, const std::string& data) {
  if (stopping_) return;
  const json j = json::parse(data, nullptr, false);
  if (!j.is_object() || !j.contains("id") || !j["id"].is_number_unsigned()) return;
  const uint64_t id = j["id"].get<uint64_t>();
  auto it = jobs_.find(id);
  if (it == jobs_.end()) {
    // An id whose POST has not answered yet; else another process using the same client name.
    if (submits_in_flight_.load() > 0) unclaimed_[id].emplace_back(type, data);
    return;
  }
  const std::shared_ptr<Job> job = it->second;  // a copy: finish() erases the map's
  dispatch(job, type, j);
}

void ClientCore::dispatch(const std::shared_ptr<Job>& job, const std::string& type, const json& data) {
  if (job->done_called || stopping_ || !data.is_object()) return;
  const Callbacks& cb = job->callbacks;
  if (type == "started") {
    std::lock_guard lock(job->mu);
    job->state = INFILL_JOB_RUNNING;
    job->steps_total = u32(data, "steps_total");
  } else if (type == "progress") {
    const uint32_t done = u32(data, "steps_done");
    const uint32_t total = u32(data, "steps_total");
    {
      std::lock_guard lock(job->mu);
      job->state = INFILL_JOB_RUNNING;
      if (done <= job->steps_done) return;  // never backwards, never twice
      job->steps_done = done;
      job->steps_total = total;
    }
    if (cb.on_progress) {
      infill_progress p{sizeof(infill_progress), job->id, done, total};
      cb.on_progress(cb.user_data, &p);
    }
  } else if (type == "preview") {
    if (!cb.on_preview || !data.contains("png_base64") || !data["png_base64"].is_string()) return;
    auto png = base64_decode(data["png_base64"].get<std::string>());
    if (!png) return;  // a preview is best effort
    infill_preview p{sizeof(infill_preview), job->id, u32(data, "steps_done"), u32(data, "width"), u32(data, "height"),
                     png->data(), png->size()};
    cb.on_preview(cb.user_data, &p);
  } else if (type == "done") {
    fetch_result_and_finish(job, done_info(data));
  } else if (type == "failed") {
    finish_failed_from_json(job, data);
  }
}

void ClientCore::finish_failed_from_json(const std::shared_ptr<Job>& job, const json& data) {
  const std::string state = data.contains("state") && data["state"].is_string() ? data["state"].get<std::string>() : "failed";
  Error e;
  infill_job_state s = INFILL_JOB_FAILED;
  e.code = INFILL_ERROR_EDIT_FAILED;
  if (state == "cancelled") {
    s = INFILL_JOB_CANCELLED;
    e.code = INFILL_ERROR_CANCELLED;
  } else if (state == "expired") {
    s = INFILL_JOB_EXPIRED;
    e.code = INFILL_ERROR_EXPIRED;
  }
  std::string message = state;
  if (data.contains("error") && data["error"].is_object()) {
    const json& err = data["error"];
    if (err.contains("code") && err["code"].is_string()) e.engine_code = err["code"].get<std::string>();
    if (err.contains("message") && err["message"].is_string()) message = err["message"].get<std::string>();
  }
  e.message = "edit " + std::to_string(job->id) + " " + state + ": " + message;
  finish(job, s, std::move(e));
}

DoneInfo ClientCore::done_info(const json& data) {
  DoneInfo info;
  info.steps_run = u32(data, "steps_run");
  info.total_ms = number(data, "total_ms");
  if (data.contains("cache_mode") && data["cache_mode"].is_string()) info.cache_mode = data["cache_mode"].get<std::string>();
  info.prompt_truncated = data.contains("prompt_truncated") && data["prompt_truncated"].is_boolean() &&
                          data["prompt_truncated"].get<bool>();
  info.adapters_from_step = u32(data, "adapters_from_step");
  return info;
}

void ClientCore::fetch_result_and_finish(const std::shared_ptr<Job>& job, const DoneInfo& info) {
  const std::string target = "/v1/edits/" + std::to_string(job->id) + "/result";
  if (job->done_called || stopping_) return;
  auto r = http_call(*http_, "GET", target);
  if (!r.ok() && (r.error().code == INFILL_ERROR_CONNECTION || r.error().code == INFILL_ERROR_TIMEOUT)) {
    // The engine said done: the result is there (journaled or kept until result_ttl_ms), and
    // only the way to it failed. Try again after reconnect_interval_ms, as the stream does,
    // and give up only when the engine counts as lost.
    const auto now = Clock::now();
    if (!job->result_unreachable_since) job->result_unreachable_since = now;
    if (now - *job->result_unreachable_since < std::chrono::milliseconds(options_.engine_lost_timeout_ms)) {
      auto timer = std::make_shared<asio::steady_timer>(ioc_, std::chrono::milliseconds(options_.reconnect_interval_ms));
      timer->async_wait([this, timer, job, info](const boost::system::error_code& ec) {
        if (!ec && !stopping_) fetch_result_and_finish(job, info);
      });
      return;
    }
    Error e = r.error();
    e.code = INFILL_ERROR_ENGINE_LOST;
    e.message = "edit " + std::to_string(job->id) + " is done but its result could not be fetched for " +
                std::to_string(options_.engine_lost_timeout_ms) + " ms: " + e.message;
    finish(job, INFILL_JOB_FAILED, std::move(e));
    return;
  }
  if (!r.ok()) {
    Error e = r.error();
    e.message = "edit " + std::to_string(job->id) + " is done but its result could not be fetched: " + e.message;
    finish(job, INFILL_JOB_FAILED, std::move(e));
    return;
  }
  if (r->status != 200) {
    finish(job, INFILL_JOB_FAILED, response_error(*http_, *r, "fetching the result of edit " + std::to_string(job->id)));
    return;
  }
  DoneInfo with_type = info;
  with_type.media_type = r->content_type;
  finish(job, INFILL_JOB_DONE, std::nullopt, std::move(r->body), with_type);
}

Status ClientCore::reconcile() {
  std::vector<std::shared_ptr<Job>> jobs;
  for (auto& [id, job] : jobs_) jobs.push_back(job);
  for (const auto& job : jobs) {
    if (stopping_ || job->done_called) continue;
    auto r = http_call(*http_, "GET", "/v1/edits/" + std::to_string(job->id));
    if (!r.ok()) return r.error();
    if (r->status == 404) {
      finish(job, INFILL_JOB_FAILED,
             make_error(INFILL_ERROR_ENGINE_LOST, "edit " + std::to_string(job->id) + " is no longer known to the engine at " +
                                                      http_->endpoint.text + " (it restarted, or the result expired)"));
      continue;
    }
    // Not ready yet (a restarted engine loading its model) or another hiccup: try again with
    // the next connection.
    if (r->status != 200) return response_error(*http_, *r, "polling edit " + std::to_string(job->id));
    const json j = json::parse(r->body, nullptr, false);
    if (!j.is_object() || !j.contains("state")) continue;
    if (j.contains("client") && j["client"].is_string() && j["client"].get<std::string>() != http_->client_name) {
      finish(job, INFILL_JOB_FAILED,
             make_error(INFILL_ERROR_ENGINE_LOST, "edit " + std::to_string(job->id) + " is no longer known to the engine at " +
                                                      http_->endpoint.text + " (it restarted; the id now names another edit)"));
      continue;
    }
    const std::string state = j["state"].is_string() ? j["state"].get<std::string>() : "";
    if (state == "done") {
      const json metrics = j.contains("metrics") ? j["metrics"] : json::object();
      fetch_result_and_finish(job, done_info(metrics));
    } else if (state == "failed" || state == "cancelled" || state == "expired") {
      finish_failed_from_json(job, j);
    } else if (state == "running" && u32(j, "steps_done") > 0) {
      json p = {{"id", job->id}, {"steps_done", u32(j, "steps_done")}, {"steps_total", u32(j, "steps_total")}};
      dispatch(job, "progress", p);
    }
  }
  return Status();
}

void ClientCore::finish(const std::shared_ptr<Job>& job_ref, infill_job_state state, std::optional<Error> error,
                        std::string png, const DoneInfo& info) {
  const std::shared_ptr<Job> job = job_ref;  // `job_ref` may be the entry erased below
  if (job->done_called) return;
  job->done_called = true;
  {
    std::lock_guard lock(mu_);
    jobs_.erase(job->id);
  }
  const infill_error* err = nullptr;
  {
    std::lock_guard lock(job->mu);
    job->state = state;
    job->result_png = std::move(png);
    job->result_media_type = state == INFILL_JOB_DONE ? info.media_type : std::string();
    job->cache_mode = info.cache_mode;
    if (error) job->error = std::make_unique<infill_error>(infill_error{std::move(*error)});
    err = job->error.get();
  }
  const Callbacks& cb = job->callbacks;
  if (cb.on_done) {
    infill_done d{sizeof(infill_done),
                  job->id,
                  state,
                  err,
                  state == INFILL_JOB_DONE ? job->result_png.data() : nullptr,
                  state == INFILL_JOB_DONE ? job->result_png.size() : 0,
                  info.steps_run,
                  info.total_ms,
                  job->cache_mode.c_str(),
                  info.prompt_truncated ? 1 : 0,
                  job->result_media_type.c_str(),
                  state == INFILL_JOB_DONE ? info.adapters_from_step : 0u};
    cb.on_done(cb.user_data, &d);
  }
  {
    std::lock_guard lock(job->mu);
    job->finished = true;
  }
  job->cv.notify_all();
}

void ClientCore::end_all(infill_error_code code, const std::string& why) {
  std::vector<std::shared_ptr<Job>> jobs;
  {
    std::lock_guard lock(mu_);
    for (auto& [id, job] : jobs_) jobs.push_back(job);
  }
  for (const auto& job : jobs) {
    Error e = make_error(code, "edit " + std::to_string(job->id) + ": " + why);
    finish(job, INFILL_JOB_FAILED, std::move(e));
  }
}

void ClientCore::close_remaining() {
  std::vector<std::shared_ptr<Job>> jobs;
  {
    std::lock_guard lock(mu_);
    for (auto& [id, job] : jobs_) jobs.push_back(job);
    jobs.insert(jobs.end(), pending_.begin(), pending_.end());
    pending_.clear();
  }
  if (options_.cancel_on_destroy && !jobs.empty()) {
    // Best effort and short: a gone engine must not hold up the host's shutdown.
    HttpConfig quick = *http_;
    quick.connect_timeout_ms = std::min<uint32_t>(quick.connect_timeout_ms, 1000);
    quick.request_timeout_ms = std::min<uint32_t>(quick.request_timeout_ms, 2000);
    for (const auto& job : jobs) {
      auto r = http_call(quick, "DELETE", "/v1/edits/" + std::to_string(job->id));
      if (!r.ok()) break;
    }
  }
  for (const auto& job : jobs)
    finish(job, INFILL_JOB_FAILED,
           make_error(INFILL_ERROR_CLIENT_CLOSED,
                      "edit " + std::to_string(job->id) + ": the client was destroyed while the edit was in flight"));
}

void ClientCore::destroy() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (on_io_thread()) {
    // Called from a callback: the io thread finishes the callback, then cleans up itself.
    self_destruct_ = true;
    thread_.detach();
    ioc_.stop();
    return;
  }
  ioc_.stop();
  if (thread_.joinable()) thread_.join();
  close_remaining();
  delete this;
}

}  // namespace infill::sdk
