#include "serving/device_team.h"

#include <exception>
#include <latch>
#include <string>

#include <c10/util/Exception.h>

namespace infill {

namespace {

std::string what_of(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const c10::Error& error) {
    return error.what_without_backtrace();
  } catch (const std::exception& error) {
    return error.what();
  } catch (...) {
    return "unknown exception";
  }
}

}  // namespace

Result<std::shared_ptr<DeviceTeam>> DeviceTeam::create(const std::vector<ComputeDevice>& devices,
                                                       DeviceGroupOptions options) {
  if (devices.size() < 2) return invalid_argument("a device team needs at least 2 devices");
  std::shared_ptr<DeviceTeam> team(new DeviceTeam());
  team->size_ = static_cast<int>(devices.size());
  team->ranks_.resize(devices.size());
  for (int size = team->size_; size >= 2; --size) {
    if (team->size_ % size != 0) continue;
    for (int first = 0; first < team->size_; first += size) {
      Group g;
      g.first = first;
      g.size = size;
      auto members = DeviceGroup::create(std::vector<ComputeDevice>(devices.begin() + first, devices.begin() + first + size), options);
      if (!members.ok()) return members.status();
      g.members = std::move(*members);
      team->groups_.push_back(std::move(g));
    }
  }
  return team;
}

void DeviceTeam::attach(int rank, Post post, Idle idle, std::vector<std::shared_ptr<const EditModel>> models) {
  std::lock_guard lock(mu_);
  ranks_.at(rank).post = std::move(post);
  ranks_.at(rank).idle = std::move(idle);
  ranks_.at(rank).models = std::move(models);
}

void DeviceTeam::detach(int rank) {
  std::lock_guard lock(mu_);
  ranks_.at(rank).post = nullptr;
  ranks_.at(rank).idle = nullptr;
}

std::shared_ptr<const EditModel> DeviceTeam::model(int rank, size_t slot) const {
  std::lock_guard lock(mu_);
  const Rank& r = ranks_.at(rank);
  return slot < r.models.size() ? r.models[slot] : nullptr;
}

Status DeviceTeam::health() const {
  std::lock_guard lock(mu_);
  if (failure_.empty()) return {};
  return Status(ErrorCode::kUnavailable, "the device team is out of use: " + failure_);
}

DeviceTeam::Lease::~Lease() { team_.release(*this); }

void DeviceTeam::release(const Lease& lease) {
  std::lock_guard lock(mu_);
  for (int r = lease.first(); r < lease.first() + lease.size(); ++r) ranks_[r].engaged = false;
}

std::unique_ptr<DeviceTeam::Lease> DeviceTeam::lease(int leader, int heads) {
  std::lock_guard lock(mu_);
  if (!failure_.empty() || leader < 0 || leader >= size_ || ranks_[leader].engaged || !ranks_[leader].post) return nullptr;
  for (const Group& g : groups_) {
    if (leader < g.first || leader >= g.first + g.size || heads % g.size != 0) continue;
    bool free = true;
    for (int r = g.first; r < g.first + g.size && free; ++r) {
      if (r == leader) continue;
      const Rank& rank = ranks_[r];
      free = rank.post && !rank.engaged && rank.idle && rank.idle();
    }
    if (!free) continue;
    for (int r = g.first; r < g.first + g.size; ++r) ranks_[r].engaged = true;
    return std::unique_ptr<Lease>(new Lease(*this, leader, g.first, g.size));
  }
  return nullptr;
}

Status DeviceTeam::run(const Lease& lease, const std::function<void(SequenceGroup& member, int rank)>& share) {
  const Group* group = nullptr;
  for (const Group& g : groups_) {
    if (g.first == lease.first() && g.size == lease.size()) group = &g;
  }
  if (group == nullptr) return invalid_argument("device team: no group of ranks " + std::to_string(lease.first()) + " .. " +
                                                std::to_string(lease.first() + lease.size() - 1));
  std::vector<std::string> errors(group->size);
  std::latch done(group->size - 1);
  // Counts a helper's share down once: when it ran, or when its task was dropped unrun (its
  // loop stopped), so that the leader never waits for a share that will not come.
  struct Arrival {
    std::latch& done;
    std::string& error;
    bool ran = false;
    ~Arrival() {
      if (!ran) error = "its step loop stopped before running its share";
      done.count_down();
    }
  };
  for (int r = group->first; r < group->first + group->size; ++r) {
    if (r == lease.leader()) continue;
    Post post;
    {
      std::lock_guard lock(mu_);
      post = ranks_[r].post;
    }
    std::shared_ptr<Arrival> arrival(new Arrival{done, errors[r - group->first]});
    if (!post) continue;  // counted down (as not run) when `arrival` goes
    SequenceGroup* member = group->members[r - group->first].get();
    post([arrival, member, r, &share, &errors, first = group->first] {
      try {
        share(*member, r);
      } catch (...) {
        errors[r - first] = what_of(std::current_exception());
      }
      arrival->ran = true;
    });
  }
  try {
    share(*group->members[lease.leader() - group->first], lease.leader());
  } catch (...) {
    errors[lease.leader() - group->first] = what_of(std::current_exception());
  }
  done.wait();
  for (int i = 0; i < group->size; ++i) {
    if (errors[i].empty()) continue;
    const Status failed(ErrorCode::kInternal, "sequence-parallel step over ranks " + std::to_string(group->first) + " .. " +
                                                  std::to_string(group->first + group->size - 1) + ": rank " +
                                                  std::to_string(group->first + i) + ": " + errors[i]);
    // A collective that failed leaves its group unusable (device_group.h): no more leases.
    for (const auto& m : group->members) {
      if (!m->health().ok()) {
        std::lock_guard lock(mu_);
        if (failure_.empty()) failure_ = m->health().message();
      }
    }
    return failed;
  }
  return {};
}

}  // namespace infill
