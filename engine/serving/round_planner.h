#pragma once
/// TetriServe's round-based planner of sequence-parallel degrees: at the start of each round,
/// for every active whole-sequence request (a prepare run, a full step's request), a degree
/// of Ulysses sequence parallelism and the devices to run it on. Pure C++, no libtorch.
///
/// Degrees. Ulysses splits the attention heads over the devices, so a degree must divide the
/// model's heads: the allowed degrees are the divisors of `heads` up to the device count (and
/// `max_degree`); klein's 24 heads on 8 devices give {1, 2, 3, 4, 6, 8}. 0 means the request
/// waits this round.
///
/// Guidance placement (Katz's latent parallelism; issue 41 item 4). A guided request (a base
/// model under classifier-free guidance: every step is two forwards of its sequence, the
/// conditional and the unconditional half) runs in one of two modes at Ulysses degree d:
///   - packed: both halves in one forward of twice the rows on d devices;
///   - split: each half on its own d devices at once (2 d devices), predictions then combined.
/// Its step times come from a GuidedStepMsFunction (sequence_parallel_cost_model.h states the
/// cost model's formulas). Its options are every (d, packed) and, when split_guidance is on,
/// every (d, split) with 2 d <= devices; a mode's weight in the knapsack is its devices (d or
/// 2 d) and its GPU time devices x steps_left x step. So the planner splits where two devices
/// are free and the deadline needs them, and packs on one otherwise (or when packing is
/// cheaper and still on time). A non-guided request has one mode per degree, d devices, as
/// before. Below, "degree" of an option means its mode: its devices and step time.
///
/// Packing: a group knapsack solved exactly by dynamic programming over (request, degree)
/// options, each request a group (one option is taken from each), the capacity the devices,
/// an option's weight its degree. With s(d) the predicted step time at degree d, `start` the
/// later of now and the end of the request's step in flight (ready_ms), and the request's
/// `steps_left` steps:
///   - degree d > 0: finish(d) = start + steps_left * s(d), the request running at d from now
///     on. value = 1 if finish(d) <= deadline, else 0. GPU time = d * steps_left * s(d).
///   - wait (0 devices): let d* be the degree of least GPU time among those on time now.
///     value = 1 if d* exists and, starting at the next round (now + round_ms, or later if
///     its step in flight ends later), d* still finishes by the deadline; GPU time = that of
///     d*. Else value = 0 and GPU time = the least d * steps_left * s(d) of all degrees.
///     Waiting counts as on time only when it does not push the request to a costlier degree:
///     counting it on time whenever the largest degree could still save it later (tried
///     first) let many requests wait for the same devices and miss together (uniform mix,
///     8 devices, 90% load: 3 points less attainment).
/// A request with no steps left (its last step in flight) only waits: value 1 if that step
/// ends by its deadline, GPU time 0. A request whose step in flight ends at or after the
/// round's end (ready_ms >= now + round_ms) on devices it holds is pinned: its devices are
/// busy through the round anyway, so its one option is its degree, from ready_ms, on its
/// devices (no grant either).
/// The waiting option is the urgency weighting: a request that can wait a round and still
/// make its deadline scores its 1 while waiting, so devices go first to those that cannot.
/// Plans are compared by (1) the sum of values (requests predicted on time: SLO attainment),
/// higher first; (2) the sum of GPU times, lower first (TetriServe's GPU-hour minimisation:
/// a request runs at the least degree that makes its deadline); (3) devices used, more first
/// (among otherwise equal plans, run now rather than wait: a request that waits gains
/// nothing when devices are free). Every criterion is a sum over requests, so the DP is exact.
///
/// Idle devices: devices the packing leaves free are granted one allowed degree at a time
/// (a running request's degree to the next allowed one, a waiting request's to the least),
/// earliest deadline first, to requests whose next degree fits in what is left and is
/// predicted faster than their current one, until no grant fits. For a guided request the
/// ladder is its modes by device count, the fastest at each count (1 device packed, 2 devices
/// split at 1 or packed at 2, whichever is faster, ...).
///
/// Placement (by device count: a split request's 2 d devices are one set, its first d run one
/// half and the rest the other): a request whose degree is unchanged keeps its devices (never moved
/// when nothing is gained); one whose degree shrinks keeps a contiguous part of its devices where
/// it can; one that grows keeps its devices and adds free ones, preferring a contiguous window
/// around them; new requests take the smallest run of contiguous free devices that fits (best fit),
/// else the lowest free indices. Larger degrees are placed first.
///
/// Homes (an engine's workers: serving/team_planner.h). A request may be bound to one device,
/// its home: the worker there holds its state and steps it whatever the plan says. Such a
/// request never waits while it has steps left (its options are its modes only, at least its
/// home), its devices always include its home (an empty placement counts as holding {home}; a
/// shrink keeps a contiguous part around it), and no other request is given its home while it
/// runs. With `homes_may_wait` it may wait a round (it yields: its worker defers its step and
/// its home may go to another request), but that wait counts as on time only if its home alone
/// (degree 1, from the next round) still makes the deadline: its home is all it can count on
/// when it resumes. Valuing its wait as any other's (on time if its cheapest on-time degree
/// still is from the next round) let bound requests yield into misses under load (simulator,
/// uniform mix, load 0.9: 4 points less attainment than never yielding); so valued, yielding
/// gains 1 to 14 points where deadlines are the requests' fastest latency times 1.0 to 1.5,
/// and with deadlines at their single-device latency stays within 0.4 points or gains up to 3.5
/// (bench_multi_device's simulator: round_planner_bound against _never_yield).
/// Devices in `unavailable` (busy with work the planner does not plan, such as masked edits)
/// are given to no request: the knapsack's capacity is the devices less those.
///
/// Not modelled: a device whose holder's step in flight ends within the round is free only
/// when that step ends; the plan may hand it to another request, which then starts up to a
/// round late.
///
/// Threading: a pure function; runs on the calling thread.

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"
#include "serving/sequence_parallel_cost_model.h"

namespace infill {

/// One active request at the round's start.
struct PlannerRequest {
  uint64_t id = 0;
  int64_t tokens = 0;      ///< tokens of its whole sequence (what the step function takes)
  int steps_left = 0;      ///< steps not yet started
  double deadline_ms = 0;  ///< absolute, on the clock of now_ms
  /// The device indices it held last round; empty when it held none.
  std::vector<int> placement;
  /// When its step in flight ends (absolute); at or before now_ms when none is in flight.
  double ready_ms = 0;
  /// Classifier-free guided: every step is two forwards of the sequence (see "Guidance
  /// placement"); its step times come from the GuidedStepMsFunction.
  bool guided = false;
  /// Guided only: its placement runs the halves split (two groups of placement.size() / 2);
  /// false, packed. Read for a pinned request (its step in flight).
  bool split = false;
  /// The device it is bound to, or -1 (see "Homes").
  int home = -1;
  /// Its model's attention heads, in place of the options' (requests of several models); 0:
  /// the options'. Its degrees divide them.
  int heads = 0;
  /// Guided only: whether it may run its halves split at all (a step that cannot: false).
  bool may_split = true;
  /// Its own step times, in place of plan_round's functions (requests of several models, each
  /// priced by its own); unset: plan_round's.
  StepMsFunction step_ms{};
  GuidedStepMsFunction guided_step_ms{};
};

struct RoundPlannerOptions {
  int devices = 1;      ///< devices to plan, indices 0 .. devices - 1
  double round_ms = 0;  ///< length of a round (> 0): when a waiting request can start next
  int heads = 24;       ///< attention heads of the model: degrees must divide them
  int max_degree = 0;   ///< 0 = no limit beyond the devices
  bool grant_idle_devices = true;
  /// Guided requests may run their halves split over two device groups; false: always
  /// packed (a pinned split request keeps its mode).
  bool split_guidance = true;
  /// Split modes only up to this Ulysses degree per half (0 = no limit): an engine whose split
  /// step runs each half on one device says 1.
  int max_split_degree = 0;
  /// Devices given to no request this round (see "Homes").
  std::vector<int> unavailable;
  /// A request with a home may wait a round like any other, its home then free for others
  /// (see "Homes"); false, it never waits.
  bool homes_may_wait = false;
};

struct PlannedRequest {
  uint64_t id = 0;
  int degree = 0;  ///< Ulysses degree of each forward (a divisor of the heads); 0 = waits
  /// Ascending: `degree` of them, or 2 x degree when split (the first `degree` run one half,
  /// the rest the other).
  std::vector<int> devices;
  int steps = 0;  ///< steps it starts this round at that degree
  /// The packing's prediction: on time (counted in RoundPlan::predicted_on_time).
  bool on_time = false;
  /// Predicted finish if it keeps its degree (infinity while it waits).
  double finish_ms = 0;
  bool moved = false;  ///< its devices differ from a non-empty placement
  bool split = false;  ///< guided only: the halves on two groups of `degree` devices
  /// Devices it runs on this round: 2 x degree when split, else degree.
  int device_count() const { return split ? 2 * degree : degree; }
};

struct RoundPlan {
  std::vector<PlannedRequest> requests;  ///< in the order of the input
  int predicted_on_time = 0;  ///< the packing's value: requests predicted to meet their deadline
  double packing_gpu_ms = 0;  ///< the packing's GPU time (before idle devices are granted)
  int devices_used = 0;       ///< after grants
  int devices_granted = 0;    ///< devices added by grants
};

/// Divisors of `heads` no larger than min(devices, max_degree) (max_degree 0 = no limit),
/// ascending. Empty when heads or devices is not positive.
std::vector<int> allowed_degrees(int heads, int devices, int max_degree = 0);

/// Plans one round. `step_ms(tokens, d)` is called for every allowed d of every request that
/// is not guided; `guided_step_ms(tokens, d, false)` for every allowed d and
/// `guided_step_ms(tokens, d, true)` for every allowed d with 2 d <= the available devices (and
/// d <= max_split_degree) of every guided one (a request's own functions in their place where it has them). Errors: options out of
/// range (devices or heads < 1, round_ms not positive, an unavailable device out of range or
/// listed twice); a request with tokens < 1 or steps_left < 0, a duplicate id, a placement
/// naming a device outside 0 .. devices - 1, twice, one another request also holds or an
/// unavailable one; a home out of range, unavailable, another request's home or held by
/// another, or missing from the request's own placement; a pinned request holding a number of
/// devices that is not an allowed degree (twice one when split); `split` on a request that is
/// not guided; a guided request without a guided step function; a step time that is not
/// positive and finite (the message names the request, tokens and degree).
Result<RoundPlan> plan_round(std::span<const PlannerRequest> requests, double now_ms,
                             const StepMsFunction& step_ms,
                             const GuidedStepMsFunction& guided_step_ms,
                             const RoundPlannerOptions& options);

/// plan_round without a guided step function: for requests none of which is guided.
Result<RoundPlan> plan_round(std::span<const PlannerRequest> requests, double now_ms,
                             const StepMsFunction& step_ms, const RoundPlannerOptions& options);

}  // namespace infill
