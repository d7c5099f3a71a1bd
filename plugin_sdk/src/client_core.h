#pragma once
// The client behind the C API: HTTP calls from any thread, and one background thread (an
// io_context) that owns the event stream, the table of edits in flight and every callback.
//
// Ownership: the io thread alone touches jobs_, unclaimed_ and the reconnect state; caller
// threads hand it work with asio::post (message passing), and share only the stream status
// (mu_) and each Job's public state (Job::mu).
#include <utility>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/steady_timer.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "http.h"
#include "infill/infill_client.h"
#include "status.h"

struct infill_error {
  infill::sdk::Error e;
};

namespace infill::sdk {

struct Callbacks {
  infill_progress_fn on_progress = nullptr;
  infill_preview_fn on_preview = nullptr;
  infill_done_fn on_done = nullptr;
  void* user_data = nullptr;
};

/// One accepted edit. Shared by the io thread and the caller's infill_job handle.
struct Job {
  uint64_t id = 0;
  Callbacks callbacks;
  std::shared_ptr<const HttpConfig> http;  // for cancel, which may outlive the client
  std::thread::id io_thread;

  mutable std::mutex mu;  // guards the fields below
  std::condition_variable cv;
  infill_job_state state = INFILL_JOB_QUEUED;
  uint32_t steps_done = 0;
  uint32_t steps_total = 0;
  bool finished = false;  // on_done has returned
  std::string result_png;         // the result file, whatever its format
  std::string result_media_type;  // its Content-Type; infill_done.media_type points here
  std::string cache_mode;  // of the result; infill_done.cache_mode points here
  std::unique_ptr<infill_error> error;

  // io thread only
  bool done_called = false;
  /// Since when fetching the result of this done edit has failed on the transport (retried
  /// every reconnect_interval_ms until engine_lost_timeout_ms: a done edit is not failed by a
  /// passing transport error).
  std::optional<std::chrono::steady_clock::time_point> result_unreachable_since;
};

struct CoreOptions {
  HttpConfig http;
  uint32_t stream_idle_timeout_ms = 45000;
  uint32_t reconnect_interval_ms = 500;
  uint32_t engine_lost_timeout_ms = 10000;
  bool cancel_on_destroy = true;
};

/// What a finished edit reports beside its PNG (the "done" event's data, or the status JSON's
/// metrics).
struct DoneInfo {
  uint32_t steps_run = 0;
  double total_ms = 0;
  std::string cache_mode;  ///< "" when the engine did not say
  bool prompt_truncated = false;
  std::string media_type;  ///< of the result file (its Content-Type)
  uint32_t adapters_from_step = 0;  ///< the K the edit ran with; 0 without adapters
};

class ClientCore {
 public:
  explicit ClientCore(CoreOptions options);
  ClientCore(const ClientCore&) = delete;
  ClientCore& operator=(const ClientCore&) = delete;

  const HttpConfig& http() const { return *http_; }

  /// POST /v1/edits with `params` (JSON body) once the event stream is up; registers the job
  /// with the io thread.
  Result<std::shared_ptr<Job>> submit(const nlohmann::json& params, Callbacks callbacks);

  /// Stops the io thread, ends every job with CLIENT_CLOSED and deletes this. See
  /// infill_client_destroy.
  void destroy();

 private:
  ~ClientCore();
  bool on_io_thread() const { return std::this_thread::get_id() == io_thread_id_; }
  Status ensure_stream();
  boost::asio::awaitable<void> main_loop();
  Status on_open();
  void on_event(const std::string& type, const std::string& data);
  void dispatch(const std::shared_ptr<Job>& job, const std::string& type, const nlohmann::json& data);
  void register_job(std::shared_ptr<Job> job);
  void submit_ended();
  Status reconcile();
  static DoneInfo done_info(const nlohmann::json& data);
  void fetch_result_and_finish(const std::shared_ptr<Job>& job, const DoneInfo& info);
  void finish(const std::shared_ptr<Job>& job, infill_job_state state, std::optional<Error> error, std::string png = {},
              const DoneInfo& info = {});
  void finish_failed_from_json(const std::shared_ptr<Job>& job, const nlohmann::json& data);
  void end_all(infill_error_code code, const std::string& why);
  void close_remaining();
  bool wanted() const;  // edits in flight or a subscription asked for

  CoreOptions options_;
  std::shared_ptr<const HttpConfig> http_;
  boost::asio::io_context ioc_;
  boost::asio::steady_timer wake_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_;
  std::thread thread_;
  std::thread::id io_thread_id_;
  std::atomic<int> submits_in_flight_{0};
  std::atomic<bool> stopping_{false};
  bool self_destruct_ = false;

  // Shared stream status.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool connected_ = false;
  bool want_ = false;
  uint64_t attempts_ = 0;  // finished connection attempts
  bool last_attempt_opened_ = false;
  Error last_error_;
  std::vector<std::shared_ptr<Job>> pending_;  // accepted, not yet registered by the io thread

  // io thread only.
  std::map<uint64_t, std::shared_ptr<Job>> jobs_;
  std::map<uint64_t, std::vector<std::pair<std::string, std::string>>> unclaimed_;
  bool need_reconcile_ = false;
  std::optional<std::chrono::steady_clock::time_point> down_since_;
};

}  // namespace infill::sdk
