#include "serving/simulator.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <memory>
#include <numeric>
#include <queue>
#include <random>
#include <unordered_map>

namespace infill {
namespace {

struct SimState {
  size_t index;      // into the trace
  int worker = 0;
  int steps_left = 0;
  int min_steps_total = 0;  // the class's floor on steps_run + steps_left
  double ready_ms = 0;
  double last_advance_ms = 0;
  double work_ms = 0;  // remaining marginal work (router signal)
  double step_work_ms = 0;
  int steps_run = 0;
  bool done = false;
};

struct SimWorker {
  std::unique_ptr<BatchSelector> selector;
  std::vector<size_t> ready;  // state indices in ready order
  std::vector<size_t> batch;  // of the step in flight
  bool busy = false;
  int requests = 0;            // routed, result not yet delivered
  double work_ms = 0;
  double busy_ms = 0;
};

enum class Ev { kArrive = 0, kReady = 1, kStepEnd = 2, kResult = 3 };

struct Event {
  double t;
  Ev kind;
  size_t who;  // request state index, or worker index for kStepEnd
  uint64_t seq;
  bool operator>(const Event& o) const {
    if (t != o.t) return t > o.t;
    if (kind != o.kind) return static_cast<int>(kind) < static_cast<int>(o.kind);  // step ends first
    return seq > o.seq;
  }
};

}  // namespace

SimReport simulate(std::span<const SimRequest> trace, const StepCostModel& cost, const SimOptions& o) {
  SimReport report;
  const size_t n = trace.size();
  report.requests.resize(n);
  std::vector<SimState> st(n);
  std::vector<SimWorker> workers(static_cast<size_t>(std::max(1, o.workers)));
  for (auto& w : workers) w.selector = std::make_unique<BatchSelector>(o.policy, o.token_budget, o.scheduler);
  Router router(o.routing);
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events;
  uint64_t seq = 0;

  std::mt19937_64 rng(o.seed);
  const auto draw = [&](const std::vector<double>& factors) {
    if (factors.empty()) return 1.0;
    return std::max(0.0, factors[std::uniform_int_distribution<size_t>(0, factors.size() - 1)(rng)]);
  };
  // How much slower work started now runs: the busy step loops and pool threads share
  // o.cores cores (the count includes the work being started).
  int busy_workers = 0, pool_busy = 0;
  const auto slowdown = [&](int runnable) {
    return o.cores > 0 ? std::max(1.0, double(runnable) / double(o.cores)) : 1.0;
  };
  // Pre-processing ends in kReady, post-processing in kResult; with a bounded pool both wait
  // for a thread, first come first served, as the worker's task pool does.
  struct PoolTask {
    size_t who;
    Ev then;
    double ms;
  };
  std::deque<PoolTask> pool_queue;
  const auto start_pool_task = [&](const PoolTask& t, double now) {
    ++pool_busy;
    const double ms = t.ms * draw(o.pool_time_factors) * slowdown(busy_workers + pool_busy);
    events.push({now + ms, t.then, t.who, seq++});
  };
  const auto submit_pool = [&](size_t who, Ev then, double now) {
    const SimRequest& r = trace[st[who].index];
    const PoolTask t{who, then,
                     then == Ev::kReady ? o.pre_ms : o.post_ms + o.post_ms_per_token * double(r.tokens)};
    if (o.pool_threads <= 0) {
      events.push({now + t.ms * draw(o.pool_time_factors), then, who, seq++});
    } else if (pool_busy < o.pool_threads) {
      start_pool_task(t, now);
    } else {
      pool_queue.push_back(t);
    }
  };
  const auto release_pool = [&](double now) {
    if (o.pool_threads <= 0) return;
    --pool_busy;
    if (!pool_queue.empty()) {
      const PoolTask t = pool_queue.front();
      pool_queue.pop_front();
      start_pool_task(t, now);
    }
  };
  double first = std::numeric_limits<double>::infinity(), last = 0;
  for (size_t i = 0; i < n; ++i) {
    st[i].index = i;
    events.push({trace[i].arrival_ms, Ev::kArrive, i, seq++});
    first = std::min(first, trace[i].arrival_ms);
  }

  auto start_step = [&](size_t wi, double now) {
    SimWorker& w = workers[wi];
    std::vector<SchedCandidate> cands;
    double total_sum = 0;
    for (size_t s : w.ready) {
      const SimRequest& r = trace[st[s].index];
      SchedCandidate c;
      c.id = s;
      c.tokens = r.tokens;
      c.steps_left = st[s].steps_left;
      c.min_steps_left = min_steps_left(st[s].min_steps_total, st[s].steps_run, st[s].steps_left);
      c.deadline_ms = r.arrival_ms + r.deadline_ms - o.post_ms;  // as the worker: room for post
      c.cls = r.cls;
      c.waiting_ms = now - st[s].last_advance_ms;
      cands.push_back(c);
      total_sum += double(r.total_tokens);
    }
    if (cands.empty()) return;
    const double mean_total = total_sum / double(cands.size());
    const auto step_ms = [&](int64_t tokens, int batch) {
      return cost.predict_ms(double(tokens), double(batch), double(tokens) * mean_total);
    };
    const SchedDecision d = w.selector->select(cands, now, step_ms);
    if (d.advance.empty()) return;
    for (const auto& [id, left] : d.reduce_steps) {
      SimState& s = st[id];
      if (left <= 0 || left >= s.steps_left) continue;
      const double dropped = std::min(s.work_ms, s.step_work_ms * (s.steps_left - left));
      s.work_ms -= dropped;
      w.work_ms -= dropped;
      s.steps_left = left;
    }
    double tokens = 0, attention = 0;
    w.batch.clear();
    for (uint64_t id : d.advance) {
      const SimRequest& r = trace[st[id].index];
      tokens += double(r.tokens);
      attention += double(r.tokens) * double(r.total_tokens);
      w.batch.push_back(id);
    }
    w.busy = true;
    ++busy_workers;
    const double dt = (cost.predict_ms(tokens, double(w.batch.size()), attention) + o.step_overhead_ms) *
                      draw(o.step_time_factors) * slowdown(busy_workers + pool_busy);
    w.busy_ms += dt;
    ++report.steps;
    events.push({now + dt, Ev::kStepEnd, wi, seq++});
  };

  while (!events.empty()) {
    const Event e = events.top();
    events.pop();
    const double now = e.t;
    switch (e.kind) {
      case Ev::kArrive: {
        SimState& s = st[e.who];
        const SimRequest& r = trace[s.index];
        s.steps_left = r.steps;
        s.min_steps_total = min_steps_allowed(r.cls, r.steps);
        s.step_work_ms = request_work_ms(cost, r.tokens, r.total_tokens, 1);
        s.work_ms = s.step_work_ms * r.steps;
        std::vector<WorkerLoad> loads;
        for (const SimWorker& w : workers) {
          int max_left = 0;
          for (size_t x : w.ready) max_left = std::max(max_left, st[x].steps_left);
          loads.push_back({w.requests, drain_ms(cost, w.work_ms, max_left)});
        }
        s.worker = static_cast<int>(router.choose(loads, s.work_ms));
        SimWorker& w = workers[static_cast<size_t>(s.worker)];
        w.requests += 1;
        w.work_ms += s.work_ms;
        submit_pool(e.who, Ev::kReady, now);
        break;
      }
      case Ev::kReady: {
        release_pool(now);
        SimState& s = st[e.who];
        s.ready_ms = now;
        s.last_advance_ms = now;
        SimWorker& w = workers[static_cast<size_t>(s.worker)];
        if (s.steps_left <= 0) {
          submit_pool(e.who, Ev::kResult, now);
          break;
        }
        w.ready.push_back(e.who);
        if (!w.busy) start_step(static_cast<size_t>(s.worker), now);
        break;
      }
      case Ev::kStepEnd: {
        SimWorker& w = workers[e.who];
        w.busy = false;
        --busy_workers;
        for (size_t id : w.batch) {
          SimState& s = st[id];
          --s.steps_left;
          ++s.steps_run;
          s.last_advance_ms = now;
          const double d = std::min(s.work_ms, s.step_work_ms);
          s.work_ms -= d;
          w.work_ms -= d;
          if (s.steps_left <= 0) {
            w.work_ms -= s.work_ms;
            s.work_ms = 0;
            s.done = true;
            submit_pool(id, Ev::kResult, now);
          }
        }
        std::erase_if(w.ready, [&](size_t id) { return st[id].done; });
        w.batch.clear();
        start_step(e.who, now);
        break;
      }
      case Ev::kResult: {
        release_pool(now);
        SimState& s = st[e.who];
        const SimRequest& r = trace[s.index];
        workers[static_cast<size_t>(s.worker)].requests -= 1;
        SimOutcome& out = report.requests[s.index];
        out.id = r.id;
        out.worker = s.worker;
        out.latency_ms = now - r.arrival_ms;
        out.deadline_met = out.latency_ms <= r.deadline_ms;
        out.steps_run = s.steps_run;
        last = std::max(last, now);
        break;
      }
    }
  }
  for (const SimWorker& w : workers) report.busy_ms.push_back(w.busy_ms);
  report.makespan_ms = n ? last - first : 0.0;
  return report;
}

}  // namespace infill
