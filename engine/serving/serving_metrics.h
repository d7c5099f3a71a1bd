#pragma once
/// Metrics of the serving runtime, as plain structs (the server will expose the same fields).
///
/// Value types; the worker and runtime hand out copies.

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "model/step_graph_stats.h"
#include "serving/cost_model.h"

namespace infill {

/// One request's account, filled when it reaches a terminal state.
struct RequestMetrics {
  uint64_t id = 0;
  int worker = -1;               ///< index of the worker it was routed to
  double queue_ms = 0.0;         ///< submit -> first step, less prepare_ms
  double prepare_ms = 0.0;       ///< pre-processing plus waiting for the template's prepare job
  double ready_ms = 0.0;         ///< submit -> could join a step (with the wait for a pool thread)
  double run_ms = 0.0;           ///< first step -> last step
  double post_ms = 0.0;          ///< last step -> result: waiting for a pool thread, then post_work_ms
  double post_work_ms = 0.0;     ///< the pool thread's time on decode, composite, PNG encode
  double total_ms = 0.0;         ///< submit -> terminal state
  int steps_requested = 0;       ///< denoising steps the request asked for (after strength)
  int steps_run = 0;             ///< steps actually run
  int steps_dropped = 0;         ///< steps cut by the scheduler under overload
  int64_t masked_tokens = 0;
  int64_t total_tokens = 0;
  double deadline_ms = 0.0;      ///< relative to submission
  bool deadline_met = false;     ///< done within deadline_ms of submission
  bool shared_prepare = false;   ///< joined a prepare job another request started
  /// The template's entry was only in the disk tier and streamed during the steps; per step,
  /// the load plan loaded blocks_loaded blocks' K/V and recomputed the blocks_recomputed
  /// leading ones on all tokens.
  bool streamed = false;
  /// On a GPU: the entry was copied from host memory block by block (the device tier did not
  /// hold it); per step the plan copied blocks_loaded blocks and recomputed the rest.
  bool copied_to_device = false;
  int blocks_loaded = 0;
  int blocks_recomputed = 0;
};

/// One worker's account since it started.
struct WorkerMetrics {
  int index = 0;
  std::string device;            ///< where its step loop computes: "cpu", "cuda:0"
  /// false after a sticky device error took it out of service; `fault` says which.
  bool in_service = true;
  std::string fault;
  /// Batched steps that ran a forward of each model (a round with two models counts for both).
  std::map<std::string, uint64_t> steps_by_model;
  /// Requests the runtime's router sent here, by why (route_reason_name: least_loaded,
  /// template_locality, live_client); filled by the runtime, not the worker.
  std::map<std::string, uint64_t> routed;
  /// Edits of a template whose entry this worker held (router.h) that the router sent to
  /// another worker (this one out of service, or dearer than that one even so).
  uint64_t locality_missed = 0;
  /// The step cost each model has on this worker's device now: the coefficients
  /// [intercept ms, ms per token, ms per request, ms per attention unit] refitted from its
  /// timed steps, how many were timed, refits adopted, and the model's MAPE on recent steps.
  struct ModelCost {
    std::array<double, 4> coefficients{};
    size_t samples = 0;
    size_t refits_adopted = 0;
    double mape = 0.0;
  };
  std::map<std::string, ModelCost> cost_by_model;
  /// Each model's step graphs on this worker's device (models with graphs only: a GPU's).
  std::map<std::string, StepGraphStats> step_graphs_by_model;
  /// Each model's codec calls run on the codec's CPU copy for want of device memory
  /// (EditModel::codec_host_fallbacks; models with such a copy only: a GPU's FLUX.2 VAE).
  std::map<std::string, int64_t> codec_host_fallbacks_by_model;
  uint64_t steps = 0;            ///< batched denoising steps run
  uint64_t failed_steps = 0;     ///< steps whose forward threw (their requests failed)
  /// Requests handed back to be run on another worker after this one left service.
  uint64_t rerouted = 0;
  uint64_t prepare_steps = 0;    ///< prepare-job slices run (one full denoising step each)
  /// Of those, steps run in sequence parallel over devices the team leased (device_team.h),
  /// and shares of other workers' such steps this worker's loop ran.
  uint64_t prepare_steps_parallel = 0;
  uint64_t team_shares = 0;
  /// Steps (of a request or a prepare job) the device team held back (TeamDecision::hold_ms):
  /// a round while this worker's device served another's step, or until the devices planned
  /// for the step ended others' steps (TeamDecision::awaits).
  uint64_t team_holds = 0;
  /// Batched steps of one edit run over several devices the same way: a whole sequence (a
  /// full recompute) in sequence parallel, or (steps_halves_split of them) a guided step's
  /// two halves each on its own device.
  uint64_t steps_parallel = 0;
  uint64_t steps_halves_split = 0;
  uint64_t requests_advanced = 0;  ///< sum of batch sizes
  int max_batch = 0;
  double step_ms_total = 0.0;    ///< forward + sampler updates of batched steps
  double prepare_ms_total = 0.0; ///< prepare slices
  double sched_ms_total = 0.0;   ///< batch selection
  double pack_ms_total = 0.0;    ///< building and splitting the packed segments
  double uptime_ms = 0.0;
  /// Cache slab read speed measured on this worker's streamed edits (bytes per ms); 0 = none yet.
  double read_bytes_per_ms = 0.0;
  /// The recent batched steps as the cost model sees them (packed tokens, batch size,
  /// attention work, and the whole step-loop time of the step: scheduling, packing, forward,
  /// sampler updates), oldest first, at most kRecent. StepCostModel::fit on these gives the
  /// cost of steps under the real load, which a start-up calibration on a quiet machine can
  /// miss (other threads, the machine's speed drifting).
  std::vector<StepSample> recent_steps;
  static constexpr size_t kRecent = 4096;
  /// Every batched step's whole step-loop time (scheduling, packing, forward, sampler
  /// updates), counted per bucket: step_seconds_buckets[i] counts steps no longer than
  /// kStepSecondsBounds[i] and longer than the bound before; the last bucket counts the rest.
  /// Not cumulative (the Prometheus rendering makes it so).
  static constexpr std::array<double, 12> kStepSecondsBounds = {0.001, 0.002, 0.005, 0.01, 0.02, 0.05,
                                                                0.1,   0.2,   0.5,   1.0,  2.0,  5.0};
  std::array<uint64_t, kStepSecondsBounds.size() + 1> step_seconds_buckets{};
  double step_seconds_sum = 0.0;
  void count_step_seconds(double seconds) {
    size_t b = 0;
    while (b < kStepSecondsBounds.size() && seconds > kStepSecondsBounds[b]) ++b;
    step_seconds_buckets[b] += 1;
    step_seconds_sum += seconds;
  }

  double mean_batch() const { return steps ? double(requests_advanced) / double(steps) : 0.0; }
  double mean_step_ms() const { return steps ? step_ms_total / double(steps) : 0.0; }
  /// Busy fraction of the uptime (steps, prepare slices, scheduling).
  double utilisation() const {
    return uptime_ms > 0 ? (step_ms_total + prepare_ms_total + sched_ms_total + pack_ms_total) / uptime_ms : 0.0;
  }
};

}  // namespace infill
