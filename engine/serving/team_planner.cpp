#include "serving/team_planner.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "serving/sequence_parallel_cost_model.h"

namespace infill {

namespace {

bool can_share(const TeamAsk& ask) { return ask.heads > 0 || (ask.guided && ask.may_split); }

}  // namespace

TeamLink TeamLink::loopback() { return {0.2, 1e6, 4}; }

TeamPlanner::TeamPlanner(TeamPlannerOptions options) : options_(std::move(options)) {
  metrics_.round_ms = options_.round_ms;
  metrics_.link = options_.link;
}

std::string TeamPlanner::mode_key(int degree, bool split) {
  if (split && degree <= 1) return "split";
  std::string key = split ? "split_d" : "d";
  key += std::to_string(degree);
  return key;
}

double TeamPlanner::correction(int degree, bool split) const {
  if (degree <= 1 && !split) return 1.0;  // one device: the worker's own cost model, measured
  const auto it = metrics_.correction.find(mode_key(degree, split));
  return it == metrics_.correction.end() ? 1.0 : it->second;
}

double TeamPlanner::predict_ms(const TeamAsk& ask, int degree, bool split) const {
  const double single = std::max(ask.single_ms, 1e-3);
  const double fixed = std::clamp(ask.fixed_ms, 0.0, 0.9 * single);
  // One sequence's step on one device: a guided step's single_ms packs two halves, which
  // read the weights once (sequence_parallel_cost_model.h: packed(L, 1) = 2 step(L, 1) - fixed).
  const double one = ask.guided ? (single + fixed) / 2 : single;
  SequenceParallelCoefficients c;
  c.fixed_ms = fixed;
  c.ms_per_token = std::max(one - fixed, 1e-6) / double(std::max<int64_t>(ask.tokens, 1));
  c.hidden = std::max<int64_t>(ask.hidden, 1);
  c.heads = std::max(ask.heads, 1);
  c.all_to_alls_per_step = 4 * std::max(ask.attention_layers, 0);
  c.all_to_all_latency_ms = options_.link.all_to_all_latency_ms;
  c.bytes_per_element = options_.link.bytes_per_element;
  c.link_bytes_per_ms = options_.link.link_bytes_per_ms;
  c.prediction_channels = ask.prediction_channels;
  const Result<SequenceParallelCostModel> model = SequenceParallelCostModel::create(c);
  double ms;
  if (!model.ok()) {
    ms = split ? one : fixed + (single - fixed) / degree;  // a link the options got wrong: compute alone
  } else if (ask.guided) {
    ms = model->guided_step_ms(ask.tokens, degree, split);
  } else {
    ms = model->step_ms(ask.tokens, degree);
  }
  return ms * correction(degree, split);
}

void TeamPlanner::withdraw(int rank) {
  contenders_.erase(rank);
}

void TeamPlanner::stepped(const TeamDecision& decision, double measured_ms) {
  if (decision.ranks.size() <= 1 || !(decision.predicted_ms > 0) || !(measured_ms > 0)) return;
  if (!options_.learn) return;
  const std::string key = mode_key(decision.degree, decision.split);
  const double before = correction(decision.degree, decision.split);
  // The sample is measured over the prediction without the correction it carried.
  const double sample = measured_ms / (decision.predicted_ms / decision.correction);
  const auto found = metrics_.correction.find(key);
  const double next = found == metrics_.correction.end() ? sample : 0.7 * before + 0.3 * sample;
  metrics_.correction[key] = std::clamp(next, 0.05, 100.0);
}

std::optional<RoundPlan> TeamPlanner::plan(double now_ms, std::span<const TeamRankState> states) {
  const int n = options_.ranks;
  std::vector<int> claimed(static_cast<size_t>(n), -1);  // rank -> contender home holding it
  for (const auto& [home, c] : contenders_) claimed[static_cast<size_t>(home)] = home;
  std::vector<PlannerRequest> requests;
  for (auto& [home, c] : contenders_) {
    PlannerRequest r;
    r.id = c.ask.id;
    r.tokens = std::max<int64_t>(c.ask.tokens, 1);
    r.steps_left = std::max(c.ask.steps_left, 0);
    r.deadline_ms = c.ask.deadline_ms;
    r.guided = c.ask.guided;
    r.may_split = c.ask.may_split;
    r.heads = c.ask.heads > 0 ? c.ask.heads : 1;  // a splits-only step: degree 1
    r.home = home;
    const TeamAsk ask = c.ask;
    r.step_ms = [this, ask](int64_t, int d) { return predict_ms(ask, d, false); };
    r.guided_step_ms = [this, ask](int64_t, int d, bool split) { return predict_ms(ask, d, split); };
    // What it held: its last ranks still free or in its lease, and claimed by no other.
    bool whole = true;
    for (int rank : c.ranks) {
      const TeamRankState s = states[static_cast<size_t>(rank)];
      const bool usable = rank == home || ((s == TeamRankState::kFree || s == TeamRankState::kEngaged ||
                                            s == TeamRankState::kYielding) &&
                                           claimed[static_cast<size_t>(rank)] < 0);
      if (!usable) {
        whole = false;
        continue;
      }
      r.placement.push_back(rank);
      claimed[static_cast<size_t>(rank)] = home;
    }
    if (!whole || r.placement.size() <= 1) {
      for (int rank : r.placement) {
        if (rank != home) claimed[static_cast<size_t>(rank)] = -1;
      }
      r.placement.clear();
    }
    r.split = c.split && !r.placement.empty();
    // Its step in flight pins it only on the whole of what it holds.
    r.ready_ms = whole && !r.placement.empty() ? c.ready_ms : now_ms;
    requests.push_back(std::move(r));
  }
  RoundPlannerOptions o;
  o.devices = n;
  o.round_ms = options_.round_ms;
  o.heads = 1;  // every request brings its own
  o.max_split_degree = std::max(1, n / 2);  // each half over up to half of the ranks
  o.homes_may_wait = options_.yield;
  for (int rank = 0; rank < n; ++rank) {
    const TeamRankState s = states[static_cast<size_t>(rank)];
    if (claimed[static_cast<size_t>(rank)] >= 0) continue;
    if (s == TeamRankState::kBusy || s == TeamRankState::kAbsent || s == TeamRankState::kEngaged) o.unavailable.push_back(rank);
  }
  const StepMsFunction unused = [](int64_t, int) { return 1.0; };  // every request has its own
  Result<RoundPlan> made = plan_round(requests, now_ms, unused, o);
  metrics_.rounds += 1;
  round_start_ms_ = now_ms;
  plan_index_.clear();
  if (!made.ok()) {
    metrics_.last_error = made.status().message();
    plan_.reset();
    return std::nullopt;
  }
  plan_ = std::move(*made);
  for (size_t i = 0; i < plan_->requests.size(); ++i) plan_index_[plan_->requests[i].id] = static_cast<int>(i);
  return plan_;
}

double TeamPlanner::planned_ranks_free_at(const PlannedRequest& planned, int asker, double now_ms,
                                          std::span<const TeamRankState> states) const {
  constexpr double kUnknown = std::numeric_limits<double>::infinity();
  double free_at = now_ms;
  for (int r : planned.devices) {
    const TeamRankState s = states[static_cast<size_t>(r)];
    if (r == asker || s == TeamRankState::kFree || s == TeamRankState::kYielding) continue;
    // Whose step holds it: the contender at home there (kBusy: its own step in flight, the
    // plan having it wait), or the one whose lease it is in (kEngaged). A rank busy with
    // masked edits, or a step already past its predicted end, frees at a time nobody knows.
    const Contender* holder = nullptr;
    if (s == TeamRankState::kBusy) {
      const auto home = contenders_.find(r);
      if (home != contenders_.end()) holder = &home->second;
    } else if (s == TeamRankState::kEngaged) {
      for (const auto& [home, c] : contenders_) {
        if (home != asker && std::find(c.ranks.begin(), c.ranks.end(), r) != c.ranks.end()) holder = &c;
      }
    }
    if (holder == nullptr || !(holder->ready_ms > now_ms)) return kUnknown;
    free_at = std::max(free_at, holder->ready_ms);
  }
  return free_at;
}

TeamDecision TeamPlanner::decide(int rank, const TeamAsk& ask, double now_ms, std::span<const TeamRankState> states) {
  metrics_.decisions += 1;
  TeamDecision alone;
  alone.ranks = {rank};
  alone.predicted_ms = predict_ms(ask, 1, false);  // correction 1: one device
  const int n = options_.ranks;
  if (rank < 0 || rank >= n || static_cast<int>(states.size()) != n || !can_share(ask)) {
    withdraw(rank);
    metrics_.alone += 1;
    metrics_.by_degree[1] += 1;
    return alone;
  }
  // A free or absent rank holds nothing: its contender (if any) is gone.
  for (auto it = contenders_.begin(); it != contenders_.end();) {
    const TeamRankState s = states[static_cast<size_t>(it->first)];
    const Contender& c = it->second;
    const double quiet_ms = std::max(4 * options_.round_ms, 4 * (c.ready_ms - c.asked_ms));
    const bool gone = it->first != rank && (s == TeamRankState::kFree || s == TeamRankState::kAbsent ||
                                            now_ms - c.asked_ms > quiet_ms);
    it = gone ? contenders_.erase(it) : std::next(it);
  }
  Contender& me = contenders_[rank];
  const bool known = me.ask.id == ask.id && me.ask.tokens == ask.tokens;
  if (!known) {
    me.ranks.clear();
    me.split = false;
  }
  me.ask = ask;
  me.ready_ms = now_ms;  // it asks between steps: nothing of its own is in flight
  me.asked_ms = now_ms;

  const auto usable = [&](int r) {
    const TeamRankState s = states[static_cast<size_t>(r)];
    return r == rank || s == TeamRankState::kFree || s == TeamRankState::kYielding;
  };
  const auto planned = [&]() -> const PlannedRequest* {
    if (!plan_) return nullptr;
    const auto at = plan_index_.find(ask.id);
    return at == plan_index_.end() ? nullptr : &plan_->requests[static_cast<size_t>(at->second)];
  };
  const PlannedRequest* mine = planned();
  bool fresh = false;
  const bool round_over = now_ms >= round_start_ms_ + options_.round_ms;
  if (!known || round_over || mine == nullptr ||
      !std::all_of(mine->devices.begin(), mine->devices.end(), usable)) {
    plan(now_ms, states);
    mine = planned();
    fresh = true;
  }
  TeamDecision d = alone;
  d.new_round = fresh;
  // Answers the ask with a hold of `ms`: nothing of the asker's is in flight meanwhile.
  const auto held_for = [&](double ms) {
    d.hold_ms = ms;
    d.predicted_ms = 0;
    me.ranks.clear();
    me.split = false;
    me.ready_ms = now_ms;
    return d;
  };
  if (mine != nullptr && mine->degree == 0 && options_.yield) {
    // Planned to wait (its rank goes to another's step): held back to the round's end.
    const double left = round_start_ms_ + options_.round_ms - now_ms;
    if (left > 0) {
      metrics_.held += 1;
      return held_for(left);
    }
  }
  if (mine != nullptr && mine->degree >= 1 && std::find(mine->devices.begin(), mine->devices.end(), rank) != mine->devices.end()) {
    std::vector<int> ranks;
    for (int r : mine->devices) {
      if (usable(r)) ranks.push_back(r);
    }
    const int wanted = mine->device_count();
    if (static_cast<int>(ranks.size()) == wanted) {
      d.ranks = ranks;
      d.degree = mine->degree;
      d.split = mine->split;
    } else {
      // Some planned rank is still busy (a step in flight that the plan handed on): the
      // largest degree the rest allows, nearest the asker first; or, where that step ends
      // soon enough, a wait for it (below).
      std::stable_sort(ranks.begin(), ranks.end(), [&](int a, int b) { return std::abs(a - rank) < std::abs(b - rank); });
      // A split step keeps its halves split over what is free (each half at the largest
      // degree that fits), else runs alone.
      const int free = static_cast<int>(ranks.size());
      int degree = 1;
      bool split = false;
      for (int k = mine->split ? free / 2 : free; k >= 1; --k) {
        if (k == 1 || (ask.heads > 0 && ask.heads % k == 0)) {
          degree = k;
          split = mine->split && free >= 2;
          break;
        }
      }
      ranks.resize(static_cast<size_t>(split ? 2 * degree : degree));
      std::sort(ranks.begin(), ranks.end());
      // Waiting for the busy ranks' steps to end, then stepping as planned, ends this step
      // sooner than stepping short of plan now: held until then (the team wakes it earlier
      // when they come free), its own rank kept.
      const double free_at = planned_ranks_free_at(*mine, rank, now_ms, states);
      if (options_.await_ranks && free_at > now_ms &&
          free_at - now_ms + predict_ms(ask, mine->degree, mine->split) < predict_ms(ask, degree, split)) {
        d.awaits = true;
        d.awaited = mine->devices;
        metrics_.awaited += 1;
        return held_for(free_at - now_ms);
      }
      metrics_.short_of_plan += 1;
      d.ranks = ranks;
      d.degree = degree;
      d.split = split;
    }
  }
  d.predicted_ms = predict_ms(ask, d.degree, d.split);
  d.correction = correction(d.degree, d.split);
  me.ranks = d.ranks;
  me.split = d.split;
  me.ready_ms = now_ms + d.predicted_ms;
  if (d.ranks.size() <= 1) metrics_.alone += 1;
  if (d.split) metrics_.split += 1;
  metrics_.by_degree[d.degree] += 1;
  return d;
}

}  // namespace infill
