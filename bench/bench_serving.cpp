// bench_serving: the serving runtime on one Poisson arrival trace per load, replayed under
// every batching policy (static, FCFS continuous, deadline-aware) and every routing policy,
// plus the cost model's held-out fit and the simulator's error against the measured runtime.
// Prints one JSON document on stdout; progress goes to stderr.
//
//   bench_serving [--quick] [--requests N]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>

#include "common/blas_kernel.h"
#include "bench_stats.h"
#include "common/remove_tree.h"
#include "machine_info.h"
#include "model/compute_threads.h"
#include "model/model.h"
#include "pipeline/edit_pipeline.h"
#include "pipeline/mask.h"
#include "serving/cost_calibration.h"
#include "serving/serving_runtime.h"
#include "serving/simulator.h"

using namespace infill;
using json = nlohmann::json;

namespace {

constexpr int kImage = 384;  // 48x48 latent, 24x24 = 576 tokens
constexpr int kSteps = 10;
constexpr int kTemplates = 3;

void die(const Status& s, const char* what) {
  std::cerr << "bench_serving: " << what << ": " << s.to_string() << "\n";
  std::exit(1);
}

using infill::bench::percentile;

struct TraceItem {
  double arrival_ms;
  int tmpl;
  at::Tensor mask;
  int64_t tokens;
  uint64_t seed;
  double deadline_ms = 0;
};

// A rectangle covering about `ratio` of the image, random aspect and place.
at::Tensor rect_mask(std::mt19937_64& rng, double ratio) {
  std::uniform_real_distribution<double> u(0, 1);
  const double area = ratio * kImage * kImage;
  const double aspect = std::exp(std::log(0.5) + u(rng) * std::log(4.0));
  const int w = std::clamp(static_cast<int>(std::sqrt(area * aspect)), 8, kImage);
  const int h = std::clamp(static_cast<int>(area / w), 8, kImage);
  const int x = static_cast<int>(u(rng) * (kImage - w + 1)), y = static_cast<int>(u(rng) * (kImage - h + 1));
  at::Tensor m = at::zeros({kImage, kImage});
  m.narrow(0, y, h).narrow(1, x, w).fill_(1.0);
  return m;
}

std::vector<TraceItem> make_trace(uint64_t seed, int n, double rate_rps, double mask_mean, const Model& model) {
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> gap(rate_rps / 1000.0);
  // Gamma with shape 2 has mean = 2 * scale; clipped to [0.01, 0.6] (mean stays close).
  std::gamma_distribution<double> ratio(2.0, mask_mean / 2.0);
  std::vector<TraceItem> trace;
  double t = 0;
  for (int i = 0; i < n; ++i) {
    t += rate_rps > 0 ? gap(rng) : 0.0;
    TraceItem it;
    it.arrival_ms = t;
    it.tmpl = static_cast<int>(rng() % kTemplates);
    it.mask = rect_mask(rng, std::clamp(ratio(rng), 0.01, 0.6));
    it.tokens = masked_tokens(latent_mask(it.mask, 8), model.manifest.dit.patch_size, 0).count();
    it.seed = rng();
    trace.push_back(std::move(it));
  }
  return trace;
}

// One request's time on the pre/post-processing pool thread.
struct PoolWork {
  int64_t tokens;
  double pre_ms, post_ms;
};

struct RunResult {
  std::vector<double> latency_ms;
  std::vector<bool> met;
  double makespan_ms = 0;
  double pre_ms = 0, post_ms = 0;  // means: submit -> ready, last step -> result
  double sched_ms = 0, pack_ms = 0, busy_step_ms = 0;
  int steps_dropped = 0;
  uint64_t steps = 0;
  double mean_batch = 0;
  std::vector<StepSample> step_samples;  // every worker's recent steps (the live cost)
  std::vector<PoolWork> pool_work;       // per request
};

struct Setup {
  std::shared_ptr<const Model> model;
  std::shared_ptr<ActivationStore> store;
  std::shared_ptr<const StepCostModel> cost;
  std::vector<std::shared_ptr<const TemplateImage>> templates;
  int64_t token_budget = 256;
};

RunResult run(const Setup& s, const std::vector<TraceItem>& trace, BatchingPolicy policy, RoutingPolicy routing,
              int workers) {
  RuntimeOptions o;
  o.workers = workers;
  o.threads_per_worker = 1;
  o.pool_threads = 1;
  o.routing = routing;
  o.worker.policy = policy;
  o.worker.token_budget = s.token_budget;
  auto rt = ServingRuntime::create(s.model, s.store, s.cost, o);
  if (!rt.ok()) die(rt.status(), "runtime");
  std::mutex mu;
  std::vector<RequestResult> results;
  const auto t0 = std::chrono::steady_clock::now();
  const double t0_runtime_ms = (*rt)->now_ms();
  for (size_t i = 0; i < trace.size(); ++i) {
    std::this_thread::sleep_until(t0 + std::chrono::microseconds(static_cast<int64_t>(trace[i].arrival_ms * 1000)));
    ServingRequest r;
    r.id = i + 1;
    r.tmpl = s.templates[static_cast<size_t>(trace[i].tmpl)];
    r.params.mask = trace[i].mask;
    r.params.seed = trace[i].seed;
    r.params.schedule.steps = kSteps;
    r.params.halo_tokens = 0;
    r.cls = RequestClass::kInteractive;
    r.deadline_ms = trace[i].deadline_ms > 0 ? trace[i].deadline_ms : 1e9;
    r.on_complete = [&](const RequestResult& res) {
      std::lock_guard lock(mu);
      results.push_back(res);
    };
    if (Status st = (*rt)->submit(std::move(r)); !st.ok()) die(st, "submit");
  }
  if (!(*rt)->drain(600000)) die(Status(ErrorCode::kInternal, "timeout"), "drain");
  RunResult out;
  out.latency_ms.resize(trace.size());
  out.met.resize(trace.size());
  double last = 0;
  for (const RequestResult& r : results) {
    if (r.state != RequestState::kDone) die(r.status, "request failed");
    const size_t i = r.id - 1;
    out.latency_ms[i] = r.metrics.total_ms;
    out.met[i] = r.metrics.deadline_met;
    out.pre_ms += r.metrics.ready_ms / double(trace.size());  // with the wait for the pool
    out.post_ms += r.metrics.post_ms / double(trace.size());
    out.pool_work.push_back({r.metrics.masked_tokens, r.metrics.prepare_ms, r.metrics.post_work_ms});
    out.steps_dropped += r.metrics.steps_dropped;
    last = std::max(last, r.history.back().time_ms);
  }
  out.makespan_ms = last - (t0_runtime_ms + trace.front().arrival_ms);
  double adv = 0;
  for (const WorkerMetrics& m : (*rt)->worker_metrics()) {
    out.sched_ms += m.sched_ms_total;
    out.pack_ms += m.pack_ms_total;
    out.busy_step_ms += m.step_ms_total + m.sched_ms_total + m.pack_ms_total;
    out.steps += m.steps;
    adv += double(m.requests_advanced);
    out.step_samples.insert(out.step_samples.end(), m.recent_steps.begin(), m.recent_steps.end());
  }
  out.mean_batch = out.steps ? adv / double(out.steps) : 0;
  return out;
}

// The runs of several traces as one sample: P95 over ~100 requests of one trace moves by 10%
// from trace to trace, the pooled P95 over all of them much less.
RunResult pooled(const std::vector<RunResult>& runs) {
  RunResult out;
  double advanced = 0;
  for (const RunResult& r : runs) {
    out.latency_ms.insert(out.latency_ms.end(), r.latency_ms.begin(), r.latency_ms.end());
    out.met.insert(out.met.end(), r.met.begin(), r.met.end());
    out.makespan_ms += r.makespan_ms;
    out.sched_ms += r.sched_ms;
    out.pack_ms += r.pack_ms;
    out.busy_step_ms += r.busy_step_ms;
    out.steps_dropped += r.steps_dropped;
    out.steps += r.steps;
    advanced += r.mean_batch * double(r.steps);
    out.pre_ms += r.pre_ms * double(r.latency_ms.size());
    out.post_ms += r.post_ms * double(r.latency_ms.size());
    out.step_samples.insert(out.step_samples.end(), r.step_samples.begin(), r.step_samples.end());
    out.pool_work.insert(out.pool_work.end(), r.pool_work.begin(), r.pool_work.end());
  }
  out.mean_batch = out.steps ? advanced / double(out.steps) : 0.0;
  if (!out.latency_ms.empty()) {
    out.pre_ms /= double(out.latency_ms.size());
    out.post_ms /= double(out.latency_ms.size());
  }
  return out;
}

json summarize(const RunResult& r) {
  double mean = 0;
  for (double l : r.latency_ms) mean += l / double(r.latency_ms.size());
  const double met = double(std::count(r.met.begin(), r.met.end(), true)) / double(r.met.size());
  return {{"mean_ms", mean},
          {"p50_ms", percentile(r.latency_ms, 0.5)},
          {"p95_ms", percentile(r.latency_ms, 0.95)},
          {"p99_ms", percentile(r.latency_ms, 0.99)},
          {"throughput_rps", double(r.latency_ms.size()) / (r.makespan_ms / 1000.0)},
          {"slo_attainment", met},
          {"mean_batch", r.mean_batch},
          {"ready_ms_mean", r.pre_ms},
          {"post_ms_mean", r.post_ms},
          {"steps_dropped", r.steps_dropped}};
}

// Throughput of a burst (every request at t = 0) under continuous batching, for requests
// whose mask ratios have mean `mask_mean` (the larger the masks, the lower the capacity).
double capacity_rps(const Setup& s, const Model& model, int workers, int n, double mask_mean) {
  auto burst = make_trace(99, n, 0.0, mask_mean, model);
  const RunResult r = run(s, burst, BatchingPolicy::kContinuous, RoutingPolicy::kMaskAware, workers);
  return double(n) / (r.makespan_ms / 1000.0);
}

// The pool thread's work per request: pre-processing as its mean, post-processing as a line
// in the masked tokens (the decoded crop grows with the mask). The line is Theil-Sen (median
// of pairwise slopes, then median intercept): a post task preempted by a step loop takes
// several times its usual time, and least squares let a few of those tilt the line (once to a
// negative intercept, which made small tasks' predictions near 0 and their measured /
// predicted factors huge). A negative intercept is refitted as a line through 0.
struct PoolService {
  double pre_ms = 0, post_ms = 0, post_ms_per_token = 0;
};

PoolService fit_pool_service(const std::vector<PoolWork>& work) {
  PoolService out;
  if (work.empty()) return out;
  for (const PoolWork& w : work) out.pre_ms += w.pre_ms / double(work.size());
  std::vector<double> slopes;
  for (size_t i = 0; i < work.size(); ++i) {
    for (size_t j = i + 1; j < work.size(); ++j) {
      if (work[i].tokens != work[j].tokens) {
        slopes.push_back((work[j].post_ms - work[i].post_ms) / double(work[j].tokens - work[i].tokens));
      }
    }
  }
  out.post_ms_per_token = slopes.empty() ? 0.0 : std::max(0.0, percentile(slopes, 0.5));
  std::vector<double> intercepts;
  for (const PoolWork& w : work) intercepts.push_back(w.post_ms - out.post_ms_per_token * double(w.tokens));
  out.post_ms = percentile(intercepts, 0.5);
  if (out.post_ms < 0) {
    std::vector<double> per_token;
    for (const PoolWork& w : work) {
      if (w.tokens > 0) per_token.push_back(w.post_ms / double(w.tokens));
    }
    out.post_ms = 0;
    out.post_ms_per_token = per_token.empty() ? 0.0 : percentile(per_token, 0.5);
  }
  return out;
}

std::vector<SimRequest> to_sim(const std::vector<TraceItem>& trace) {
  std::vector<SimRequest> out;
  for (size_t i = 0; i < trace.size(); ++i) {
    out.push_back({i + 1, trace[i].arrival_ms, trace[i].tokens, 576, kSteps,
                   trace[i].deadline_ms > 0 ? trace[i].deadline_ms : 1e9, RequestClass::kInteractive});
  }
  return out;
}

// Why continuous batching does or does not cut P95 here, by simulation (no model runs): static
// against continuous batching at 80% load for two step costs and two step-count mixes. The
// measured cost model of this CPU grows almost linearly with the tokens of a batch, so a
// batch saves little over its requests run one by one and holding newcomers back costs
// little; a GPU-shaped step (latency flat in the batch until its budget, an assumption, not a
// measurement) is where joining a running batch pays, the more so when step counts differ.
json batching_regimes(const StepCostModel& measured, int64_t token_budget, double pre_ms, double post_ms) {
  auto flat = StepCostModel::from_json(
      R"({"format":"infill-step-cost","version":1,"fingerprint":"gpu-shaped","coefficients":[20.0,0.004,0.2,0.0],"train":0})");
  if (!flat.ok()) die(flat.status(), "gpu-shaped cost model");
  struct Mix {
    const char* name;
    std::vector<std::pair<int, double>> steps;  // (steps, share)
  };
  const std::vector<Mix> mixes = {{"uniform 10 steps", {{10, 1.0}}},
                                  {"mixed 4/10/30 steps (40/40/20%)", {{4, 0.4}, {10, 0.4}, {30, 0.2}}}};
  json out = json::array();
  for (const auto& [cost_name, cost] : {std::pair<const char*, const StepCostModel*>{"measured (this CPU)", &measured},
                                        std::pair<const char*, const StepCostModel*>{"gpu-shaped (assumed)", &*flat}}) {
    for (const Mix& mix : mixes) {
      auto gen = [&](uint64_t seed, int count, double rate_rps) {
        std::mt19937_64 rng(seed);
        std::exponential_distribution<double> gap(rate_rps > 0 ? rate_rps / 1000.0 : 1.0);
        std::gamma_distribution<double> ratio(2.0, 0.11 / 2.0);
        std::uniform_real_distribution<double> u(0, 1);
        std::vector<SimRequest> t;
        double at = 0;
        for (int i = 0; i < count; ++i) {
          at += rate_rps > 0 ? gap(rng) : 0.0;
          const int64_t tok = std::clamp<int64_t>(static_cast<int64_t>(std::clamp(ratio(rng), 0.01, 0.6) * 576), 1, 576);
          double x = u(rng);
          int steps = mix.steps.back().first;
          for (const auto& [st, share] : mix.steps) {
            if (x < share) {
              steps = st;
              break;
            }
            x -= share;
          }
          t.push_back({static_cast<uint64_t>(i + 1), at, tok, 576, steps, 1e9, RequestClass::kInteractive});
        }
        return t;
      };
      SimOptions o;
      o.token_budget = token_budget;
      o.pre_ms = pre_ms;
      o.post_ms = post_ms;
      o.policy = BatchingPolicy::kContinuous;
      const SimReport burst = simulate(gen(99, 200, 0.0), *cost, o);
      const double cap = 200.0 / (burst.makespan_ms / 1000.0);
      std::vector<double> ratios, lat_static, lat_cont;
      for (int k = 0; k < 10; ++k) {
        const auto trace = gen(500 + static_cast<uint64_t>(k), 150, 0.8 * cap);
        double p95[2];
        for (int q = 0; q < 2; ++q) {
          o.policy = q == 0 ? BatchingPolicy::kStatic : BatchingPolicy::kContinuous;
          std::vector<double> l;
          for (const auto& x : simulate(trace, *cost, o).requests) l.push_back(x.latency_ms);
          p95[q] = percentile(l, 0.95);
          (q == 0 ? lat_static : lat_cont).insert((q == 0 ? lat_static : lat_cont).end(), l.begin(), l.end());
        }
        ratios.push_back(p95[1] / p95[0]);
      }
      out.push_back({{"step_cost", cost_name},
                     {"coefficients", cost->coefficients()},
                     {"steps", mix.name},
                     {"load", 0.8},
                     {"traces", 10},
                     {"continuous_over_static_p95_median", percentile(ratios, 0.5)},
                     {"continuous_over_static_p95_pooled", percentile(lat_cont, 0.95) / percentile(lat_static, 0.95)}});
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  infill::select_blas_kernel();  // first: before any GEMM (common/blas_kernel.h)
  bool quick = false;
  int requests = 0;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) quick = true;
    else if (!std::strcmp(argv[i], "--requests") && i + 1 < argc) requests = std::atoi(argv[++i]);
    else {
      std::cerr << "usage: bench_serving [--quick] [--requests N]\n";
      return 2;
    }
  }
  set_compute_threads(1);
  c10::InferenceMode guard;
  char dir_template[] = "/tmp/infill-bench-serving-XXXXXX";
  const std::string dir = ::mkdtemp(dir_template);

  DitConfig cfg;
  cfg.hidden_size = 192;
  cfg.depth = 6;
  cfg.num_heads = 6;
  cfg.patch_size = 2;
  cfg.latent_channels = 4;
  cfg.inputs = {DitInput::kNoisyLatent, DitInput::kMaskedLatent, DitInput::kMask};
  cfg.conditioning = ConditioningType::kVector;
  cfg.conditioning_dim = 16;
  cfg.prompt_scope = PromptScope::kMaskedTokens;
  if (Status st = write_random_model(dir + "/model", cfg, 16, 5); !st.ok()) die(st, "model");
  auto model = load_model(dir + "/model");
  if (!model.ok()) die(model.status(), "load model");

  Setup s;
  s.model = *model;
  ActivationStoreOptions so;
  so.ram_budget_bytes = size_t{1} << 30;
  auto store = ActivationStore::open(so);
  if (!store.ok()) die(store.status(), "store");
  s.store = std::shared_ptr<ActivationStore>(std::move(*store));

  std::cerr << "calibrating\n";
  CalibrationOptions co;
  co.points = quick ? 24 : 48;
  co.repeats = 3;
  co.threads = 1;
  co.cache_path = dir + "/step_cost.json";
  co.disk_dir = dir + "/disk";
  auto cal = load_or_calibrate(*s.model, co);
  if (!cal.ok()) die(cal.status(), "calibration");
  s.cost = std::make_shared<const StepCostModel>(cal->model);

  std::cerr << "preparing templates\n";
  std::mt19937_64 img_rng(3);
  EditPipeline pipeline(s.model, s.store);
  for (int t = 0; t < kTemplates; ++t) {
    PixelImage img = PixelImage::allocate(kImage, kImage, 3, PixelFormat::kU8);
    for (auto& b : img.data) b = static_cast<std::byte>(img_rng() & 0xff);
    auto png = encode_png(img);
    auto tmpl = make_template(*s.model, *png, "template" + std::to_string(t));
    if (!tmpl.ok()) die(tmpl.status(), "template");
    ScheduleSpec spec;
    spec.steps = kSteps;
    if (auto e = pipeline.prepare(**tmpl, spec); !e.ok()) die(e.status(), "prepare");
    s.templates.push_back(*tmpl);
  }
  const double mean_tokens = 0.11 * 576;
  s.token_budget = static_cast<int64_t>(4 * mean_tokens);

  // Isolated latency: requests one at a time; deadline = 1.5x the isolated latency of the
  // request's own size, predicted as fixed pre/post time + steps x single-request step.
  std::cerr << "isolated latency\n";
  auto iso_trace = make_trace(5, quick ? 4 : 8, 0.0, 0.11, *s.model);
  double iso_fixed = 0;
  {
    for (size_t i = 0; i < iso_trace.size(); ++i) {
      std::vector<TraceItem> one = {iso_trace[i]};
      one[0].arrival_ms = 0;
      const RunResult r = run(s, one, BatchingPolicy::kContinuous, RoutingPolicy::kRoundRobin, 1);
      const double steps_ms = kSteps * s.cost->predict_ms(double(one[0].tokens), 1, double(one[0].tokens) * 576);
      iso_fixed += (r.latency_ms[0] - steps_ms) / double(iso_trace.size());
    }
  }
  auto isolated_ms = [&](int64_t tokens) {
    return std::max(1.0, iso_fixed) + kSteps * s.cost->predict_ms(double(tokens), 1, double(tokens) * 576);
  };

  std::cerr << "capacity\n";
  const int burst = quick ? 16 : 40;
  const double cap1 = capacity_rps(s, *s.model, 1, burst, 0.11);
  const double cap1_large = capacity_rps(s, *s.model, 1, burst, 0.19);
  const double cap2 = capacity_rps(s, *s.model, 2, burst, 0.11);
  const int n = requests > 0 ? requests : quick ? 30 : std::clamp(static_cast<int>(cap1 * 12), 60, 200);

  json out;
  out["benchmark"] = "bench_serving";
  out["machine"] = bench::machine_info();
  out["config"] = {{"dit", {{"hidden", cfg.hidden_size}, {"depth", cfg.depth}, {"heads", cfg.num_heads}}},
                   {"image", kImage}, {"tokens", 576}, {"steps", kSteps}, {"templates", kTemplates},
                   {"token_budget", s.token_budget}, {"requests_per_run", n}, {"threads_per_worker", 1},
                   {"pool_threads", 1}, {"deadline", "1.5x isolated latency of the request's size"},
                   {"isolated_fixed_ms", iso_fixed}, {"isolated_ms_at_mean_mask", isolated_ms(int64_t(mean_tokens))},
                   {"capacity_rps_1_worker", cap1}, {"capacity_rps_1_worker_mask_0.19", cap1_large},
                   {"capacity_rps_2_workers", cap2}, {"load", "fraction of the burst capacity at the run's mask mean"},
                   {"step_reduction", "deadline policy only: an interactive request may lose up to 25% of its "
                                      "steps to keep its deadline; every run reports steps_dropped"}};
  json runs = json::array();
  double sched_ms = 0, pack_ms = 0, busy = 0;
  // Every run at 80% load is replayed by the simulator afterwards (its validation).
  struct Measured {
    RunResult run;
    std::vector<TraceItem> trace;
    BatchingPolicy policy;
    RoutingPolicy routing;
    int workers;
    std::string label;
  };
  std::vector<Measured> at_80;
  std::vector<RunResult> at_50;  // what the simulator is given (steps and pool work under load)
  auto account = [&](const RunResult& r) {
    sched_ms += r.sched_ms;
    pack_ms += r.pack_ms;
    busy += r.busy_step_ms;
  };
  // Each (mask mean, load) replays `batch_traces` traces under every policy, the policies
  // taking turns in an order rotated per trace (the machine's speed drifts over minutes);
  // each policy's statistics are over the requests of all its traces pooled, and the
  // per-trace P95s are listed as well.
  const int batch_traces = quick ? 1 : 3;
  const std::vector<BatchingPolicy> batching = {BatchingPolicy::kStatic, BatchingPolicy::kContinuous,
                                                BatchingPolicy::kDeadline};
  for (double mask_mean : {0.11, 0.19}) {
    for (double load : {0.5, 0.8, 1.0}) {
      std::map<BatchingPolicy, std::vector<RunResult>> per_trace;
      for (int k = 0; k < batch_traces; ++k) {
        const uint64_t seed = 1000 + static_cast<uint64_t>(load * 10 + mask_mean * 100) + 7919 * static_cast<uint64_t>(k);
        auto trace = make_trace(seed, n, load * (mask_mean == 0.11 ? cap1 : cap1_large), mask_mean, *s.model);
        for (auto& it : trace) it.deadline_ms = 1.5 * isolated_ms(it.tokens);
        for (size_t q = 0; q < batching.size(); ++q) {
          const BatchingPolicy p = batching[(q + static_cast<size_t>(k)) % batching.size()];
          std::cerr << "run " << batching_policy_name(p) << " load " << load << " mask " << mask_mean << " trace "
                    << k + 1 << "/" << batch_traces << "\n";
          RunResult r = run(s, trace, p, RoutingPolicy::kMaskAware, 1);
          account(r);
          if (load == 0.5) at_50.push_back(r);
          if (load == 0.8) {
            at_80.push_back({r, trace, p, RoutingPolicy::kMaskAware, 1,
                             std::string(batching_policy_name(p)) + " mask " + std::to_string(mask_mean).substr(0, 4)});
          }
          per_trace[p].push_back(std::move(r));
        }
      }
      for (BatchingPolicy p : batching) {
        const RunResult all = pooled(per_trace[p]);
        json j = summarize(all);
        json p95s = json::array();
        for (const RunResult& one : per_trace[p]) p95s.push_back(percentile(one.latency_ms, 0.95));
        j["p95_ms_per_trace"] = p95s;
        j["traces"] = per_trace[p].size();
        j["requests"] = all.latency_ms.size();
        j["policy"] = batching_policy_name(p);
        j["load"] = load;
        j["mask_mean"] = mask_mean;
        runs.push_back(j);
      }
    }
  }
  out["runs"] = runs;

  // Routing: every policy replays the same traces (2 workers at 80% of their burst capacity,
  // and at 50%, which the simulator is given for its two-worker runs); p95_ms is over the
  // requests of all traces pooled.
  std::vector<RunResult> at_50_two;
  for (double load : {0.5, 0.8}) {
    json routing = json::array();
    const int traces = quick ? 1 : load == 0.8 ? 4 : 2;
    std::vector<std::vector<TraceItem>> route_traces;
    for (int k = 0; k < traces; ++k) {
      route_traces.push_back(make_trace(77 + static_cast<uint64_t>(k) + (load == 0.5 ? 100 : 0), n, load * cap2, 0.11,
                                        *s.model));
      for (auto& it : route_traces.back()) it.deadline_ms = 1.5 * isolated_ms(it.tokens);
    }
    // The machine's speed drifts over minutes: the policies take turns on each trace, in an
    // order rotated from trace to trace, so that no policy always runs last.
    const std::vector<RoutingPolicy> policies = {RoutingPolicy::kRoundRobin, RoutingPolicy::kLeastRequests,
                                                 RoutingPolicy::kMaskAware};
    std::map<RoutingPolicy, std::vector<RunResult>> per_trace;
    for (int k = 0; k < traces; ++k) {
      for (size_t q = 0; q < policies.size(); ++q) {
        const RoutingPolicy p = policies[(q + static_cast<size_t>(k)) % policies.size()];
        std::cerr << "routing " << routing_policy_name(p) << " load " << load << " trace " << k + 1 << "/" << traces
                  << "\n";
        RunResult r = run(s, route_traces[static_cast<size_t>(k)], BatchingPolicy::kContinuous, p, 2);
        account(r);
        if (load == 0.5) at_50_two.push_back(r);
        if (load == 0.8) {
          at_80.push_back({r, route_traces[static_cast<size_t>(k)], BatchingPolicy::kContinuous, p, 2,
                           std::string("2 workers ") + routing_policy_name(p)});
        }
        per_trace[p].push_back(std::move(r));
      }
    }
    for (RoutingPolicy p : policies) {
      const RunResult all = pooled(per_trace[p]);
      json p95s = json::array();
      for (const RunResult& one : per_trace[p]) p95s.push_back(percentile(one.latency_ms, 0.95));
      double mean = 0;
      for (double l : all.latency_ms) mean += l / double(all.latency_ms.size());
      routing.push_back({{"policy", routing_policy_name(p)},
                         {"p95_ms", percentile(all.latency_ms, 0.95)},
                         {"mean_ms", mean},
                         {"p95_ms_per_trace", p95s},
                         {"requests", all.latency_ms.size()},
                         {"workers", 2},
                         {"load", load},
                         {"traces", traces}});
    }
    out[load == 0.8 ? "routing" : "routing_at_50pct_load"] = routing;
  }
  out["sched_overhead_fraction"] = busy > 0 ? (sched_ms + pack_ms) / busy : 0.0;
  out["sched_overhead"] = {{"scheduling_fraction", busy > 0 ? sched_ms / busy : 0.0},
                           {"packing_fraction", busy > 0 ? pack_ms / busy : 0.0},
                           {"of", "busy step-loop time of every run (scheduling + packing + forward + sampler)"}};
  out["cost_model"] = {{"r2", cal->held_out.r2},
                       {"mape", cal->held_out.mape},
                       {"train", cal->held_out.train},
                       {"test", cal->held_out.test},
                       {"coefficients", cal->model.coefficients()},
                       {"full_step_ms", cal->full_step_ms},
                       {"tiers", {{"ram_ms_per_block", cal->tiers.ram_ms_per_block},
                                  {"disk_ms_per_block", cal->tiers.disk_ms_per_block}}}};

  // Simulator against the measured runtime: every run at 80% load (batching policies with one
  // worker, routing policies with two) is replayed on its own trace. The simulator is given
  // only what the runs at 50% load measured: the pool thread's pre- and post-processing time
  // (post growing with the masked tokens), the per-step overhead, and the step cost, either
  // from the start-up calibration or refitted on the steps the single worker ran at 50% load.
  // It models the one-thread pool, the machine's cores shared by step loops and pool, and the
  // spread of step and pool times around their predictions (measured / predicted at 50% load,
  // step times per set-up: one worker or two).
  // Errors are on the pooled latencies of all the 80% runs, with each run's listed too.
  {
    const RunResult base = pooled(at_50);
    const PoolService service = fit_pool_service(base.pool_work);
    const double overhead_ms = base.steps ? (base.sched_ms + base.pack_ms) / double(base.steps) : 0.0;
    auto live = StepCostModel::fit(base.step_samples);
    if (!live.ok()) die(live.status(), "cost model refit on the steps at 50% load");
    std::vector<StepSample> steps_at_80;
    for (const Measured& m : at_80) steps_at_80.insert(steps_at_80.end(), m.run.step_samples.begin(), m.run.step_samples.end());
    auto startup_fit = s.cost->evaluate(steps_at_80);
    auto live_fit = live->evaluate(steps_at_80);
    if (!startup_fit.ok() || !live_fit.ok()) die(Status(ErrorCode::kInternal, "no steps at 80% load"), "cost fit");
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    // The spread of real times around the predictions, at 50% load: measured / predicted, per
    // set-up, since two step loops sharing the memory system can slow each other down (one
    // worker: the batching runs; two: the routing runs).
    const RunResult base_two = pooled(at_50_two);
    auto step_factors = [&](const StepCostModel& cost, double step_overhead_ms, const RunResult& setup) {
      std::vector<double> f;
      for (const StepSample& x : setup.step_samples) {
        const double p = cost.predict_ms(x.tokens, x.batch_size, x.attention_work) + step_overhead_ms;
        if (p > 0) f.push_back(x.ms / p);
      }
      return f;
    };
    std::vector<double> pool_factors;
    for (const PoolWork& w : base.pool_work) {
      const double p = service.post_ms + service.post_ms_per_token * double(w.tokens);
      if (p > 0 && w.post_ms > 0) pool_factors.push_back(w.post_ms / p);
    }
    auto validate = [&](const StepCostModel& cost, double step_overhead_ms) {
      const std::vector<double> factors_one = step_factors(cost, step_overhead_ms, base);
      const std::vector<double> factors_two = step_factors(cost, step_overhead_ms, base_two);
      std::vector<double> measured_all, simulated_all;
      json per_run = json::array();
      for (const Measured& m : at_80) {
        SimOptions so2;
        so2.workers = m.workers;
        so2.policy = m.policy;
        so2.routing = m.routing;
        so2.token_budget = s.token_budget;
        so2.scheduler.allow_step_reduction = SchedulerOptions{}.allow_step_reduction;  // as run() configures the workers
        so2.pre_ms = service.pre_ms;
        so2.post_ms = service.post_ms;
        so2.post_ms_per_token = service.post_ms_per_token;
        so2.pool_threads = 1;
        so2.cores = cores;
        so2.step_overhead_ms = step_overhead_ms;
        so2.step_time_factors = m.workers == 1 ? factors_one : factors_two;
        so2.pool_time_factors = pool_factors;
        const SimReport rep = simulate(to_sim(m.trace), cost, so2);
        std::vector<double> sim_lat;
        for (const auto& x : rep.requests) sim_lat.push_back(x.latency_ms);
        measured_all.insert(measured_all.end(), m.run.latency_ms.begin(), m.run.latency_ms.end());
        simulated_all.insert(simulated_all.end(), sim_lat.begin(), sim_lat.end());
        const double mp50 = percentile(m.run.latency_ms, 0.5), mp95 = percentile(m.run.latency_ms, 0.95);
        const double sp50 = percentile(sim_lat, 0.5), sp95 = percentile(sim_lat, 0.95);
        per_run.push_back({{"run", m.label},
                           {"p50", std::abs(sp50 - mp50) / mp50},
                           {"p95", std::abs(sp95 - mp95) / mp95},
                           {"measured_ms", {mp50, mp95}},
                           {"simulated_ms", {sp50, sp95}}});
      }
      const double mp50 = percentile(measured_all, 0.5), mp95 = percentile(measured_all, 0.95);
      const double sp50 = percentile(simulated_all, 0.5), sp95 = percentile(simulated_all, 0.95);
      return json{{"p50", std::abs(sp50 - mp50) / mp50},
                  {"p95", std::abs(sp95 - mp95) / mp95},
                  {"measured_p50_ms", mp50}, {"measured_p95_ms", mp95},
                  {"simulated_p50_ms", sp50}, {"simulated_p95_ms", sp95},
                  {"runs", at_80.size()}, {"requests", measured_all.size()}, {"load", 0.8},
                  {"per_run", per_run}};
    };
    // The live samples time the whole step-loop step (scheduling and packing included).
    json sim_live = validate(*live, 0.0);
    sim_live["step_cost"] = "refitted on the workers' steps at 50% load";
    json sim_startup = validate(*s.cost, overhead_ms);
    sim_startup["step_cost"] = "start-up calibration (quiet machine)";
    out["simulator_error"] = sim_live;
    out["simulator_error_startup_calibration"] = sim_startup;
    out["simulator_inputs"] = {
        {"from", "runs at 50% load"},
        {"pool", {{"threads", 1}, {"pre_ms", service.pre_ms}, {"post_ms", service.post_ms},
                  {"post_ms_per_token", service.post_ms_per_token}, {"requests", base.pool_work.size()}}},
        {"cores", cores},
        {"step_time_factor_median", {{"one_worker", percentile(step_factors(*live, 0.0, base), 0.5)},
                                     {"two_workers", percentile(step_factors(*live, 0.0, base_two), 0.5)}}},
        {"step_overhead_ms", overhead_ms},
        {"live_cost_model", {{"coefficients", live->coefficients()}, {"steps", base.step_samples.size()}}},
        {"step_cost_fit_on_80pct_steps", {{"steps", steps_at_80.size()},
                                          {"startup_r2", startup_fit->r2}, {"startup_mape", startup_fit->mape},
                                          {"live_r2", live_fit->r2}, {"live_mape", live_fit->mape}}}};

    // Planning: the same cost model at 80% of N x single-worker capacity.
    SimOptions po;
    po.policy = BatchingPolicy::kDeadline;
    po.routing = RoutingPolicy::kMaskAware;
    po.token_budget = s.token_budget;
    po.scheduler.allow_step_reduction = true;
    po.pre_ms = service.pre_ms;
    po.post_ms = service.post_ms + service.post_ms_per_token * mean_tokens;
    json plan = json::array();
    for (int devices : {8, 64, 512}) {
      po.workers = devices;
      const int pn = devices * 40;
      std::vector<SimRequest> pt;
      std::mt19937_64 rng(devices);
      std::exponential_distribution<double> gap(0.8 * cap1 * devices / 1000.0);
      std::gamma_distribution<double> ratio(2.0, 0.055);
      double t = 0;
      for (int i = 0; i < pn; ++i) {
        t += gap(rng);
        const int64_t tok = std::clamp<int64_t>(static_cast<int64_t>(std::clamp(ratio(rng), 0.01, 0.6) * 576), 1, 576);
        pt.push_back({static_cast<uint64_t>(i + 1), t, tok, 576, kSteps, 1.5 * isolated_ms(tok), RequestClass::kInteractive});
      }
      const auto t0 = std::chrono::steady_clock::now();
      const SimReport pr = simulate(pt, *live, po);
      const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::vector<double> lat;
      int met = 0;
      for (const auto& x : pr.requests) {
        lat.push_back(x.latency_ms);
        met += x.deadline_met;
      }
      plan.push_back({{"devices", devices}, {"requests", pn}, {"p95_ms", percentile(lat, 0.95)},
                      {"slo_attainment", double(met) / pn}, {"sim_wall_s", wall}});
    }
    out["planning"] = plan;
    out["batching_regimes"] = batching_regimes(*live, s.token_budget, po.pre_ms, po.post_ms);
  }
  std::cout << out.dump(2) << std::endl;
  infill::remove_tree(dir);
  return 0;
}
