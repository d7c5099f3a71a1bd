// bench_multi_device: serving on several devices. Prints one JSON document on stdout;
// progress goes to stderr. Sections, each a key of "sections", run in this order unless
// --only names one:
//   simulator  TetriServe's setting in the sequence-parallel simulator: 8 H100s, FLUX.1-dev-
//              sized steps at 256^2 to 2048^2, uniform and skewed mixes, SLO scales 1.0, 1.2
//              and 1.5, Poisson arrivals: SLO attainment of the round planner against fixed
//              degrees 1, 2, 4 and 8 (no devices used: the cost model stands for them). Its
//              "guided" part: mixes of classifier-free guided requests (two forwards a step),
//              the planner with guidance placement (halves split over two device groups or
//              packed on one) against the planner packing always and fixed degrees, packed or
//              with the halves split over each group (xDiT's CFG parallelism).
//   gloo       a whole-sequence FLUX.2 step (random weights, mid-size, 24 heads) at 1024^2 and
//              2048^2 token counts on one CPU device and in Ulysses sequence parallel over 2
//              Gloo ranks (multi_device_gloo.h): step times, the share in collectives, and the
//              sequence-parallel cost model fitted on these runs checked against them.
//   nccl       the same at klein 4B sizes over NCCL on the GPUs present, every degree that fits
//              (multi_device_nccl.h); says so and measures nothing without a GPU.
// A section is one function taking the parsed options and returning its JSON object; add one
// to kSections.
//
//   bench_multi_device [--only NAME] [--requests N] [--seeds N] [--repeats N]
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/blas_kernel.h"
#include "machine_info.h"
#include "multi_device_gloo.h"
#include "multi_device_nccl.h"
#include "serving/round_planner.h"
#include "serving/sequence_parallel_cost_model.h"
#include "serving/sequence_parallel_simulator.h"

using namespace infill;
using json = nlohmann::json;

namespace {

struct Args {
  std::string only;
  int requests = 2000;  // per trace
  int seeds = 3;        // traces per setting; attainment is their mean
  int repeats = 3;      // timed runs per measurement of the gloo section (median)
};

// v rounded to `decimals` places (divided, not multiplied back, so that JSON shows 2.3 and
// not 2.3000000000000003).
double round_to(double v, int decimals) {
  const double scale = std::pow(10.0, decimals);
  return std::round(v * scale) / scale;
}

// --- simulator -----------------------------------------------------------------------------

constexpr int kDevices = 8;
constexpr int kHeads = 24;  // FLUX.1-dev and klein: 24 heads of 128
constexpr int kSteps = 28;  // FLUX.1-dev's default, and xDiT's benchmark
constexpr double kRoundMs = 100;
const int64_t kTokens[] = {256, 1024, 4096, 16384};  // 256^2 .. 2048^2 at 16x16-pixel tokens
const char* const kResolutions[] = {"256x256", "512x512", "1024x1024", "2048x2048"};

struct Mix {
  const char* name;
  double share[4];
  const char* note;
};
const Mix kMixes[] = {
    {"uniform", {0.25, 0.25, 0.25, 0.25}, "each resolution a quarter of the requests"},
    {"skewed",
     {0.1, 0.2, 0.3, 0.4},
     "large-resolution-heavy (TetriServe's skewed mix leans to large images; these shares are "
     "ours)"},
};

enum class Reference { kSingleDevice, kBestDegree };
struct ReferenceInfo {
  Reference ref;
  const char* name;
  const char* definition;
};
const ReferenceInfo kReferences[] = {
    {Reference::kSingleDevice, "single_device",
     "deadline = scale x the request's latency alone on one device (28 steps at degree 1)"},
    {Reference::kBestDegree, "best_degree",
     "deadline = scale x the request's latency alone at its fastest degree of the 8 devices"},
};

const double kLoads[] = {0.5, 0.7, 0.9};
const double kScales[] = {1.0, 1.2, 1.5};

double reference_ms(const SequenceParallelCostModel& m, int64_t tokens, Reference ref) {
  if (ref == Reference::kSingleDevice) return kSteps * m.step_ms(tokens, 1);
  double best = m.step_ms(tokens, 1);
  for (int d : allowed_degrees(kHeads, kDevices)) best = std::min(best, m.step_ms(tokens, d));
  return kSteps * best;
}

// Arrivals and resolutions of one trace; deadlines are set per setting.
struct Arrival {
  double t;
  int size;  // index into kTokens
  bool guided = false;
};

// A request's latency alone on one device: 28 steps at degree 1 (guided: both halves packed).
double single_device_ms(const SequenceParallelCostModel& m, int64_t tokens, bool guided) {
  return kSteps * (guided ? m.guided_step_ms(tokens, 1, false) : m.step_ms(tokens, 1));
}

// guided_share of the requests are guided, drawn from their own generator so that a share of
// 0 gives the arrivals and sizes of the unguided traces.
std::vector<Arrival> poisson_trace(const SequenceParallelCostModel& m, const Mix& mix, double load,
                                   uint64_t seed, int n, double guided_share = 0) {
  // Offered load: arrival rate x a request's mean device time at degree 1 (guided: packed on
  // one device), over the devices.
  double mean_ms = 0;
  for (int k = 0; k < 4; ++k) {
    const double unguided = mix.share[k] * kSteps * m.step_ms(kTokens[k], 1);
    const double guided = mix.share[k] * kSteps * m.guided_step_ms(kTokens[k], 1, false);
    mean_ms += (1 - guided_share) * unguided + guided_share * guided;
  }
  std::mt19937_64 rng(seed), guided_rng(seed ^ 0x9e3779b97f4a7c15ull);
  std::exponential_distribution<double> gap(load * kDevices / mean_ms);
  std::discrete_distribution<int> size(std::begin(mix.share), std::end(mix.share));
  std::bernoulli_distribution is_guided(guided_share);
  std::vector<Arrival> out;
  double t = 0;
  for (int i = 0; i < n; ++i) {
    t += gap(rng);
    const int k = size(rng);
    out.push_back({t, k, guided_share > 0 && is_guided(guided_rng)});
  }
  return out;
}

struct Policy {
  std::string name;
  SpSimOptions options;
};

std::vector<Policy> policies() {
  std::vector<Policy> out;
  SpSimOptions planner;
  planner.devices = kDevices;
  planner.heads = kHeads;
  planner.round_ms = kRoundMs;
  out.push_back({"round_planner", planner});
  planner.plan_on_arrival = true;
  out.push_back({"round_planner_on_arrival", planner});
  planner.bind_to_home = true;
  planner.bound_may_yield = true;
  planner.busy_devices = SpBusyDevices::kWaitWhenSooner;
  out.push_back({"round_planner_bound", planner});
  planner.busy_devices = SpBusyDevices::kShortOfPlan;
  out.push_back({"round_planner_bound_short_of_plan", planner});
  planner.busy_devices = SpBusyDevices::kWait;
  out.push_back({"round_planner_bound_always_wait", planner});
  planner.busy_devices = SpBusyDevices::kWaitWhenSooner;
  planner.bound_may_yield = false;
  out.push_back({"round_planner_bound_never_yield", planner});
  planner.busy_devices = SpBusyDevices::kWait;
  planner.bind_to_home = false;
  planner.plan_on_arrival = false;
  planner.grant_idle_devices = false;
  out.push_back({"round_planner_no_grants", planner});
  for (int d : {1, 2, 4, 8}) {
    SpSimOptions o;
    o.devices = kDevices;
    o.heads = kHeads;
    o.policy = SpPolicy::kFixedDegree;
    o.fixed_degree = d;
    out.push_back({"fixed_" + std::to_string(d), o});
  }
  return out;
}

// --- simulator: guidance placement ----------------------------------------------------------

struct GuidedMix {
  const char* name;
  const Mix* sizes;
  double guided_share;
  const char* note;
};
const GuidedMix kGuidedMixes[] = {
    {"guided_uniform", &kMixes[0], 1.0,
     "every request guided (a base model under classifier-free guidance, e.g. FLUX.2 [dev]- or "
     "klein-base-like serving), resolutions as 'uniform'"},
    {"guided_skewed", &kMixes[1], 1.0, "every request guided, resolutions as 'skewed'"},
    {"half_guided_uniform", &kMixes[0], 0.5,
     "half the requests guided (a base and a distilled model side by side), resolutions as "
     "'uniform'"},
};

std::vector<Policy> guided_policies() {
  std::vector<Policy> out;
  SpSimOptions planner;
  planner.devices = kDevices;
  planner.heads = kHeads;
  planner.round_ms = kRoundMs;
  out.push_back({"round_planner", planner});
  planner.split_guidance = false;
  out.push_back({"round_planner_packed", planner});
  for (bool split : {false, true}) {
    for (int d : {1, 2, 4, 8}) {
      if (split && d == 1) continue;
      SpSimOptions o;
      o.devices = kDevices;
      o.heads = kHeads;
      o.policy = SpPolicy::kFixedDegree;
      o.fixed_degree = d;
      o.fixed_split_guidance = split;
      out.push_back({"fixed_" + std::to_string(d) + (split ? "_split" : ""), o});
    }
  }
  return out;
}

json guided_part(const Args& args, const SequenceParallelCostModel& m) {
  const StepMsFunction step = m.function();
  const GuidedStepMsFunction guided = m.guided_function();
  json cfg;
  cfg["model"] =
      "the FLUX.1-dev-sized cost model above with classifier-free guidance (FLUX.1-dev itself is "
      "guidance-distilled: this stands for a base model of its size); 28 steps, each two "
      "forwards of the sequence";
  cfg["guided_step"] = {
      {"packed",
       "both halves in one forward on d devices: fixed_ms + 2 x compute / d + all-to-alls of "
       "twice the rows (attention does not cross the halves: 2 L^2, not (2L)^2)"},
      {"split",
       "each half at degree d on its own d devices at once (2 d devices): step(L, d) + one "
       "exchange of the float32 predictions (64 channels)"}};
  json steps = json::object();
  for (int k = 0; k < 4; ++k) {
    json packed = json::object(), split = json::object();
    for (int d : allowed_degrees(kHeads, kDevices)) {
      packed[std::to_string(d)] = round_to(m.guided_step_ms(kTokens[k], d, false), 1);
      if (2 * d <= kDevices)
        split[std::to_string(2 * d)] = round_to(m.guided_step_ms(kTokens[k], d, true), 1);
    }
    steps[kResolutions[k]] = {{"packed_step_ms_by_devices", packed},
                              {"split_step_ms_by_devices", split}};
  }
  cfg["guided_steps_by_resolution"] = steps;
  json mixes = json::object();
  for (const GuidedMix& g : kGuidedMixes) {
    mixes[g.name] = {
        {"shares", g.sizes->share}, {"guided_share", g.guided_share}, {"note", g.note}};
  }
  cfg["mixes"] = mixes;
  cfg["loads"] = kLoads;
  cfg["slo_scales"] = kScales;
  cfg["slo_reference"] =
      "single_device: deadline = scale x the request's latency alone on one device (guided: both "
      "halves packed, 28 steps at degree 1)";
  cfg["load"] =
      "arrival rate x a request's mean device time on one device (guided: packed) / 8 devices";
  cfg["policies"] = {
      {"round_planner",
       "the round planner with guidance placement: a guided request's halves split over two "
       "groups of d devices or packed on d, decided per round by deadline and free devices"},
      {"round_planner_packed", "the same, packing the halves always"},
      {"fixed_D", "groups of D devices as above, guided requests packed on their group"},
      {"fixed_D_split",
       "groups of D devices, a guided request's halves on the group's two halves at D / 2 each "
       "(xDiT's CFG parallelism with Ulysses D / 2)"}};

  const std::vector<Policy> pols = guided_policies();
  json results = json::array();
  // Per SLO scale: the least and most points guidance placement gains over packing always,
  // and the planner over the best fixed policy.
  std::vector<double> min_vs_packed(std::size(kScales), INFINITY),
      max_vs_packed(std::size(kScales), -INFINITY), min_vs_fixed(std::size(kScales), INFINITY),
      max_vs_fixed(std::size(kScales), -INFINITY);
  for (const GuidedMix& mix : kGuidedMixes) {
    for (double load : kLoads) {
      std::vector<std::vector<Arrival>> traces;
      for (int s = 0; s < args.seeds; ++s) {
        traces.push_back(poisson_trace(m, *mix.sizes, load, 1000 + uint64_t(s), args.requests,
                                       mix.guided_share));
      }
      for (size_t si = 0; si < std::size(kScales); ++si) {
        const double scale = kScales[si];
        std::cerr << "simulator (guided): " << mix.name << " load " << load << " scale " << scale
                  << "\n";
        json attainment = json::object();
        json planner_stats;
        double best_fixed = -1;
        std::string best_fixed_name;
        for (const Policy& p : pols) {
          double sum = 0;
          uint64_t guided_steps = 0, split_steps = 0;
          std::vector<double> met(4, 0), count(4, 0), degree(4, 0), split(4, 0);
          for (const std::vector<Arrival>& arrivals : traces) {
            std::vector<SpSimRequest> trace;
            for (size_t i = 0; i < arrivals.size(); ++i) {
              const int64_t tokens = kTokens[arrivals[i].size];
              SpSimRequest r{i, arrivals[i].t, tokens, kSteps,
                             scale * single_device_ms(m, tokens, arrivals[i].guided)};
              r.guided = arrivals[i].guided;
              trace.push_back(r);
            }
            const Result<SpSimReport> rep =
                simulate_sequence_parallel(trace, step, guided, p.options);
            if (!rep.ok()) {
              std::cerr << "bench_multi_device: " << rep.status().to_string() << "\n";
              std::exit(1);
            }
            sum += rep->slo_attainment;
            guided_steps += rep->guided_steps;
            split_steps += rep->split_steps;
            for (size_t i = 0; i < trace.size(); ++i) {
              if (!trace[i].guided) continue;
              const size_t k = static_cast<size_t>(arrivals[i].size);
              const SpSimOutcome& out = rep->requests[i];
              met[k] += out.deadline_met ? 1 : 0;
              count[k] += 1;
              degree[k] += out.mean_degree;
              split[k] += double(out.split_steps) / kSteps;
            }
          }
          const double mean = sum / double(traces.size());
          attainment[p.name] = round_to(mean, 4);
          if (p.options.policy == SpPolicy::kFixedDegree && mean > best_fixed) {
            best_fixed = mean;
            best_fixed_name = p.name;
          }
          if (p.name == "round_planner") {
            json by_size = json::object();
            for (size_t k = 0; k < 4; ++k) {
              const double c = std::max(1.0, count[k]);
              by_size[kResolutions[k]] = {{"guided_attainment", round_to(met[k] / c, 3)},
                                          {"mean_devices", round_to(degree[k] / c, 2)},
                                          {"split_step_share", round_to(split[k] / c, 3)}};
            }
            planner_stats = {
                {"split_step_share",
                 round_to(double(split_steps) / std::max<double>(1, double(guided_steps)), 3)},
                {"guided_by_resolution", by_size}};
          }
        }
        const double planner = attainment["round_planner"].get<double>();
        const double vs_packed =
            100.0 * (planner - attainment["round_planner_packed"].get<double>());
        const double vs_fixed = 100.0 * (planner - best_fixed);
        min_vs_packed[si] = std::min(min_vs_packed[si], vs_packed);
        max_vs_packed[si] = std::max(max_vs_packed[si], vs_packed);
        min_vs_fixed[si] = std::min(min_vs_fixed[si], vs_fixed);
        max_vs_fixed[si] = std::max(max_vs_fixed[si], vs_fixed);
        results.push_back({{"mix", mix.name},
                           {"load", load},
                           {"slo_scale", scale},
                           {"attainment", attainment},
                           {"best_fixed", best_fixed_name},
                           {"placement_minus_packed_points", round_to(vs_packed, 1)},
                           {"planner_minus_best_fixed_points", round_to(vs_fixed, 1)},
                           {"round_planner", planner_stats}});
      }
    }
  }
  json summary = json::array();
  for (size_t si = 0; si < std::size(kScales); ++si) {
    summary.push_back({{"slo_scale", kScales[si]},
                       {"placement_minus_packed_points",
                        {round_to(min_vs_packed[si], 1), round_to(max_vs_packed[si], 1)}},
                       {"planner_minus_best_fixed_points",
                        {round_to(min_vs_fixed[si], 1), round_to(max_vs_fixed[si], 1)}}});
  }
  json out;
  out["config"] = cfg;
  out["results"] = results;
  out["summary"] = {{"by_slo_scale", summary},
                    {"note", "[least, most] over the mixes and loads above"}};
  return out;
}

json simulator_section(const Args& args) {
  const SequenceParallelCostModel m = SequenceParallelCostModel::flux1_dev_h100();
  const StepMsFunction step = m.function();
  const SequenceParallelCoefficients& c = m.coefficients();
  json cfg;
  cfg["devices"] = "8 x H100 SXM, simulated (the cost model below; no device is used)";
  cfg["model"] =
      "FLUX.1-dev-sized: hidden 3072, 24 heads, 19 double + 38 single blocks, 512 text tokens";
  cfg["steps"] = kSteps;
  cfg["round_ms"] = kRoundMs;
  cfg["requests_per_trace"] = args.requests;
  cfg["traces_per_setting"] = args.seeds;
  cfg["step_times_source"] =
      "derived, not taken from TetriServe's paper (its per-step figures were not at hand): a FLOP "
      "model "
      "(12.9 GFLOP per sequence row for the linear layers, 4 x 3072 x 57 FLOP per row pair for "
      "attention, "
      "512 text rows added) at the compute rate that reproduces xDiT's published FLUX.1-dev 1024px "
      "time on one "
      "H100 (6.71 s for 28 steps, PyTorch, no torch.compile), 8 ms per step of weight reads and "
      "launches at "
      "every degree, and Ulysses all-to-alls (4 per block, 20 us each, 200 GB/s per device); see "
      "SequenceParallelCostModel::flux1_dev_h100";
  cfg["cost_coefficients"] = {{"text_tokens", c.text_tokens},
                              {"fixed_ms", c.fixed_ms},
                              {"ms_per_token", c.ms_per_token},
                              {"ms_per_token_squared", c.ms_per_token_squared},
                              {"hidden", c.hidden},
                              {"all_to_alls_per_step", c.all_to_alls_per_step},
                              {"all_to_all_latency_ms", c.all_to_all_latency_ms},
                              {"link_bytes_per_ms", c.link_bytes_per_ms}};
  json steps = json::object();
  for (int k = 0; k < 4; ++k) {
    json row = json::object();
    for (int d : allowed_degrees(kHeads, kDevices))
      row[std::to_string(d)] = round_to(m.step_ms(kTokens[k], d), 1);
    steps[kResolutions[k]] = {{"tokens", kTokens[k]}, {"step_ms_by_degree", row}};
  }
  cfg["steps_by_resolution"] = steps;
  cfg["load"] =
      "arrival rate x a request's mean device time at degree 1 / 8 devices (Poisson arrivals)";
  cfg["loads"] = kLoads;
  cfg["slo_scales"] = kScales;
  json mixes = json::object();
  for (const Mix& mix : kMixes) mixes[mix.name] = {{"shares", mix.share}, {"note", mix.note}};
  cfg["mixes"] = mixes;
  json refs = json::object();
  for (const ReferenceInfo& r : kReferences) refs[r.name] = r.definition;
  cfg["slo_references"] = refs;
  cfg["policies"] = {
      {"round_planner",
       "serving/round_planner every 100 ms (group-knapsack packing, placement kept, idle "
       "devices granted)"},
      {"round_planner_on_arrival",
       "the same, with a new round at once when a request arrives (the engine's team plans as soon "
       "as an unknown request asks) instead of at the next 100 ms boundary"},
      {"round_planner_bound",
       "the engine's device team (serving/team_planner): the planner on arrival with every request "
       "bound at arrival to the device with the fewest requests bound to it, one request per "
       "device at a time (earliest deadline among those still on time alone; late work yields as "
       "in the worker's step scheduler), idle devices granted, and a bound request yields its "
       "device a round to another's step where it can still finish alone from the next round "
       "(the team's hold); a step whose planned devices are still in others' steps waits for "
       "them where that ends it sooner than stepping on the free ones now (the team's await), "
       "else steps short of plan"},
      {"round_planner_bound_short_of_plan",
       "the same, always stepping short of plan on the free devices (the team before it could "
       "await)"},
      {"round_planner_bound_always_wait",
       "the same, always waiting for every planned device (as TetriServe's rounds do)"},
      {"round_planner_bound_never_yield", "round_planner_bound without yielding"},
      {"round_planner_no_grants", "the same without granting idle devices"},
      {"fixed_D",
       "xDiT-like: 8 / D groups of D devices, first come first served, a request starts on arrival "
       "when a group is free (no rounds)"}};

  const std::vector<Policy> pols = policies();
  json results = json::array();
  // The target is judged on the primary reference: TetriServe's SLO scales start at 1.0 with
  // fixed degrees meeting most requests, which single_device reproduces (best_degree at 1.0
  // leaves nothing to a scheduler that ever waits).
  double min_gain_at_1 = INFINITY, max_gain_at_1 = -INFINITY;
  double min_bound_gain_at_1 = INFINITY, max_bound_gain_at_1 = -INFINITY;
  // Per load at scale 1.0: the least over the mixes of each policy's gain and of the headroom.
  json by_load_at_1 = json::object();
  for (const Mix& mix : kMixes) {
    for (double load : kLoads) {
      std::vector<std::vector<Arrival>> traces;
      for (int s = 0; s < args.seeds; ++s)
        traces.push_back(poisson_trace(m, mix, load, 1000 + uint64_t(s), args.requests));
      for (const ReferenceInfo& ref : kReferences) {
        for (double scale : kScales) {
          std::cerr << "simulator: " << mix.name << " load " << load << " " << ref.name << " scale "
                    << scale << "\n";
          json attainment = json::object();
          json planner_stats;
          std::vector<std::vector<double>> by_trace(pols.size());  // per policy, per trace
          double best_fixed = -1;
          std::string best_fixed_name;
          for (size_t pi = 0; pi < pols.size(); ++pi) {
            const Policy& p = pols[pi];
            double sum = 0, busy = 0, span = 0, changes = 0;
            uint64_t moves = 0;
            std::vector<double> degree_sum(4, 0), met_sum(4, 0), count(4, 0);
            for (const std::vector<Arrival>& arrivals : traces) {
              std::vector<SpSimRequest> trace;
              for (size_t i = 0; i < arrivals.size(); ++i) {
                const int64_t tokens = kTokens[arrivals[i].size];
                trace.push_back(
                    {i, arrivals[i].t, tokens, kSteps, scale * reference_ms(m, tokens, ref.ref)});
              }
              const Result<SpSimReport> rep = simulate_sequence_parallel(trace, step, p.options);
              if (!rep.ok()) {
                std::cerr << "bench_multi_device: " << rep.status().to_string() << "\n";
                std::exit(1);
              }
              sum += rep->slo_attainment;
              by_trace[pi].push_back(rep->slo_attainment);
              busy += rep->busy_device_ms;
              span += kDevices * rep->makespan_ms;
              for (size_t i = 0; i < trace.size(); ++i) {
                const SpSimOutcome& out = rep->requests[i];
                const int k = arrivals[i].size;
                degree_sum[static_cast<size_t>(k)] += out.mean_degree;
                met_sum[static_cast<size_t>(k)] += out.deadline_met ? 1 : 0;
                count[static_cast<size_t>(k)] += 1;
                changes += out.degree_changes;
                moves += static_cast<uint64_t>(out.moves);
              }
            }
            const double mean = sum / double(traces.size());
            attainment[p.name] = round_to(mean, 4);
            if (p.options.policy == SpPolicy::kFixedDegree && mean > best_fixed) {
              best_fixed = mean;
              best_fixed_name = p.name;
            }
            if (p.name == "round_planner") {
              json by_size = json::object();
              for (int k = 0; k < 4; ++k) {
                const size_t kk = static_cast<size_t>(k);
                by_size[kResolutions[k]] = {
                    {"attainment", round_to(met_sum[kk] / std::max(1.0, count[kk]), 3)},
                    {"mean_degree", round_to(degree_sum[kk] / std::max(1.0, count[kk]), 2)}};
              }
              const double n = double(traces.size()) * double(args.requests);
              planner_stats = {{"by_resolution", by_size},
                               {"device_utilisation", round_to(busy / std::max(1e-9, span), 3)},
                               {"degree_changes_per_request", round_to(changes / n, 2)},
                               {"moves_at_unchanged_degree", moves}};
            }
          }
          const double planner = attainment["round_planner"].get<double>();
          const double gain = 100.0 * (planner - best_fixed);
          const double bound_gain = 100.0 * (attainment["round_planner_bound"].get<double>() - best_fixed);
          if (ref.ref == Reference::kSingleDevice && scale == 1.0) {
            min_bound_gain_at_1 = std::min(min_bound_gain_at_1, bound_gain);
            max_bound_gain_at_1 = std::max(max_bound_gain_at_1, bound_gain);
          }
          // Trace by trace against the fixed degree best on average: the spread of the gain
          // (pols[0] is the round planner).
          json gain_by_trace = json::array();
          const size_t best_index = static_cast<size_t>(
              std::find_if(pols.begin(), pols.end(),
                           [&](const Policy& p) { return p.name == best_fixed_name; }) -
              pols.begin());
          for (size_t t = 0; t < traces.size(); ++t) {
            gain_by_trace.push_back(
                round_to(100.0 * (by_trace[0][t] - by_trace[best_index][t]), 1));
          }
          if (ref.ref == Reference::kSingleDevice && scale == 1.0) {
            min_gain_at_1 = std::min(min_gain_at_1, gain);
            max_gain_at_1 = std::max(max_gain_at_1, gain);
            json& row = by_load_at_1[std::to_string(load).substr(0, 3)];
            const auto least = [&](const char* key, double v) {
              row[key] = row.contains(key) ? std::min(row[key].get<double>(), round_to(v, 1)) : round_to(v, 1);
            };
            least("headroom_points", 100.0 * (1.0 - best_fixed));
            least("round_planner_points", gain);
            least("on_arrival_points",
                  100.0 * (attainment["round_planner_on_arrival"].get<double>() - best_fixed));
            least("engine_bound_points", bound_gain);
          }
          results.push_back({{"mix", mix.name},
                             {"load", load},
                             {"slo_reference", ref.name},
                             {"slo_scale", scale},
                             {"attainment", attainment},
                             {"best_fixed", best_fixed_name},
                             {"planner_minus_best_fixed_points", round_to(gain, 1)},
                             {"bound_minus_best_fixed_points", round_to(bound_gain, 1)},
                             {"headroom_points", round_to(100.0 * (1.0 - best_fixed), 1)},
                             {"points_by_trace", gain_by_trace},
                             {"round_planner", planner_stats}});
        }
      }
    }
  }
  json out;
  out["config"] = cfg;
  out["results"] = results;
  out["guided"] = guided_part(args, m);
  out["target"] = {
      {"goal",
       "at least +25 points of SLO attainment over the best fixed degree at SLO scale 1.0 (issue "
       "41)"},
      {"judged_on", "slo_reference single_device, scale 1.0, every mix and load above"},
      {"min_points", round_to(min_gain_at_1, 1)},
      {"max_points", round_to(max_gain_at_1, 1)},
      {"met", min_gain_at_1 >= 25.0},
      {"engine_bound_min_points", round_to(min_bound_gain_at_1, 1)},
      {"engine_bound_max_points", round_to(max_bound_gain_at_1, 1)},
      {"least_points_by_load", by_load_at_1},
      {"notes",
       {"headroom_points is what the best fixed degree leaves (100 - its attainment): at loads "
        "where degree 1 "
        "meets most deadlines no policy can gain 25 points",
        "best_degree at scale 1.0: round_planner (TetriServe's rounds) meets none by construction: "
        "an arrival waits for the next round (up to 100 ms) and a deadline of exactly its fastest "
        "latency leaves no wait; fixed degree 8 starts on arrival when its group is free, and so do "
        "round_planner_on_arrival and the engine-bound policy",
        "moves_at_unchanged_degree counts steps started on other devices at the degree of the "
        "request's previous "
        "step: almost all after it waited while others took its devices"}},
      {"tetriserve_reported",
       "FLUX.1-dev on 8 x H100 (its README's table): best fixed baseline vs TetriServe about 74% "
       "vs 76% at "
       "scale 1.0 (+2 points), +28% at 1.1, +32% at 1.2, 80% vs 95% at 1.5; +32% is its 'up to'"}};
  return out;
}

// --- sections ------------------------------------------------------------------------------

struct Section {
  const char* name;
  std::function<json(const Args&)> run;
};
json gloo_section(const Args& args) {
  bench::GlooBenchOptions o;
  o.repeats = args.repeats;
  return bench::bench_gloo(o);
}

json nccl_section(const Args& args) {
  bench::NcclBenchOptions o;
  o.repeats = args.repeats;
  return bench::bench_nccl(o);
}

const Section kSections[] = {
    {"simulator", simulator_section},
    {"gloo", gloo_section},
    {"nccl", nccl_section},
};

int usage(const std::string& why) {
  std::cerr
      << "bench_multi_device: " << why
      << "\nusage: bench_multi_device [--only NAME] [--requests N] [--seeds N] [--repeats N]\n"
      << "sections:";
  for (const Section& s : kSections) std::cerr << " " << s.name;
  std::cerr << "\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  infill::select_blas_kernel();  // first: before any GEMM (common/blas_kernel.h)
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--only" && i + 1 < argc) {
      args.only = argv[++i];
    } else if (a == "--requests" && i + 1 < argc) {
      args.requests = std::atoi(argv[++i]);
    } else if (a == "--repeats" && i + 1 < argc) {
      args.repeats = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--seeds" && i + 1 < argc) {
      args.seeds = std::atoi(argv[++i]);
    } else {
      return usage("unknown argument " + a);
    }
  }
  if (args.requests < 1 || args.seeds < 1)
    return usage("--requests and --seeds must be at least 1");
  if (!args.only.empty() && std::none_of(std::begin(kSections), std::end(kSections),
                                         [&](const Section& s) { return args.only == s.name; })) {
    return usage("no section named " + args.only + " in this build");
  }
  json out;
  out["benchmark"] = "bench_multi_device";
  out["machine"] = bench::machine_info();
  out["sections"] = json::object();
  for (const Section& s : kSections) {
    if (!args.only.empty() && args.only != s.name) continue;
    out["sections"][s.name] = s.run(args);
  }
  std::cout << out.dump(2) << "\n";
  return 0;
}
