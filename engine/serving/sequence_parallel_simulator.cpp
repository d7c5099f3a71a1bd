#include "serving/sequence_parallel_simulator.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <functional>
#include <limits>
#include <numeric>
#include <queue>
#include <string>

#include "serving/round_planner.h"

namespace infill {
namespace {

enum class Ev { kStepEnd = 0, kArrive = 1, kRound = 2 };  // at one instant: step ends first

struct Event {
  double t;
  Ev kind;
  size_t who;  // request index (kRound: the round's generation, or kArrivalRound)
  uint64_t seq;
  bool operator>(const Event& o) const {
    if (t != o.t) return t > o.t;
    if (kind != o.kind) return static_cast<int>(kind) > static_cast<int>(o.kind);
    return seq > o.seq;
  }
};
using EventQueue = std::priority_queue<Event, std::vector<Event>, std::greater<>>;

// A round started by an arrival (plan_on_arrival): it always runs. A round scheduled by the
// round before carries that round's generation and is dropped when another round ran since.
constexpr size_t kArrivalRound = std::numeric_limits<size_t>::max();

// Per request, while it runs.
struct Live {
  double deadline = 0;  // absolute
  int steps_left = 0;   // not yet started
  bool arrived = false;
  bool in_step = false;
  bool done = false;
  double step_end = 0;
  std::vector<int> held;      // devices it holds now
  std::vector<int> target;    // devices of its plan (empty: it waits)
  bool target_split = false;  // guided: its plan splits the halves over two groups
  std::vector<int> last_devices;
  int last_degree = 0;
  bool last_split = false;
  double finish = 0;
  int home = -1;  // bind_to_home: the device it is bound to
  // statistics
  double degree_sum = 0;
  int steps_run = 0;
  int max_degree = 0;
  int degree_changes = 0;
  int moves = 0;
  int split_steps = 0;
};

Status check(std::span<const SpSimRequest> trace, const SpSimOptions& o,
             const GuidedStepMsFunction& guided_step_ms) {
  if (o.devices < 1)
    return invalid_argument("sequence-parallel simulation: devices is " +
                            std::to_string(o.devices) + ", expected >= 1");
  if (o.heads < 1)
    return invalid_argument("sequence-parallel simulation: heads is " + std::to_string(o.heads) +
                            ", expected >= 1");
  if (o.busy_devices != SpBusyDevices::kWait && o.busy_devices != SpBusyDevices::kShortOfPlan &&
      o.busy_devices != SpBusyDevices::kWaitWhenSooner)
    return invalid_argument("sequence-parallel simulation: busy_devices is " +
                            std::to_string(static_cast<int>(o.busy_devices)) + ", expected 1, 2 or 3");
  if (o.policy == SpPolicy::kFixedDegree) {
    if (o.fixed_degree < 1 || o.fixed_degree > o.devices || o.heads % o.fixed_degree != 0) {
      return invalid_argument("sequence-parallel simulation: fixed_degree is " +
                              std::to_string(o.fixed_degree) + ", expected a divisor of the " +
                              std::to_string(o.heads) + " heads from 1 to the " +
                              std::to_string(o.devices) + " devices");
    }
    if (o.fixed_split_guidance && o.fixed_degree % 2 != 0) {
      return invalid_argument("sequence-parallel simulation: fixed_degree is " +
                              std::to_string(o.fixed_degree) +
                              " with fixed_split_guidance, expected an even degree (two halves)");
    }
  } else if (o.policy == SpPolicy::kRoundPlanner) {
    if (o.round_steps < 0) {
      return invalid_argument("sequence-parallel simulation: round_steps is " +
                              std::to_string(o.round_steps) + ", expected >= 0");
    }
    if (o.round_steps == 0 && (!(o.round_ms > 0) || !std::isfinite(o.round_ms))) {
      return invalid_argument("sequence-parallel simulation: round_ms is " +
                              std::to_string(o.round_ms) + ", expected > 0");
    }
  } else {
    return invalid_argument("sequence-parallel simulation: unknown policy " +
                            std::to_string(static_cast<int>(o.policy)));
  }
  for (const SpSimRequest& r : trace) {
    const std::string who = "sequence-parallel simulation: request " + std::to_string(r.id);
    if (r.tokens < 1)
      return invalid_argument(who + " has " + std::to_string(r.tokens) + " tokens, expected >= 1");
    if (r.steps < 1)
      return invalid_argument(who + " has " + std::to_string(r.steps) + " steps, expected >= 1");
    if (!std::isfinite(r.arrival_ms) || !std::isfinite(r.deadline_ms)) {
      return invalid_argument(who + " has a non-finite arrival or deadline");
    }
    if (r.guided && !guided_step_ms)
      return invalid_argument(who + " is guided, expected a guided step function");
  }
  return Status::success();
}

// Met within a relative 1e-9: a deadline of exactly steps x step time must count as met
// although the simulated clock sums the steps one by one.
bool met(double latency_ms, double deadline_ms) {
  return latency_ms <= deadline_ms + 1e-9 * std::abs(deadline_ms);
}

// The step functions of a run: a step of `r` on `devices` devices, a guided request's halves
// split over two groups of devices / 2 or packed on all of them.
struct StepTimes {
  const StepMsFunction& step_ms;
  const GuidedStepMsFunction& guided_step_ms;

  double operator()(const SpSimRequest& r, int devices, bool split) const {
    if (!r.guided) return step_ms(r.tokens, devices);
    return guided_step_ms(r.tokens, split ? devices / 2 : devices, split);
  }
};

Status bad_step(const SpSimRequest& r, int devices, bool split, double ms) {
  const int degree = split ? devices / 2 : devices;
  return invalid_argument(
      "sequence-parallel simulation: the step time of request " + std::to_string(r.id) + " (" +
      std::to_string(r.tokens) + " tokens" +
      (r.guided ? (split ? ", guided, halves split" : ", guided, halves packed") : "") +
      ") at degree " + std::to_string(degree) + " is " + std::to_string(ms) +
      ", expected a positive finite value");
}

class FixedDegreeSim {
 public:
  FixedDegreeSim(std::span<const SpSimRequest> trace, const StepTimes& step, const SpSimOptions& o)
      : trace_(trace), step_(step), o_(o) {}

  Result<SpSimReport> run() {
    const size_t n = trace_.size();
    const int degree = o_.fixed_degree;
    SpSimReport report;
    report.requests.resize(n);
    report.steps_by_degree.assign(static_cast<size_t>(o_.devices) + 1, 0);
    std::vector<bool> group_busy(static_cast<size_t>(o_.devices / degree), false);
    std::vector<int> group_of(n, -1);
    std::deque<size_t> queue;
    EventQueue events;
    uint64_t seq = 0;
    double first = std::numeric_limits<double>::infinity(), last = 0;
    for (size_t i = 0; i < n; ++i) {
      events.push({trace_[i].arrival_ms, Ev::kArrive, i, seq++});
      first = std::min(first, trace_[i].arrival_ms);
    }
    const auto start = [&](size_t i, size_t g, double now) -> Status {
      const SpSimRequest& r = trace_[i];
      const bool split = r.guided && o_.fixed_split_guidance;
      const double s = step_(r, degree, split);
      if (!std::isfinite(s) || s <= 0) return bad_step(r, degree, split, s);
      if (r.guided) report.guided_steps += static_cast<uint64_t>(r.steps);
      if (split) {
        report.split_steps += static_cast<uint64_t>(r.steps);
        report.requests[i].split_steps = r.steps;
      }
      group_busy[g] = true;
      group_of[i] = static_cast<int>(g);
      const double run = double(r.steps) * s;
      report.busy_device_ms += double(degree) * run;
      report.steps_by_degree[static_cast<size_t>(degree)] += static_cast<uint64_t>(r.steps);
      events.push({now + run, Ev::kStepEnd, i, seq++});
      return Status::success();
    };
    while (!events.empty()) {
      const Event e = events.top();
      events.pop();
      if (e.kind == Ev::kArrive) {
        const auto g = std::find(group_busy.begin(), group_busy.end(), false);
        if (g == group_busy.end()) {
          queue.push_back(e.who);
        } else {
          INFILL_RETURN_IF_ERROR(start(e.who, static_cast<size_t>(g - group_busy.begin()), e.t));
        }
        continue;
      }
      const SpSimRequest& r = trace_[e.who];
      SpSimOutcome& out = report.requests[e.who];
      out.id = r.id;
      out.latency_ms = e.t - r.arrival_ms;
      out.deadline_met = met(out.latency_ms, r.deadline_ms);
      out.mean_degree = degree;
      out.max_degree = degree;
      last = std::max(last, e.t);
      const size_t g = static_cast<size_t>(group_of[e.who]);
      group_busy[g] = false;
      if (!queue.empty()) {
        const size_t next = queue.front();
        queue.pop_front();
        INFILL_RETURN_IF_ERROR(start(next, g, e.t));
      }
    }
    finish(report, first, last);
    return report;
  }

  static void finish(SpSimReport& report, double first, double last) {
    size_t on_time = 0;
    for (const SpSimOutcome& o : report.requests) on_time += o.deadline_met ? 1 : 0;
    report.slo_attainment =
        report.requests.empty() ? 0.0 : double(on_time) / double(report.requests.size());
    report.makespan_ms = report.requests.empty() ? 0.0 : last - first;
  }

 private:
  std::span<const SpSimRequest> trace_;
  const StepTimes& step_;
  const SpSimOptions& o_;
};

class RoundPlannerSim {
 public:
  RoundPlannerSim(std::span<const SpSimRequest> trace, const StepTimes& step, const SpSimOptions& o)
      : trace_(trace), step_(step), o_(o), holder_(static_cast<size_t>(o.devices), -1) {}

  Result<SpSimReport> run() {
    const size_t n = trace_.size();
    report_.requests.resize(n);
    report_.steps_by_degree.assign(static_cast<size_t>(o_.devices) + 1, 0);
    live_.resize(n);
    arrivals_.resize(n);
    std::iota(arrivals_.begin(), arrivals_.end(), size_t{0});
    std::stable_sort(arrivals_.begin(), arrivals_.end(), [&](size_t a, size_t b) {
      return trace_[a].arrival_ms < trace_[b].arrival_ms;
    });
    for (size_t i = 0; i < n; ++i) {
      live_[i].deadline = trace_[i].arrival_ms + trace_[i].deadline_ms;
      live_[i].steps_left = trace_[i].steps;
    }
    if (n == 0) return report_;
    const double first = trace_[arrivals_.front()].arrival_ms;
    if (o_.plan_on_arrival) {
      for (size_t i : arrivals_) events_.push({trace_[i].arrival_ms, Ev::kRound, kArrivalRound, seq_++});
    } else {
      schedule_round_for_arrival(first);
    }
    while (!events_.empty()) {
      const Event e = events_.top();
      events_.pop();
      if (e.kind == Ev::kRound) {
        if (e.who != kArrivalRound && e.who != generation_) continue;  // another round ran since
        INFILL_RETURN_IF_ERROR(round(e.t));
      } else {
        INFILL_RETURN_IF_ERROR(step_end(e.who, e.t));
      }
    }
    double last = 0;
    for (size_t i = 0; i < n; ++i) {
      const Live& l = live_[i];
      SpSimOutcome& out = report_.requests[i];
      out.id = trace_[i].id;
      out.latency_ms = l.finish - trace_[i].arrival_ms;
      out.deadline_met = met(out.latency_ms, trace_[i].deadline_ms);
      out.mean_degree = l.steps_run > 0 ? l.degree_sum / double(l.steps_run) : 0.0;
      out.max_degree = l.max_degree;
      out.degree_changes = l.degree_changes;
      out.moves = l.moves;
      out.split_steps = l.split_steps;
      last = std::max(last, l.finish);
    }
    FixedDegreeSim::finish(report_, first, last);
    return report_;
  }

 private:
  // The first round boundary at or after t: on the grid of round_ms, or t itself when rounds
  // are counted in steps.
  void schedule_round_for_arrival(double t) {
    const double at = o_.round_steps > 0 ? t : std::ceil(t / o_.round_ms) * o_.round_ms;
    events_.push({at, Ev::kRound, generation_, seq_++});
  }

  Status round(double now) {
    ++generation_;
    while (next_arrival_ < arrivals_.size() && trace_[arrivals_[next_arrival_]].arrival_ms <= now) {
      const size_t i = arrivals_[next_arrival_++];
      live_[i].arrived = true;
      if (o_.bind_to_home) live_[i].home = home_for_arrival();
      active_.push_back(i);
    }
    std::erase_if(active_, [&](size_t i) { return live_[i].done; });
    std::vector<bool> contends(live_.size(), true);
    std::vector<int> unavailable;
    if (o_.bind_to_home) choose_contenders(contends, unavailable, now);

    std::vector<PlannerRequest> requests;
    std::vector<size_t> index;
    double longest_single = 0;
    for (size_t i : active_) {
      const Live& l = live_[i];
      if (l.steps_left == 0) continue;  // its last step is in flight
      if (!contends[i]) {
        live_[i].target.clear();  // waits for its device's request in front
        if (!live_[i].in_step) release_untargeted(i);
        continue;
      }
      PlannerRequest p;
      p.id = i;
      p.tokens = trace_[i].tokens;
      p.steps_left = l.steps_left;
      p.deadline_ms = l.deadline;
      p.placement = l.target;
      p.ready_ms = l.in_step ? l.step_end : now;
      p.guided = trace_[i].guided;
      p.split = l.target_split;
      p.home = l.home;
      requests.push_back(std::move(p));
      index.push_back(i);
      longest_single = std::max(longest_single, step_(trace_[i], 1, false));
    }
    // A request that waited still has its latents on the devices it last ran on: it claims
    // them as its placement while no other request's holds them, so that resuming at the same
    // degree does not move it.
    std::vector<bool> claimed(static_cast<size_t>(o_.devices), false);
    for (const PlannerRequest& p : requests) {
      for (int d : p.placement) claimed[static_cast<size_t>(d)] = true;
    }
    if (o_.bind_to_home) {
      // A placement over another request's home is given up (its home is its own).
      for (PlannerRequest& p : requests) {
        const bool over_home = std::any_of(p.placement.begin(), p.placement.end(), [&](int d) {
          return std::find(unavailable.begin(), unavailable.end(), d) != unavailable.end() ||
                 std::any_of(requests.begin(), requests.end(),
                             [&](const PlannerRequest& q) { return q.id != p.id && q.home == d; });
        });
        if (over_home || std::find(p.placement.begin(), p.placement.end(), p.home) == p.placement.end()) {
          p.placement.clear();
          p.split = false;
          p.ready_ms = std::max(p.ready_ms, now);
        }
        if (p.placement.empty() && live_[p.id].in_step) p.ready_ms = live_[p.id].step_end;
      }
      std::fill(claimed.begin(), claimed.end(), true);  // no claims of last devices: homes instead
    }
    for (size_t k = 0; k < requests.size(); ++k) {
      const std::vector<int>& last = live_[index[k]].last_devices;
      if (!requests[k].placement.empty() || last.empty()) continue;
      if (std::any_of(last.begin(), last.end(),
                      [&](int d) { return claimed[static_cast<size_t>(d)]; }))
        continue;
      requests[k].placement = last;
      requests[k].split = live_[index[k]].last_split;
      for (int d : last) claimed[static_cast<size_t>(d)] = true;
    }
    double planned_round_ms = o_.round_ms;
    if (o_.round_steps > 0) {
      planned_round_ms =
          last_round_ms_ > 0 ? last_round_ms_ : double(o_.round_steps) * longest_single;
      if (!(planned_round_ms > 0)) planned_round_ms = 1.0;  // nothing to plan
    }
    RoundPlannerOptions po;
    po.devices = o_.devices;
    po.heads = o_.heads;
    po.round_ms = planned_round_ms;
    po.max_degree = o_.max_degree;
    po.grant_idle_devices = o_.grant_idle_devices;
    po.split_guidance = o_.split_guidance;
    po.unavailable = unavailable;
    po.homes_may_wait = o_.bound_may_yield;
    Result<RoundPlan> plan = plan_round(requests, now, step_.step_ms, step_.guided_step_ms, po);
    if (!plan.ok()) return plan.status();
    if (!requests.empty()) ++report_.rounds;

    double slowest_step = 0;
    for (size_t k = 0; k < index.size(); ++k) {
      const PlannedRequest& p = plan->requests[k];
      live_[index[k]].target = p.devices;
      live_[index[k]].target_split = p.split;
      if (p.degree > 0) {
        slowest_step = std::max(slowest_step, step_(trace_[index[k]], p.device_count(), p.split));
      }
    }
    for (size_t k = 0; k < index.size(); ++k) {
      Live& l = live_[index[k]];
      if (!l.in_step) release_untargeted(index[k]);
    }
    INFILL_RETURN_IF_ERROR(start_waiting(now));

    // The next round: while anything is active or in flight, one round on; else at the next
    // arrival's boundary.
    const bool busy =
        std::any_of(active_.begin(), active_.end(), [&](size_t i) { return !live_[i].done; });
    if (busy) {
      double next = now + o_.round_ms;
      if (o_.round_steps > 0) {
        last_round_ms_ = double(o_.round_steps) * slowest_step;
        if (last_round_ms_ <= 0) {
          // Nothing planned (only last steps in flight): re-plan when the first of them ends.
          double soonest = std::numeric_limits<double>::infinity();
          for (size_t i : active_) {
            if (live_[i].in_step) soonest = std::min(soonest, live_[i].step_end);
          }
          if (next_arrival_ < arrivals_.size())
            soonest = std::min(soonest, trace_[arrivals_[next_arrival_]].arrival_ms);
          last_round_ms_ =
              std::isfinite(soonest) && soonest > now ? soonest - now : planned_round_ms;
        }
        next = now + last_round_ms_;
      }
      events_.push({next, Ev::kRound, generation_, seq_++});
    } else if (!o_.plan_on_arrival && next_arrival_ < arrivals_.size()) {
      schedule_round_for_arrival(trace_[arrivals_[next_arrival_]].arrival_ms);
    }
    return Status::success();
  }

  Status step_end(size_t i, double now) {
    Live& l = live_[i];
    l.in_step = false;
    if (l.steps_left == 0) {
      l.done = true;
      l.finish = now;
      l.target.clear();
    }
    // A round is pending whenever a request is active (round() queues the next one), so the
    // last request's end needs none: that round finds nothing active and waits for arrivals.
    release_untargeted(i);
    return start_waiting(now);
  }

  // The device with the fewest unfinished requests bound to it (the lowest on ties).
  int home_for_arrival() const {
    std::vector<int> bound(static_cast<size_t>(o_.devices), 0);
    for (size_t i : active_) {
      if (!live_[i].done && live_[i].home >= 0) ++bound[static_cast<size_t>(live_[i].home)];
    }
    return static_cast<int>(std::min_element(bound.begin(), bound.end()) - bound.begin());
  }

  // Late even if it ran every step left on its device alone from now: what the worker's step
  // scheduler calls hopeless (step_scheduler.h), judged with its step on one device.
  bool late_alone(size_t i, double now) const {
    const Live& l = live_[i];
    return now + double(l.steps_left) * step_(trace_[i], 1, false) > l.deadline;
  }

  // Per device, the one request that goes to the planner: the one whose step is in flight,
  // else the earliest deadline among those still on time alone (late_alone), else the
  // earliest deadline; a device whose request runs its last step is unavailable.
  void choose_contenders(std::vector<bool>& contends, std::vector<int>& unavailable, double now) const {
    std::vector<int> pick(static_cast<size_t>(o_.devices), -1);
    std::vector<bool> last_step(static_cast<size_t>(o_.devices), false);
    for (size_t i : active_) {
      const Live& l = live_[i];
      contends[i] = false;
      if (l.done || l.home < 0) continue;
      int& p = pick[static_cast<size_t>(l.home)];
      if (l.in_step && l.steps_left == 0) {
        last_step[static_cast<size_t>(l.home)] = true;
        continue;
      }
      if (p < 0) {
        p = static_cast<int>(i);
        continue;
      }
      const Live& q = live_[static_cast<size_t>(p)];
      if (q.in_step) continue;
      if (l.in_step) {
        p = static_cast<int>(i);
        continue;
      }
      const bool l_late = late_alone(i, now), q_late = late_alone(static_cast<size_t>(p), now);
      if (l_late != q_late) {
        if (!l_late) p = static_cast<int>(i);  // work still on time goes first
        continue;
      }
      if (l.deadline < q.deadline) p = static_cast<int>(i);
    }
    for (int d = 0; d < o_.devices; ++d) {
      const int p = pick[static_cast<size_t>(d)];
      if (last_step[static_cast<size_t>(d)]) {
        // Its device is busy through that step: what else is bound there waits.
        unavailable.push_back(d);
        continue;
      }
      if (p >= 0) contends[static_cast<size_t>(p)] = true;
    }
  }

  void release_untargeted(size_t i) {
    Live& l = live_[i];
    std::vector<int> kept;
    for (int d : l.held) {
      if (std::find(l.target.begin(), l.target.end(), d) != l.target.end()) {
        kept.push_back(d);
      } else {
        holder_[static_cast<size_t>(d)] = -1;
      }
    }
    l.held = std::move(kept);
  }

  // Request `i`'s planned devices are not all free: whether it steps now on the free ones
  // (`devices` and `split` set to those it uses) or waits (false), per busy_devices.
  bool short_of_plan(size_t i, double now, std::vector<int>& devices, bool& split) const {
    if (o_.busy_devices == SpBusyDevices::kWait) return false;
    const Live& l = live_[i];
    std::vector<int> free;
    double free_at = now;  // when the busy ones' steps end
    bool known = true;
    for (int d : l.target) {
      const int h = holder_[static_cast<size_t>(d)];
      if (h < 0 || h == static_cast<int>(i)) {
        free.push_back(d);
      } else if (live_[static_cast<size_t>(h)].in_step) {
        free_at = std::max(free_at, live_[static_cast<size_t>(h)].step_end);
      } else {
        known = false;  // held by a request between steps: nobody knows until when
      }
    }
    if (l.home >= 0) {
      // Its own device first; in another's step, it cannot step at all.
      const auto home = std::find(free.begin(), free.end(), l.home);
      if (home == free.end()) return false;
      std::rotate(free.begin(), home, home + 1);
    }
    if (free.empty()) return false;
    // The largest degree the free devices allow (a split step: each half's), as the team's
    // planner does.
    const int n = static_cast<int>(free.size());
    int degree = 1;
    for (int k = l.target_split ? n / 2 : n; k >= 1; --k) {
      if (k == 1 || o_.heads % k == 0) {
        degree = k;
        break;
      }
    }
    const bool short_split = l.target_split && n >= 2;
    free.resize(static_cast<size_t>(short_split ? 2 * degree : degree));
    std::sort(free.begin(), free.end());
    if (o_.busy_devices == SpBusyDevices::kWaitWhenSooner && known &&
        free_at - now + step_(trace_[i], static_cast<int>(l.target.size()), l.target_split) <
            step_(trace_[i], static_cast<int>(free.size()), short_split))
      return false;
    devices = std::move(free);
    split = short_split;
    return true;
  }

  Status start_waiting(double now) {
    for (size_t i : active_) {
      Live& l = live_[i];
      if (l.in_step || l.done || l.target.empty() || l.steps_left == 0) continue;
      const bool free = std::all_of(l.target.begin(), l.target.end(), [&](int d) {
        const int h = holder_[static_cast<size_t>(d)];
        return h < 0 || h == static_cast<int>(i);
      });
      std::vector<int> devices = l.target;
      bool split = l.target_split;
      if (!free) {
        if (!short_of_plan(i, now, devices, split)) continue;
        report_.short_of_plan_steps += 1;
      }
      // A short step may leave out devices it held (a degree the free ones do not divide):
      // they are free again.
      for (int d : l.held) {
        if (std::find(devices.begin(), devices.end(), d) == devices.end()) holder_[static_cast<size_t>(d)] = -1;
      }
      for (int d : devices) holder_[static_cast<size_t>(d)] = static_cast<int>(i);
      l.held = devices;
      const int degree = static_cast<int>(devices.size());
      const double s = step_(trace_[i], degree, split);
      if (!std::isfinite(s) || s <= 0) return bad_step(trace_[i], degree, split, s);
      if (l.steps_run > 0) {
        if (degree != l.last_degree || split != l.last_split) {
          ++l.degree_changes;
        } else if (devices != l.last_devices) {
          ++l.moves;
        }
      }
      l.last_degree = degree;
      l.last_split = split;
      l.last_devices = devices;
      if (trace_[i].guided) report_.guided_steps += 1;
      if (split) {
        report_.split_steps += 1;
        l.split_steps += 1;
      }
      l.in_step = true;
      l.steps_left -= 1;
      l.step_end = now + s;
      l.degree_sum += degree;
      l.steps_run += 1;
      l.max_degree = std::max(l.max_degree, degree);
      report_.busy_device_ms += double(degree) * s;
      report_.steps_by_degree[static_cast<size_t>(degree)] += 1;
      events_.push({l.step_end, Ev::kStepEnd, i, seq_++});
    }
    return Status::success();
  }

  std::span<const SpSimRequest> trace_;
  const StepTimes& step_;
  const SpSimOptions& o_;
  std::vector<int> holder_;  // per device: the request holding it, or -1
  std::vector<Live> live_;
  std::vector<size_t> arrivals_;  // request indices by arrival
  size_t next_arrival_ = 0;
  std::vector<size_t> active_;  // arrived, not yet done (done ones erased each round)
  EventQueue events_;
  uint64_t seq_ = 0;
  double last_round_ms_ = 0;
  size_t generation_ = 0;  // rounds run so far
  SpSimReport report_;
};

}  // namespace

Result<SpSimReport> simulate_sequence_parallel(std::span<const SpSimRequest> trace,
                                               const StepMsFunction& step_ms,
                                               const GuidedStepMsFunction& guided_step_ms,
                                               const SpSimOptions& options) {
  INFILL_RETURN_IF_ERROR(check(trace, options, guided_step_ms));
  const StepTimes step{step_ms, guided_step_ms};
  if (options.policy == SpPolicy::kFixedDegree) return FixedDegreeSim(trace, step, options).run();
  return RoundPlannerSim(trace, step, options).run();
}

Result<SpSimReport> simulate_sequence_parallel(std::span<const SpSimRequest> trace,
                                               const StepMsFunction& step_ms,
                                               const SpSimOptions& options) {
  return simulate_sequence_parallel(trace, step_ms, GuidedStepMsFunction{}, options);
}

}  // namespace infill
