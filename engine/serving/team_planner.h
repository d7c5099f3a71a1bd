#pragma once
/// What decides a device team's leases (device_team.h): the round planner (round_planner.h)
/// run over the whole-sequence work of the team's ranks. Pure C++, no libtorch.
///
/// Each rank's worker asks before a step that could run on several devices (a prepare step, a
/// full recompute, a masked step of a large mask, a guided step whose halves may split),
/// describing the request: its tokens,
/// steps left, deadline, heads, whether guided, and its predicted step on one device. The
/// asker becomes a contender, bound to its rank (PlannerRequest::home: the worker there holds
/// its state and steps it whatever the plan says). A plan covers a round (`round_ms`): every
/// contender gets a degree and ranks by TetriServe's group knapsack, idle ranks are granted
/// earliest deadline first, and ranks that serve work of their own (masked edits) are nobody's
/// to give. An ask uses the round's plan while it holds: the round has not ended, the asker is
/// in it, and its planned ranks are free now; otherwise a new round is planned at once.
///
/// Step times per contender: SequenceParallelCostModel's formulas (its header) with the
/// asker's single-device prediction split into a part that does not shrink with the degree
/// (`fixed_ms`, the cost model's intercept) and one that does, and all-to-alls over the
/// team's link (`TeamLink`). Measured parallel steps correct them: per (degree, split) the
/// ratio of measured to predicted time, a moving average, multiplies later predictions, so a
/// link slower than assumed (Gloo over loopback, two "devices" sharing the same cores) turns
/// the planner back to fewer devices.
///
/// A split step runs each half on one device (StepSession::halves_step), or each in sequence
/// parallel over half of its ranks (StepSession::halves_parallel_step): splits are planned up
/// to half the ranks per half (RoundPlannerOptions::max_split_degree).
///
/// A contender leaves when its rank asks for another request, when told (`withdraw`), when
/// its rank is free (its worker holds nothing), or when it has not asked for four rounds and
/// four of its steps (its request ended without a word).
///
/// Yielding (`yield`): a contender may be planned to wait a round, its rank given to another
/// request whose deadline needs it, where it can still finish alone on its own rank from the
/// next round (round_planner.h, "Homes"). Its ask is then answered with `hold_ms` (to the
/// round's end): its worker holds the step back and its rank is kYielding, which the planner
/// gives as a free one. A rank planned to yield whose worker has not asked since is still
/// kBusy until its step in flight ends. The request given it then waits for that step
/// (`awaits`, its own rank kept; `await_ranks`) where the step's predicted end plus its planned
/// step ends sooner than a step on what is free now, else runs short of its plan
/// (`short_of_plan`). The same holds for a planned rank still in another's lease.
///
/// Threading: not thread-safe; the team calls it under its lock.

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "serving/round_planner.h"

namespace infill {

/// One step's request, as a rank's worker describes it to the team.
struct TeamAsk {
  uint64_t id = 0;        ///< the request; unique among the ranks' asks
  int64_t tokens = 0;     ///< rows of its sequence (one half's when guided)
  int steps_left = 1;     ///< steps not yet run, this one included
  double deadline_ms = std::numeric_limits<double>::infinity();  ///< absolute, the team's clock
  int heads = 0;          ///< attention heads when its step may run in sequence parallel, else 0
  bool guided = false;    ///< two forwards a step, conditional and unconditional
  bool may_split = false; ///< guided: its halves may run one per device
  double single_ms = 0;   ///< predicted step on one device (guided: both halves packed)
  double fixed_ms = 0;    ///< the part of single_ms that does not shrink with the degree
  int64_t hidden = 0;     ///< elements per row an all-to-all moves
  int attention_layers = 0;       ///< Ulysses runs 4 all-to-alls per attention layer
  int64_t prediction_channels = 0;  ///< floats per row a split step's halves exchange
};

/// How a team's ranks reach each other, for the all-to-all part of a step's prediction.
struct TeamLink {
  double all_to_all_latency_ms = 0.02;
  double link_bytes_per_ms = 2e8;  ///< 200 GB/s: NVLink (sequence_parallel_cost_model.h)
  double bytes_per_element = 2;    ///< bf16

  /// Gloo over loopback TCP on one host: a guess (0.2 ms, 1 GB/s, float32) that measured
  /// steps correct.
  static TeamLink loopback();
};

struct TeamPlannerOptions {
  int ranks = 2;
  double round_ms = 50;
  TeamLink link;
  /// Correct predictions from measured parallel steps (off: the link's figures alone, for
  /// tests that need the same decision at every step).
  bool learn = true;
  /// A contender may wait a round while its rank serves another's step (it yields:
  /// RoundPlannerOptions::homes_may_wait), where it can still finish alone on its rank from
  /// the next round; false, every contender steps at every ask.
  bool yield = true;
  /// An ask whose planned ranks are still in others' steps waits for them (TeamDecision::awaits)
  /// where their predicted end plus the planned step ends sooner than a step on the ranks free
  /// now; false, it always steps on what is free (`short_of_plan`).
  bool await_ranks = true;
};

/// What a rank is doing when another asks.
enum class TeamRankState {
  kFree,     ///< attached, holds no request, in no lease: the planner may give it
  kBusy,     ///< holds requests of its own (a contender, or masked edits)
  kEngaged,  ///< in a lease now (a step in flight)
  kAbsent,   ///< not attached (its worker stopped)
  /// Holds a contender the planner told to wait this round (TeamDecision::hold_ms): its
  /// worker holds the step back, so the planner may give the rank as if it were free.
  kYielding,
};

/// The planner's answer to one ask.
struct TeamDecision {
  int degree = 1;          ///< Ulysses degree of each forward (split: of each half's)
  bool split = false;      ///< guided: the halves at once, each on `degree` of the ranks
  std::vector<int> ranks;  ///< ascending, the asker among them; one rank: run alone
  double predicted_ms = 0; ///< the step's predicted time so (its correction included)
  double correction = 1;   ///< the measured-over-predicted factor in predicted_ms
  bool new_round = false;  ///< this ask planned a new round
  /// > 0: the plan has the asker's request wait this round (its rank serves another's step):
  /// hold the step back this long, then ask again. `ranks` is the asker alone then, unused.
  double hold_ms = 0;
  /// With hold_ms: not a yield but a wait for `awaited` (the planned ranks), some of which are
  /// still in others' steps predicted to end within hold_ms. The asker's rank is not given away
  /// meanwhile; the team wakes the asker as soon as they are free (device_team.h).
  bool awaits = false;
  std::vector<int> awaited;
};

struct TeamPlannerMetrics {
  double round_ms = 0;         ///< the planner's round (TeamPlannerOptions::round_ms)
  TeamLink link;               ///< the link its predictions assume (TeamPlannerOptions::link)
  uint64_t rounds = 0;         ///< plans made
  uint64_t decisions = 0;      ///< asks answered
  uint64_t alone = 0;          ///< answered with the asker alone
  uint64_t split = 0;          ///< answered with the halves split
  uint64_t short_of_plan = 0;  ///< answered with fewer ranks than planned (some busy by then)
  uint64_t held = 0;           ///< answered with a hold: the asker's request waits the round
  uint64_t awaited = 0;        ///< answered with a wait for planned ranks still in others' steps
  std::map<int, uint64_t> by_degree;  ///< answered Ulysses degree -> count (split: each half's)
  /// Measured over predicted parallel steps, per "d<degree>", "split" (halves one per rank) or
  /// "split_d<degree>" (each half over `degree` ranks): the correction.
  std::map<std::string, double> correction;
  std::string last_error;      ///< the last plan the round planner refused (then: alone)
};

/// A device team's planner and process groups (device_team.h), for /metrics.
struct DeviceTeamMetrics {
  TeamPlannerMetrics planner;
  /// The share of the image a mask must cover for its masked steps to ask the team
  /// (WorkerOptions::team_masked_share), as the runtime set it.
  double masked_share = 0;
  /// Waits for planned ranks (TeamDecision::awaits) the team ended before their hold, the
  /// ranks having come free (a yield, a lease's end).
  uint64_t wakes = 0;
  uint64_t groups = 0;             ///< process groups in use (aligned ones included)
  uint64_t groups_made_later = 0;  ///< made when a lease first named their ranks
  uint64_t group_failures = 0;     ///< groups that could not be made (the step ran alone)
  std::string last_group_failure;
};

class TeamPlanner {
 public:
  explicit TeamPlanner(TeamPlannerOptions options);

  /// The ranks for `rank`'s next step of `ask`, given every rank's state now (`states`,
  /// one per rank; `rank`'s own is ignored). Never fails: an ask the planner refuses runs
  /// alone (metrics().last_error says why).
  TeamDecision decide(int rank, const TeamAsk& ask, double now_ms, std::span<const TeamRankState> states);
  /// A step run as `decision` took `measured_ms`: corrects later predictions of its mode.
  void stepped(const TeamDecision& decision, double measured_ms);
  /// `rank`'s contender is gone (its request ended or left the rank).
  void withdraw(int rank);

  const TeamPlannerMetrics& metrics() const { return metrics_; }
  /// The step time the planner uses for `ask` at `degree` (split: halves on 2 x degree).
  double predict_ms(const TeamAsk& ask, int degree, bool split) const;

 private:
  struct Contender {
    TeamAsk ask;
    std::vector<int> ranks;  // its last decision's ranks
    bool split = false;      // and whether they ran its halves split
    double ready_ms = 0;     // when its step in flight ends (predicted)
    double asked_ms = 0;     // its last ask
  };
  static std::string mode_key(int degree, bool split);
  double correction(int degree, bool split) const;
  std::optional<RoundPlan> plan(double now_ms, std::span<const TeamRankState> states);
  // When every rank of `planned` is free for `asker` by the predicted end of the steps that
  // hold them now; infinity when some rank's end is not known.
  double planned_ranks_free_at(const PlannedRequest& planned, int asker, double now_ms,
                               std::span<const TeamRankState> states) const;

  TeamPlannerOptions options_;
  std::map<int, Contender> contenders_;  // by rank
  std::optional<RoundPlan> plan_;
  std::map<uint64_t, int> plan_index_;   // request id -> its place in plan_
  double round_start_ms_ = -std::numeric_limits<double>::infinity();
  TeamPlannerMetrics metrics_;
};

}  // namespace infill
