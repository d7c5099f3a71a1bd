#include "serving/device_team.h"

#include <algorithm>
#include <chrono>
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

// The members of one group of ranks, by rank in the group.
struct DeviceTeam::Group {
  std::vector<int> ranks;
  std::vector<std::unique_ptr<DeviceGroup>> members;
};

Result<std::shared_ptr<DeviceTeam>> DeviceTeam::create(const std::vector<ComputeDevice>& devices,
                                                       DeviceGroupOptions options, TeamPlannerOptions planning) {
  if (devices.size() < 2) return invalid_argument("a device team needs at least 2 devices");
  std::shared_ptr<DeviceTeam> team(new DeviceTeam());
  team->size_ = static_cast<int>(devices.size());
  team->devices_ = devices;
  team->group_options_ = options;
  team->ranks_.resize(devices.size());
  planning.ranks = team->size_;
  team->planner_ = std::make_unique<TeamPlanner>(planning);
  // The aligned runs at start (the backend's errors show here, before any request); groups of
  // other sets of ranks when a lease first names them.
  for (int size = team->size_; size >= 2; --size) {
    if (team->size_ % size != 0) continue;
    for (int first = 0; first < team->size_; first += size) {
      auto g = std::make_unique<Group>();
      for (int r = first; r < first + size; ++r) g->ranks.push_back(r);
      auto members = DeviceGroup::create(std::vector<ComputeDevice>(devices.begin() + first, devices.begin() + first + size), options);
      if (!members.ok()) return members.status();
      g->members = std::move(*members);
      team->groups_.emplace(g->ranks, std::move(g));
    }
  }
  return team;
}

DeviceTeam::Group* DeviceTeam::group_of(const std::vector<int>& ranks) {
  std::lock_guard lock(groups_mu_);
  const auto found = groups_.find(ranks);
  if (found != groups_.end()) return found->second.get();
  std::vector<ComputeDevice> devices;
  for (int r : ranks) devices.push_back(devices_.at(static_cast<size_t>(r)));
  auto members = DeviceGroup::create(devices, group_options_);
  if (!members.ok()) {
    group_failures_ += 1;
    last_group_failure_ = members.status().message();
    return nullptr;
  }
  auto g = std::make_unique<Group>();
  g->ranks = ranks;
  g->members = std::move(*members);
  groups_made_later_ += 1;
  return groups_.emplace(ranks, std::move(g)).first->second.get();
}

void DeviceTeam::attach(int rank, Post post, Idle idle, std::vector<std::shared_ptr<const EditModel>> models,
                        Wake wake) {
  std::lock_guard lock(mu_);
  ranks_.at(rank).post = std::move(post);
  ranks_.at(rank).idle = std::move(idle);
  ranks_.at(rank).models = std::move(models);
  ranks_.at(rank).wake = std::move(wake);
}

void DeviceTeam::detach(int rank) {
  std::lock_guard lock(mu_);
  ranks_.at(rank).post = nullptr;
  ranks_.at(rank).idle = nullptr;
  ranks_.at(rank).wake = nullptr;
  ranks_.at(rank).awaiting.clear();
  planner_->withdraw(rank);
}

std::vector<DeviceTeam::Wake> DeviceTeam::wakes_due() {
  std::vector<Wake> due;
  const double now = clock_ms();
  for (int a = 0; a < size_; ++a) {
    Rank& waiter = ranks_[static_cast<size_t>(a)];
    if (waiter.awaiting.empty()) continue;
    const bool all_free = std::all_of(waiter.awaiting.begin(), waiter.awaiting.end(), [&](int r) {
      const Rank& rank = ranks_[static_cast<size_t>(r)];
      return r == a || (rank.post && !rank.engaged && (rank.yielding_until_ms > now || (rank.idle && rank.idle())));
    });
    if (!all_free) continue;
    waiter.awaiting.clear();
    if (!waiter.wake) continue;
    due.push_back(waiter.wake);
    wakes_ += 1;
  }
  return due;
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

DeviceTeam::Metrics DeviceTeam::metrics() const {
  Metrics m;
  {
    std::lock_guard lock(mu_);
    m.planner = planner_->metrics();
    m.wakes = wakes_;
  }
  std::lock_guard lock(groups_mu_);
  m.groups = groups_.size();
  m.groups_made_later = groups_made_later_;
  m.group_failures = group_failures_;
  m.last_group_failure = last_group_failure_;
  return m;
}

DeviceTeam::Lease::~Lease() { team_.release(*this); }

SequenceGroup* DeviceTeam::Lease::half_member(int rank) const {
  for (const Group* half : halves_) {
    if (half == nullptr) continue;
    for (size_t i = 0; i < half->ranks.size(); ++i) {
      if (half->ranks[i] == rank) return half->members[i].get();
    }
  }
  return nullptr;
}

void DeviceTeam::release(const Lease& lease) {
  std::vector<Wake> wakes;
  {
    std::lock_guard lock(mu_);
    for (int r : lease.ranks()) ranks_[static_cast<size_t>(r)].engaged = false;
    wakes = wakes_due();
  }
  for (const Wake& wake : wakes) wake();
}

void DeviceTeam::withdraw(int leader) {
  std::lock_guard lock(mu_);
  if (leader < 0 || leader >= size_) return;
  planner_->withdraw(leader);
  ranks_[static_cast<size_t>(leader)].yielding_until_ms = 0;
}

std::unique_ptr<DeviceTeam::Lease> DeviceTeam::lease(int leader, const TeamAsk& ask, double* hold_ms) {
  if (hold_ms != nullptr) *hold_ms = 0;
  TeamDecision decision;
  std::vector<Wake> wakes;
  // Wakes those whose awaited ranks this ask left free (a yield), once mu_ is released.
  struct WakeAfter {
    std::vector<Wake>& wakes;
    ~WakeAfter() {
      for (const Wake& wake : wakes) wake();
    }
  } wake_after{wakes};
  {
    std::lock_guard lock(mu_);
    if (!failure_.empty() || leader < 0 || leader >= size_ || ranks_[leader].engaged || !ranks_[leader].post) return nullptr;
    ranks_[static_cast<size_t>(leader)].yielding_until_ms = 0;  // it asks: not held any more
    ranks_[static_cast<size_t>(leader)].awaiting.clear();
    const double now = clock_ms();
    std::vector<TeamRankState> states(static_cast<size_t>(size_));
    for (int r = 0; r < size_; ++r) {
      const Rank& rank = ranks_[static_cast<size_t>(r)];
      states[static_cast<size_t>(r)] = r == leader                    ? TeamRankState::kBusy
                                       : !rank.post                   ? TeamRankState::kAbsent
                                       : rank.engaged                 ? TeamRankState::kEngaged
                                       : rank.yielding_until_ms > now ? TeamRankState::kYielding
                                       : rank.idle && rank.idle()     ? TeamRankState::kFree
                                                                      : TeamRankState::kBusy;
    }
    decision = planner_->decide(leader, ask, now, states);
    if (decision.hold_ms > 0 && hold_ms != nullptr) {
      *hold_ms = decision.hold_ms;
      if (decision.awaits) {
        ranks_[static_cast<size_t>(leader)].awaiting = decision.awaited;
      } else {
        // kYielding past the hold until its worker asks again (at the step boundary after the
        // hold ends: a share it runs first delays that ask, and the rank must not look busy
        // meanwhile), but four rounds at most: a request cancelled while held asks no more.
        ranks_[static_cast<size_t>(leader)].yielding_until_ms =
            now + decision.hold_ms + 4 * planner_->metrics().round_ms;
        wakes = wakes_due();
      }
      return nullptr;
    }
    if (decision.ranks.size() <= 1) return nullptr;
    for (int r : decision.ranks) ranks_[static_cast<size_t>(r)].engaged = true;
  }
  // Engaged, so no other lease takes these ranks while their group is made (outside mu_:
  // a Gloo group connects its members, which takes a while).
  Group* group = group_of(decision.ranks);
  const bool halves = decision.split && decision.degree > 1;
  std::unique_ptr<Lease> lease(new Lease(*this, leader, decision, group));
  if (group == nullptr) return nullptr;  // released as `lease` goes: the step runs alone
  if (halves) {
    // Each half's ranks (the prompted half's the lower) run its forward over a group of their own.
    const auto middle = decision.ranks.begin() + decision.degree;
    lease->halves_[0] = group_of(std::vector<int>(decision.ranks.begin(), middle));
    lease->halves_[1] = group_of(std::vector<int>(middle, decision.ranks.end()));
    if (lease->halves_[0] == nullptr || lease->halves_[1] == nullptr) return nullptr;
  }
  return lease;
}

Status DeviceTeam::run(const Lease& lease, const std::function<void(SequenceGroup& member, int rank)>& share) {
  const Group* group = lease.group_;
  const auto t0 = std::chrono::steady_clock::now();
  const int size = static_cast<int>(group->ranks.size());
  std::vector<std::string> errors(static_cast<size_t>(size));
  std::latch done(size - 1);
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
  int leader_at = 0;
  for (int i = 0; i < size; ++i) {
    const int r = group->ranks[static_cast<size_t>(i)];
    if (r == lease.leader()) {
      leader_at = i;
      continue;
    }
    Post post;
    {
      std::lock_guard lock(mu_);
      post = ranks_[static_cast<size_t>(r)].post;
    }
    std::shared_ptr<Arrival> arrival(new Arrival{done, errors[static_cast<size_t>(i)]});
    if (!post) continue;  // counted down (as not run) when `arrival` goes
    SequenceGroup* member = group->members[static_cast<size_t>(i)].get();
    post([arrival, member, r, i, &share, &errors] {
      try {
        share(*member, r);
      } catch (...) {
        errors[static_cast<size_t>(i)] = what_of(std::current_exception());
      }
      arrival->ran = true;
    });
  }
  try {
    share(*group->members[static_cast<size_t>(leader_at)], lease.leader());
  } catch (...) {
    errors[static_cast<size_t>(leader_at)] = what_of(std::current_exception());
  }
  done.wait();
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::string names;
  for (int r : group->ranks) {
    if (!names.empty()) names += ", ";
    names += std::to_string(r);
  }
  for (int i = 0; i < size; ++i) {
    if (errors[static_cast<size_t>(i)].empty()) continue;
    const Status failed(ErrorCode::kInternal, "sequence-parallel step over ranks " + names + ": rank " +
                                                  std::to_string(group->ranks[static_cast<size_t>(i)]) + ": " +
                                                  errors[static_cast<size_t>(i)]);
    // A collective that failed leaves its group unusable (device_group.h): no more leases.
    for (const auto& m : group->members) {
      if (!m->health().ok()) {
        std::lock_guard lock(mu_);
        if (failure_.empty()) failure_ = m->health().message();
      }
    }
    return failed;
  }
  std::lock_guard lock(mu_);
  planner_->stepped(lease.decision_, ms);
  return {};
}

double DeviceTeam::clock_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace infill
