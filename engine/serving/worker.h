#pragma once
/// One worker: a step loop on its own thread that owns a device's compute (a share of the CPU
/// cores, or one CUDA GPU) and advances all its requests, of every model it serves, with
/// continuous batching at step granularity.
///
/// Per step boundary the loop drains its inbox (new sessions, cancels), retires cancelled and
/// expired requests, lets its BatchSelector choose the batch within the token budget, packs
/// the segments of every chosen session into one forward per model present in the batch,
/// splits the rows back and applies them. Requests join at any boundary and leave as soon as
/// they finish.
///
/// Several models on one worker: a round runs one forward per model present rather than one
/// model per round. The device does the same work either way (the forwards of a round run one
/// after the other), but picking one model per round would make every request wait a round of
/// the other model between its own steps, and the deadline scheduler already weighs the
/// whole round's predicted cost (each model's tokens on its own cost model).
/// Pre-processing (template decode, mask to tokens, cache look-up, session set-up) and
/// post-processing (decode, composite, PNG) run on the shared TaskPool, never on the loop.
///
/// Prepare jobs (a template without a cache entry) run on the loop, sliced one denoising step
/// per slice and interleaved with batched steps, earliest deadline first: a prepare is a full
/// forward that would compete for the same cores on any other thread, and slicing keeps the
/// running requests moving. Requests on the same template share one job.
///
/// Live painting keeps one prompt over many strokes: for a live request of a model with
/// prompt-keyed entries (FLUX.2) whose entry is missing, the first stroke runs on the
/// template-keyed entry while a prompt-keyed prepare runs in the background (after every
/// prepare someone waits for); later strokes with that prompt read it.
///
/// Device failure: a failed forward fails that model's requests with an error naming the
/// device. Out of device memory leaves the worker as it was; a sticky CUDA error poisons the
/// process's CUDA context (device_fault.h), so the worker fails everything it holds, takes
/// itself out of service (load().in_service, the router passes it over; metrics() says why).
/// The requests of the step that hit the error fail (their own inputs may have caused it);
/// every other request it holds or still receives is handed back through
/// WorkerOptions::reroute (the runtime routes it again, from its start, to a worker in
/// service), or failed as unavailable without one. The engine goes on with its other workers;
/// a restart brings the device back.
///
/// Threading: submit(), cancel(), load(), metrics() are safe from any thread. Callbacks run on
/// the TaskPool. Every error is reported in the request's result; no exception leaves the loop.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cache/activation_store.h"
#include "pipeline/edit_model.h"
#include "serving/batch_policy.h"
#include "serving/cost_model.h"
#include "serving/device_team.h"
#include "serving/live_cost_model.h"
#include "serving/router.h"
#include "serving/serving_metrics.h"
#include "serving/serving_request.h"
#include "serving/task_pool.h"

namespace infill {

/// A model a worker serves, with the cost model of its steps on the worker's device (the
/// starting point: the worker keeps it true from its own steps, live_cost_model.h).
struct ServedModel {
  std::shared_ptr<const EditModel> model;
  std::shared_ptr<const StepCostModel> cost;
};

struct WorkerOptions {
  int index = 0;
  /// The worker's device as /health, /metrics and messages name it ("cpu:1" among several
  /// CPU devices); "" = its models' device name.
  std::string device_label;
  /// libtorch intra-op threads of this worker's step loop.
  int compute_threads = 1;
  BatchingPolicy policy = BatchingPolicy::kDeadline;
  /// Packed masked tokens per step (a single larger request still runs, alone).
  int64_t token_budget = 2048;
  /// With allow_step_reduction the deadline policy may cut a request's remaining steps (never
  /// below its class's min_steps_allowed); the result reports steps_run and steps_dropped.
  SchedulerOptions scheduler;
  /// Time zero of every timestamp (ms since this instant).
  std::chrono::steady_clock::time_point epoch = std::chrono::steady_clock::now();
  /// Fault injection for tests: called on the loop with the ids of one model's share of a
  /// step's batch just before that model's forward; an exception thrown here fails those
  /// requests like a failed forward would.
  std::function<void(std::span<const uint64_t> ids)> before_step;
  /// Test seam: while it returns false for the number of requests ready to step, the loop
  /// runs no batched step (prepares still run) and waits for its next message, then asks
  /// again; so a test can have several requests ready before the first step, with no sleep.
  std::function<bool(size_t ready)> may_step;
  /// Fault injection for tests: called on the pool before a request's post-processing; an
  /// error fails that request.
  std::function<Status(uint64_t id)> before_finish;
  /// An edit whose template-keyed entry is only in the store's disk tier streams it during
  /// its steps (FlashPS's overlapped loading: block b+1's K/V are read while block b
  /// computes), the load plan choosing per block between loading and recomputing from the
  /// model's cost model and the slab read time this worker measured; the entry is promoted to
  /// RAM afterwards for the next edits. false: the entry is read whole first, then computed.
  bool stream_from_disk = true;
  /// Slab read speed assumed until this worker has timed its own reads (bytes per ms).
  double assumed_read_bytes_per_ms = 1e6;
  /// Test seam: the leading blocks a streamed edit recomputes (given the block count), in
  /// place of the load plan's choice.
  std::function<int(int blocks)> force_recompute_blocks;
  /// The engine's device team (device_team.h) and this worker's rank in it (-1: none): a
  /// prepare step of a whole sequence runs in sequence parallel over the idle devices the
  /// team's planner leases to it (team_planner.h), and this worker's loop runs the shares
  /// other ranks' steps post to it.
  std::shared_ptr<DeviceTeam> team;
  int team_rank = -1;
  /// A masked step asks the team only when its mask covers at least this share of the image's
  /// tokens (a large mask: its step costs near a full one); smaller masks stay on their device,
  /// batched there with other edits. Above 1: masked steps never ask.
  double team_masked_share = 0.25;
  /// After a sticky device error took this worker out of service: takes each request it held
  /// (not those of the step that failed) with the time it was submitted (ms since the epoch),
  /// to run it elsewhere; the worker then forgets it without a result. Called on the loop.
  /// Null: such requests fail as unavailable. Set by the runtime.
  std::function<void(ServingRequest request, double submitted_ms)> reroute;
};

class Worker {
 public:
  /// `models`: every model this worker serves (any family: DitEditModel, Flux2EditModel), all
  /// on one device, each with the cost model that predicts its steps there for the scheduler
  /// and the backlog reported to the router; a request names its model (ServingRequest::model,
  /// null = the first). `store` holds prepared templates (required; its keys include the
  /// model id). `pool` must outlive the worker. The caller (the runtime) checked the models.
  Worker(std::vector<ServedModel> models, std::shared_ptr<ActivationStore> store, TaskPool& pool,
         WorkerOptions options);
  /// Stops the loop: every request not yet terminal ends as cancelled ("worker stopped").
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  /// Queues a request (state queued at `submitted_ms`, ms since the epoch) and starts its
  /// pre-processing. The caller (the runtime) checked that the id is non-zero and unique.
  void submit(ServingRequest request, double submitted_ms);
  /// Cancels a request at its next step boundary (or before it starts); `reason` is reported.
  /// Unknown or finished ids are ignored. Returns whether the id was live here.
  bool cancel(uint64_t id, Status reason);

  /// Requests not yet terminal and the predicted time to drain them (see router.h).
  WorkerLoad load() const;
  WorkerMetrics metrics() const;
  /// Metrics of the most recent terminal requests (at most kRecentRequests), oldest first.
  std::vector<RequestMetrics> recent_requests() const;
  static constexpr size_t kRecentRequests = 4096;
  /// Blocks until no request is live here or `timeout_ms` passed; true when idle.
  bool wait_idle(double timeout_ms) const;
  int index() const { return options_.index; }
  /// Runs `task` on the step loop at its next step boundary (a rank's share of another
  /// worker's sequence-parallel step, device_team.h); dropped unrun when the worker stops.
  void run_on_loop(std::function<void()> task);
  /// Ends the device team's holds on this worker's work at its next step boundary: what they
  /// waited for is free (device_team.h), so it asks the team again.
  void end_team_holds();
  /// No request and no prepare job (a background one included) here: a device team may lease
  /// this worker's device without waiting behind its own full forwards.
  bool idle() const;
  /// The device label (WorkerOptions::device_label, or the models' device name).
  const std::string& device() const { return device_; }
  /// The step cost of the model at `slot` (the order given) on this worker's device now, as
  /// refitted from its own steps.
  std::shared_ptr<const StepCostModel> cost(size_t slot) const { return costs_.at(slot)->current(); }
  /// Request records alive in every worker of the process (for leak checks).
  static int64_t live_records();

  double now_ms() const;

 private:
  struct Record;
  struct PrepareJob;
  struct Message;

  void loop();
  void post(Message message);
  void handle(Message& message);
  void preprocess(const std::shared_ptr<Record>& r);
  void create_session(const std::shared_ptr<Record>& r, std::shared_ptr<const ActivationEntry> entry,
                      std::shared_ptr<const ActivationEntry> prompt_entry = nullptr);
  /// Sets up an edit that streams the entry of `key` from the disk tier under a load plan;
  /// false when it cannot (the caller then reads the entry whole).
  bool create_streamed_session(const std::shared_ptr<Record>& r, const ActivationKey& key);
  // The load plan's recomputed prefix for `r` reading an entry of `layout` whose blocks arrive
  // at `bytes_per_ms` (the disk, or the bus to a GPU), capped by the model and the test seam.
  int planned_recompute(const Record& r, const ActivationLayout& layout, double bytes_per_ms) const;
  /// Takes a session made for `r` (or its error) and hands `r` to the loop.
  void adopt_session(const std::shared_ptr<Record>& r, Result<std::unique_ptr<StepSession>> session);
  void start_prepare(const std::shared_ptr<Record>& r, std::shared_ptr<const TemplateImage> tmpl);
  void run_prepare_slice();
  /// How a step went to the device team: run here alone, run over the leased devices, or held
  /// back (the team's planner has it wait this round while its rank serves another's step).
  enum class TeamStep { kAlone, kParallel, kHeld };
  /// Runs the next step of `job` over the devices the team leases to it; kAlone when it has
  /// none (the caller runs the step here alone), kHeld when the team holds it back (the
  /// caller runs nothing of it now). Throws what a failed step throws.
  TeamStep run_prepare_step_in_team(PrepareJob& job);
  /// The one session of `sessions` (of `records`) stepped over the devices the team leases to
  /// it: a guided step's halves on two devices, or a whole sequence (a full recompute) or a
  /// large mask's rows in sequence parallel; its prediction rows; undefined when there is no such session or no
  /// lease (the caller runs the model's forward here), or when the team holds the step back
  /// (`held` set: the caller runs nothing of it now; its record's team_hold_until_ms says until when).
  at::Tensor forward_in_team(const ServedModel* served, std::span<const std::shared_ptr<Record>> records,
                             std::span<StepSession* const> sessions, bool& held);
  /// What the team's planner is told of a request of `served` (device_team.h).
  TeamAsk team_ask(const ServedModel* served, uint64_t id, int64_t tokens, int steps_left, double deadline_abs_ms,
                   double single_ms) const;
  void run_step();
  /// Applies one model's forward output to its share of the batch (or fails them all).
  void apply_rows(std::vector<std::shared_ptr<Record>>& batch, bool failed, const std::string& error,
                  const at::Tensor& rows);
  void retire_inactive();
  /// Ends `r` if it was cancelled or expired (or already ended); true when it is gone.
  bool retire(const std::shared_ptr<Record>& r, double now);
  void finish(const std::shared_ptr<Record>& r);
  /// Moves `r` to a terminal state (first caller wins), accounts for it and posts on_complete.
  void complete(const std::shared_ptr<Record>& r, RequestState state, Status status, EditOutput output = {},
                std::vector<std::byte> result_file = {}, ImageFileFormat result_format = ImageFileFormat::kPng);
  /// Runs a client callback of `r` on the pool after every earlier one of `r` has run.
  void notify(const std::shared_ptr<Record>& r, std::function<void()> callback);
  void take_work(Record& r, double ms);
  void publish_load();
  /// After a sticky device error: records why and leaves service; the loop then fails every
  /// request it holds (fail_all_out_of_service) at its next boundary.
  void take_out_of_service(const std::string& fault);
  /// Hands every request the loop holds (active, waiting on a prepare) to options_.reroute,
  /// or fails it as out of service.
  void fail_all_out_of_service();
  /// Ends `r` here without a result and hands its request to options_.reroute; false when it
  /// cannot (no reroute, cancelled, already ended).
  bool hand_back(const std::shared_ptr<Record>& r);
  /// The served model a request names (null: the first), or null when it is not served here.
  const ServedModel* served_model(const EditModel* model) const;

  const std::vector<ServedModel> models_;  // never empty; fixed for the worker's life
  // Per model (same index): its step cost on this worker's device, refitted from the loop's steps.
  std::vector<std::unique_ptr<LiveCostModel>> costs_;
  LiveCostModel& cost_of(const ServedModel* served) const { return *costs_[static_cast<size_t>(served - models_.data())]; }
  std::shared_ptr<ActivationStore> store_;
  TaskPool& pool_;
  WorkerOptions options_;
  const std::string device_;

  // Inbox: the only way other threads reach the loop's state.
  mutable std::mutex inbox_mu_;
  std::condition_variable inbox_cv_;
  std::vector<Message> inbox_;
  bool stop_ = false;

  // Live records by id, for cancel() from any thread; erased when terminal.
  mutable std::mutex records_mu_;
  mutable std::condition_variable idle_cv_;
  std::unordered_map<uint64_t, std::shared_ptr<Record>> records_;

  // Owned by the loop thread.
  BatchSelector selector_;
  std::vector<std::shared_ptr<Record>> active_;  // sessions the loop steps, in arrival order
  std::map<std::string, std::unique_ptr<PrepareJob>> prepares_;  // by cache key
  uint64_t prepare_serial_ = 0;  // jobs made on the loop so far
  std::map<std::string, std::shared_ptr<const ActivationEntry>> recent_;  // prepared, not yet stored
  std::set<std::string> background_pending_;  // prompt-keyed prepares being set up on the pool
  uint64_t ready_seq_ = 0;
  bool prepare_turn_ = false;
  bool steps_held_ = false;  // may_step said no: wait for a message, not for steps
  // Loop thread only: a step or a prepare slice can run now; some wait for adapters being read.
  bool runnable_ = false;
  bool waiting_for_adapters_ = false;
  // Loop thread only: the earliest end of a hold of the device team (now_ms()); infinity: none.
  double held_until_ms_ = std::numeric_limits<double>::infinity();

  // Load reported to the router.
  std::atomic<int> requests_{0};
  // The loop holds prepare jobs (background ones too, which no request waits for): set at
  // every boundary, read by idle().
  std::atomic<bool> holds_prepares_{false};
  std::atomic<double> work_ms_{0.0};
  // Recent mean of post-processing time (last step -> result), which the scheduler takes off
  // every deadline so that "on time" means the result, not the last step, is on time.
  std::atomic<double> post_estimate_ms_{0.0};
  std::atomic<int> max_steps_left_{0};
  // Out of service after a sticky device error (see the class comment), and why.
  std::atomic<bool> in_service_{true};
  mutable std::mutex fault_mu_;
  std::string fault_;  // guarded by fault_mu_
  // Slab read speed measured on this worker's streamed edits (bytes per ms; <= 0: none yet).
  std::atomic<double> read_bytes_per_ms_{0.0};

  mutable std::mutex metrics_mu_;
  WorkerMetrics metrics_;
  std::deque<RequestMetrics> recent_requests_;

  std::thread thread_;
};

}  // namespace infill
