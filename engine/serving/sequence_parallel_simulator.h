#pragma once
/// Discrete-event simulation of whole-sequence requests (prepare runs, full steps) served in
/// Ulysses sequence parallel on 1 to 512 devices, so that the degree planning of a cluster
/// can be studied without it. Step times come from a StepMsFunction (e.g.
/// SequenceParallelCostModel::function()). The masked-step simulator is simulator.h.
///
/// Two policies:
/// - Round planner (TetriServe): rounds start every `round_ms` (or, with `round_steps` = K,
///   each round lasts K steps of the slowest step it planned). At a round's start every
///   request that has arrived and has steps not yet started goes to plan_round
///   (round_planner.h) with its devices of the last round as its placement and the end of its
///   step in flight as its ready time (a request that waited gives the devices it last ran on,
///   where its latents are, when no other request's placement holds them). Until the next
///   round each request runs its steps back
///   to back at its planned degree on its planned devices. Steps are not preempted: a request
///   whose plan changed moves when its step in flight ends, and a device passes to its new
///   holder when its old holder's step on it ends. Requests arriving in a round wait for the
///   next one, unless `plan_on_arrival`: then an arrival starts a new round at once (the next
///   one round_ms later), as the engine's device team plans when an unknown request asks.
/// - Fixed degree D (xDiT's serving, the baseline): the devices form devices / D groups of D
///   contiguous devices; a request takes the lowest free group when it arrives, or waits in
///   one first-come-first-served queue, and runs all its steps at D there. No rounds.
///
/// Guided requests (the trace's guided share: a base model under classifier-free guidance,
/// two forwards of the sequence per step) take their step times from a GuidedStepMsFunction.
/// The round planner places their halves (round_planner.h, "Guidance placement"): split over
/// two groups of d devices at once, or packed in one forward on d; split_guidance false packs
/// always. Under a fixed degree D they run packed on their group of D, or, with
/// fixed_split_guidance, split over its two halves at degree D / 2 each (xDiT's CFG
/// parallelism with Ulysses D / 2).
///
/// Bound to a home (`bind_to_home`, the engine's device team: serving/team_planner.h): each
/// request is bound at arrival to the device with the fewest unfinished requests bound to it
/// (the engine's router hands it to one worker, which holds its state). A device runs one of
/// its requests at a time (the one whose step is in flight, else the earliest deadline among
/// those still on time if run alone on the device from now, else the earliest deadline: late
/// work yields, as the worker's step scheduler lets it, step_scheduler.h); that
/// request goes to the planner with the device as its home (it never waits and runs on devices
/// including it), its device's other requests wait, and devices whose only request runs its
/// last step are unavailable. Devices with nothing bound are what the planner grants.
///
/// Busy planned devices (`busy_devices`): a plan may give a request devices still in another's
/// step (steps are not preempted). It waits for them all (TetriServe), steps now on the free
/// ones at the largest degree they allow, or waits only where their steps end soon enough that
/// waiting and then stepping as planned ends its step sooner (the engine's device team).
///
/// Not modelled: moving a request's latents between devices (free here), text encoding, VAE
/// decode, the planner's own run time.
///
/// Threading: a pure function; runs on the calling thread.

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"
#include "serving/sequence_parallel_cost_model.h"

namespace infill {

/// One whole-sequence request of a trace.
struct SpSimRequest {
  uint64_t id = 0;
  double arrival_ms = 0;
  int64_t tokens = 0;      ///< tokens of its sequence (what the step function takes)
  int steps = 0;           ///< denoising steps, each over the whole sequence
  double deadline_ms = 0;  ///< relative to arrival
  bool guided = false;     ///< classifier-free guided: two forwards of the sequence per step
};

/// Values only grow; 0 is not a policy.
enum class SpPolicy { kRoundPlanner = 1, kFixedDegree = 2 };

/// What a request whose planned devices are not all free yet (some still in another's step,
/// the plan handing them on) does. Values only grow; 0 is not a choice.
enum class SpBusyDevices {
  kWait = 1,           ///< waits for all of them (TetriServe's rounds)
  kShortOfPlan = 2,    ///< steps now on the free ones, at the largest degree they allow
  /// waits where the busy ones' steps end soon enough that waiting and then stepping as
  /// planned ends the step sooner than stepping short of plan now; else steps short (the
  /// engine's device team: TeamPlannerOptions::await_ranks)
  kWaitWhenSooner = 3,
};

struct SpSimOptions {
  int devices = 8;
  int heads = 24;  ///< attention heads: every degree divides them
  SpPolicy policy = SpPolicy::kRoundPlanner;
  int fixed_degree = 1;   ///< kFixedDegree: every request's degree
  double round_ms = 100;  ///< kRoundPlanner: round length (when round_steps is 0)
  /// kRoundPlanner: > 0 makes each round last this many steps of the slowest step planned in
  /// it; the planner is then told the previous round's length (the first round's: this many
  /// steps of the longest active request at degree 1).
  int round_steps = 0;
  int max_degree = 0;              ///< kRoundPlanner: 0 = up to the devices
  bool grant_idle_devices = true;  ///< kRoundPlanner
  /// kRoundPlanner: guided requests' halves may be split over two device groups; false packs
  /// them always.
  bool split_guidance = true;
  /// kRoundPlanner: every request bound to a home device (see "Bound to a home").
  bool bind_to_home = false;
  /// kRoundPlanner: an arrival starts a new round at once, restarting the round clock (the
  /// engine's team plans as soon as an unknown request asks: serving/team_planner.h); false,
  /// TetriServe's rounds: arrivals wait for the next round boundary.
  bool plan_on_arrival = false;
  /// kRoundPlanner with bind_to_home: a device's request may wait a round while others use
  /// its device (RoundPlannerOptions::homes_may_wait); false, it always runs on its device.
  bool bound_may_yield = false;
  /// kRoundPlanner: a request whose planned devices are not all free yet (see SpBusyDevices).
  /// Short steps keep the home device (bind_to_home: a request whose own device is in
  /// another's step waits) and, guided and split, their halves split where two devices are free.
  SpBusyDevices busy_devices = SpBusyDevices::kWait;
  /// kFixedDegree: guided requests' halves split over the two halves of each group (at
  /// fixed_degree / 2 each; fixed_degree must be even); false packs them on the group.
  bool fixed_split_guidance = false;
};

/// Degrees in the outcome and report count the devices a step ran on: for a guided request
/// split, both halves' groups (2 x the Ulysses degree).
struct SpSimOutcome {
  uint64_t id = 0;
  double latency_ms = 0;  ///< arrival -> last step's end
  bool deadline_met = false;
  double mean_degree = 0;  ///< over its steps
  int max_degree = 0;
  /// Steps started at a degree other than its previous step's (or, guided, split where it
  /// was packed or the reverse).
  int degree_changes = 0;
  /// Steps started at the degree of its previous step on other devices (a move of its
  /// latents): after it waited while others took its devices, or when its degree changed and
  /// changed back within one step.
  int moves = 0;
  int split_steps = 0;  ///< guided: steps run with the halves split
};

struct SpSimReport {
  std::vector<SpSimOutcome> requests;     ///< in the order of the input
  double slo_attainment = 0;              ///< share of requests that met their deadline
  double busy_device_ms = 0;              ///< sum over steps of degree x step time
  double makespan_ms = 0;                 ///< first arrival -> last finish
  int rounds = 0;                         ///< plans made (0 for a fixed degree)
  std::vector<uint64_t> steps_by_degree;  ///< index: degree (devices)
  uint64_t guided_steps = 0;              ///< steps of guided requests
  uint64_t split_steps = 0;               ///< of those, run with the halves split
  uint64_t short_of_plan_steps = 0;       ///< steps run on fewer devices than planned
};

/// Runs the trace to completion (requests in any order). Errors: options out of range
/// (devices < 1, heads < 1, a fixed degree that does not divide the heads or exceeds the
/// devices, an odd one with fixed_split_guidance, a round length not positive), a request
/// with tokens < 1, steps < 1 or a non-finite arrival or deadline, a guided request without a
/// guided step function, or a step time that is not positive and finite.
Result<SpSimReport> simulate_sequence_parallel(std::span<const SpSimRequest> trace,
                                               const StepMsFunction& step_ms,
                                               const GuidedStepMsFunction& guided_step_ms,
                                               const SpSimOptions& options);

/// simulate_sequence_parallel without a guided step function: for traces of no guided request.
Result<SpSimReport> simulate_sequence_parallel(std::span<const SpSimRequest> trace,
                                               const StepMsFunction& step_ms,
                                               const SpSimOptions& options);

}  // namespace infill
