#pragma once
/// The workers of an engine's devices running one whole-sequence forward together (issue 41):
/// a prepare run's step in Ulysses sequence parallel over several devices
/// (model/flux2_sequence_parallel.h). One rank per device, each wired to the step loop of its
/// device's first worker; process groups (model/device_group.h: Gloo on CPUs, NCCL on GPUs)
/// for every aligned run of ranks whose size divides the device count (for 8 devices: 4 of 2,
/// 2 of 4, 1 of 8), made once at start.
///
/// A worker about to run a step of a whole sequence asks for a lease: the largest aligned
/// group containing its rank whose size divides the model's heads and whose other ranks are
/// idle (no request of their own) and not in another lease: TetriServe's grant of idle devices
/// to running requests, per step. The leased ranks run their shares at once, each on its own
/// step loop (a task posted to it, run at its next step boundary), the leader's on its own
/// thread. No two leases share a rank, and a rank in a lease leads none, so leaders never wait
/// on each other. A failed or timed-out collective fails that step and takes the team out of
/// use: every later step runs on its own device.
///
/// Not yet: the round planner's degrees (round_planner.h) decide leases; today a step takes
/// every idle device it can.
/// Threading: every method is safe from any thread.

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "common/status.h"
#include "model/device_group.h"

namespace infill {

class EditModel;  // pipeline/edit_model.h

class DeviceTeam {
 public:
  /// Posts `task` to a rank's step loop, to run at its next step boundary.
  using Post = std::function<void(std::function<void()> task)>;
  /// Whether a rank's worker holds no request now.
  using Idle = std::function<bool()>;

  /// The team of `devices` (at least 2, all CPUs or all GPUs); errors as DeviceGroup::create.
  static Result<std::shared_ptr<DeviceTeam>> create(const std::vector<ComputeDevice>& devices,
                                                    DeviceGroupOptions options = {});
  int size() const { return size_; }
  /// Wires `rank` to its worker, whose step loop computes on the rank's device with `models`
  /// (the engine's models as loaded there, in the runtime's order); ranks not attached are
  /// never leased.
  void attach(int rank, Post post, Idle idle, std::vector<std::shared_ptr<const EditModel>> models);
  /// Model `slot` as loaded on `rank`'s device (null when not attached).
  std::shared_ptr<const EditModel> model(int rank, size_t slot) const;
  /// Unwires `rank` (its worker stops): it is leased no more.
  void detach(int rank);

  /// Ranks working on one step, released when destroyed.
  class Lease {
   public:
    ~Lease();
    Lease(Lease&&) = delete;
    int leader() const { return leader_; }
    int first() const { return first_; }
    int size() const { return size_; }

   private:
    friend class DeviceTeam;
    Lease(DeviceTeam& team, int leader, int first, int size) : team_(team), leader_(leader), first_(first), size_(size) {}
    DeviceTeam& team_;
    int leader_, first_, size_;
  };
  /// A lease for a step of rank `leader` whose model has `heads` attention heads, or null
  /// when no group of 2 or more ranks is free (the step then runs on the leader alone).
  std::unique_ptr<Lease> lease(int leader, int heads);

  /// Runs `share(member, rank)` on every rank of `lease` at once (each on its own step loop,
  /// the leader's on this thread) and waits for all; the first error, naming its rank.
  Status run(const Lease& lease, const std::function<void(SequenceGroup& member, int rank)>& share);

  /// Ok while the team is in use; else why it was taken out of use.
  Status health() const;

 private:
  DeviceTeam() = default;
  struct Rank {
    Post post;
    Idle idle;
    std::vector<std::shared_ptr<const EditModel>> models;
    bool engaged = false;
  };
  // The group of ranks [first, first + size): its members by rank - first.
  struct Group {
    int first = 0, size = 0;
    std::vector<std::unique_ptr<DeviceGroup>> members;
  };
  void release(const Lease& lease);

  int size_ = 0;
  std::vector<Group> groups_;  // largest first
  mutable std::mutex mu_;      // guards ranks_ and failure_; never held while computing
  std::vector<Rank> ranks_;
  std::string failure_;
};

}  // namespace infill
