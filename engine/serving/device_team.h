#pragma once
/// The workers of an engine's devices running one whole-sequence forward together (issue 41):
/// a prepare run's step in Ulysses sequence parallel over several devices
/// (model/flux2_sequence_parallel.h). One rank per device, each wired to the step loop of its
/// device's first worker; process groups (model/device_group.h: Gloo on CPUs, NCCL on GPUs)
/// for every aligned run of ranks whose size divides the device count (for 8 devices: 4 of 2,
/// 2 of 4, 1 of 8), made once at start.
///
/// A worker about to run a step that could use several devices (a prepare step, a full
/// recompute, a masked step of a large mask, a guided step whose halves may split) asks for a lease, describing the request
/// (TeamAsk: tokens, steps left, deadline, heads, predicted step). The team's planner
/// (team_planner.h) decides: TetriServe's round planner over every rank's whole-sequence
/// work, each request bound to its own rank, ranks serving masked edits left out, idle ranks
/// granted earliest deadline first where a higher degree is predicted faster, and a guided
/// step's halves split over two ranks where that pays. A lease holds the planned ranks, any
/// of them (not only aligned runs): a process group for a set of ranks is made the first time
/// a lease names it and kept. The leased ranks run their shares at once, each on its own step
/// loop (a task posted to it, run at its next step boundary), the leader's on its own thread;
/// the step's measured time corrects the planner's later predictions of its mode. No two
/// leases share a rank, and a rank in a lease leads none, so leaders never wait on each
/// other. A failed or timed-out collective fails that step and takes the team out of use:
/// every later step runs on its own device.
/// Threading: every method is safe from any thread.

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "common/status.h"
#include "model/device_group.h"
#include "serving/team_planner.h"

namespace infill {

class EditModel;  // pipeline/edit_model.h

class DeviceTeam {
 public:
  /// Posts `task` to a rank's step loop, to run at its next step boundary.
  using Post = std::function<void(std::function<void()> task)>;
  /// Whether a rank's worker holds no request now.
  using Idle = std::function<bool()>;
  /// Ends the holds of a rank's worker at once (it asks again at its next step boundary).
  using Wake = std::function<void()>;

  /// The team of `devices` (at least 2, all CPUs or all GPUs), its groups of aligned runs made
  /// now; errors as DeviceGroup::create. `planning.ranks` is set to the devices.
  static Result<std::shared_ptr<DeviceTeam>> create(const std::vector<ComputeDevice>& devices,
                                                    DeviceGroupOptions options = {},
                                                    TeamPlannerOptions planning = {});
  int size() const { return size_; }
  /// Wires `rank` to its worker, whose step loop computes on the rank's device with `models`
  /// (the engine's models as loaded there, in the runtime's order); ranks not attached are
  /// never leased. `wake` ends a wait for ranks (TeamDecision::awaits) once they are free;
  /// without it the worker asks again when its hold ends.
  void attach(int rank, Post post, Idle idle, std::vector<std::shared_ptr<const EditModel>> models,
              Wake wake = nullptr);
  /// Model `slot` as loaded on `rank`'s device (null when not attached).
  std::shared_ptr<const EditModel> model(int rank, size_t slot) const;
  /// Unwires `rank` (its worker stops): it is leased no more.
  void detach(int rank);

  struct Group;
  /// Ranks working on one step, released when destroyed.
  class Lease {
   public:
    ~Lease();
    Lease(Lease&&) = delete;
    int leader() const { return leader_; }
    /// Ascending, the leader among them.
    const std::vector<int>& ranks() const { return decision_.ranks; }
    int size() const { return static_cast<int>(decision_.ranks.size()); }
    /// Ulysses degree of each forward (with split(): of each half's).
    int degree() const { return decision_.degree; }
    /// A guided step's halves at once: one per rank (StepSession::halves_step) at degree 1,
    /// else each in sequence parallel over half of the ranks, the prompted half's the lower
    /// (StepSession::halves_parallel_step).
    bool split() const { return decision_.split; }
    /// With split() at a degree above 1: `rank`'s member of its half's group; else null.
    SequenceGroup* half_member(int rank) const;

   private:
    friend class DeviceTeam;
    Lease(DeviceTeam& team, int leader, TeamDecision decision, Group* group)
        : team_(team), leader_(leader), decision_(std::move(decision)), group_(group) {}
    DeviceTeam& team_;
    int leader_;
    TeamDecision decision_;
    Group* group_;
    Group* halves_[2] = {nullptr, nullptr};  // split at a degree above 1: each half's group
  };
  /// A lease for rank `leader`'s next step of `ask`, as the planner decides it; null when the
  /// step runs on the leader alone (the planner says so, the team is out of use, the leader
  /// is in another's lease, or the group of the planned ranks could not be made), or when it
  /// is held. Held (TeamDecision::hold_ms; only when `hold_ms` is given, else it runs alone):
  /// the planner has the request wait this round while its rank serves another's step; `*hold_ms`
  /// says how long the worker holds the step back before asking again, and the rank counts as
  /// kYielding (given as a free one) until it asks again or withdraws (four rounds past the
  /// hold at most). A hold may
  /// instead wait for the planned ranks, still in others' steps (TeamDecision::awaits): the
  /// leader's rank stays its own, and the team wakes it (attach's `wake`) once a rank's
  /// yield or a lease's end leaves them all free.
  std::unique_ptr<Lease> lease(int leader, const TeamAsk& ask, double* hold_ms = nullptr);
  /// `leader`'s request no longer asks (it ended or runs its last step): the planner forgets it.
  void withdraw(int leader);

  /// Runs `share(member, rank)` on every rank of `lease` at once (each on its own step loop,
  /// the leader's on this thread) and waits for all; the first error, naming its rank.
  Status run(const Lease& lease, const std::function<void(SequenceGroup& member, int rank)>& share);

  /// The planner's decisions and corrections, and the groups made.
  using Metrics = DeviceTeamMetrics;
  Metrics metrics() const;

  /// The clock of TeamAsk::deadline_ms: steady milliseconds.
  static double clock_ms();

  /// Ok while the team is in use; else why it was taken out of use.
  Status health() const;

 private:
  DeviceTeam() = default;
  struct Rank {
    Post post;
    Idle idle;
    std::vector<std::shared_ptr<const EditModel>> models;
    bool engaged = false;
    // clock_ms(): its request is held back, its rank given as free, until it asks again or
    // until then (lease())
    double yielding_until_ms = 0;
    Wake wake;
    std::vector<int> awaiting;  // the ranks its held request waits for (TeamDecision::awaits)
  };
  void release(const Lease& lease);
  // The wakes of ranks whose awaited ranks are all free now (their waits cleared); called
  // under mu_, run after it.
  std::vector<Wake> wakes_due();
  // The group of `ranks` (ascending), made now if there is none; null if it cannot be.
  Group* group_of(const std::vector<int>& ranks);

  int size_ = 0;
  std::vector<ComputeDevice> devices_;
  DeviceGroupOptions group_options_;
  mutable std::mutex groups_mu_;  // guards groups_ and the group counters; held while making one
  std::map<std::vector<int>, std::unique_ptr<Group>> groups_;
  uint64_t groups_made_later_ = 0, group_failures_ = 0;
  std::string last_group_failure_;
  mutable std::mutex mu_;  // guards ranks_, planner_ and failure_; never held while computing
  std::vector<Rank> ranks_;
  std::unique_ptr<TeamPlanner> planner_;
  uint64_t wakes_ = 0;
  std::string failure_;
};

}  // namespace infill
