#include "server/prometheus_metrics.h"

#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <utility>
#include <vector>

#include "serving/request_state.h"

namespace infill {

const char* const kPrometheusContentType = "text/plain; version=0.0.4; charset=utf-8";

namespace {

using Labels = std::vector<std::pair<std::string, std::string>>;

// Appends families in the exposition format: a family's HELP and TYPE once, then its samples.
class ExpositionWriter {
 public:
  void family(const std::string& name, const char* type, const std::string& help) {
    out_ += "# HELP " + name + " " + escape(help, false) + "\n";
    out_ += "# TYPE " + name + " " + type + "\n";
  }
  void sample(const std::string& name, const Labels& labels, double value) {
    out_ += name;
    if (!labels.empty()) {
      out_ += '{';
      for (size_t i = 0; i < labels.size(); ++i) {
        if (i) out_ += ',';
        out_ += labels[i].first + "=\"" + escape(labels[i].second, true) + "\"";
      }
      out_ += '}';
    }
    out_ += ' ' + number(value) + '\n';
  }
  std::string take() { return std::move(out_); }

 private:
  // Label values escape backslash, double quote and newline; HELP text backslash and newline.
  static std::string escape(const std::string& s, bool quote) {
    std::string r;
    r.reserve(s.size());
    for (char c : s) {
      if (c == '\\') r += "\\\\";
      else if (c == '\n') r += "\\n";
      else if (c == '"' && quote) r += "\\\"";
      else r += c;
    }
    return r;
  }
  static std::string number(double v) {
    if (std::isnan(v)) return "NaN";
    if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
    char buf[32];
    if (v == std::floor(v) && std::fabs(v) < 1e15) std::snprintf(buf, sizeof buf, "%.0f", v);
    else std::snprintf(buf, sizeof buf, "%.9g", v);
    return buf;
  }
  std::string out_;
};

Labels with(Labels labels, std::initializer_list<std::pair<std::string, std::string>> more) {
  labels.insert(labels.end(), more.begin(), more.end());
  return labels;
}

}  // namespace

std::string prometheus_metrics_text(const ServiceMetrics& m) {
  ExpositionWriter w;

  w.family("infill_edits_submitted_total", "counter", "Edits accepted since the engine started.");
  w.sample("infill_edits_submitted_total", {}, double(m.edits_submitted));
  w.family("infill_edits_rejected_total", "counter", "Edits refused at admission (limits, engine busy).");
  w.sample("infill_edits_rejected_total", {}, double(m.edits_rejected));
  w.family("infill_edits_resumed_total", "counter", "Journaled batch edits resumed at start-up.");
  w.sample("infill_edits_resumed_total", {}, double(m.edits_resumed));
  w.family("infill_edits_finished_total", "counter", "Edits that ended since the engine started, by terminal state.");
  for (const char* state : {"done", "failed", "cancelled", "expired"}) {
    auto it = m.edits_finished.find(state);
    w.sample("infill_edits_finished_total", {{"state", state}}, it == m.edits_finished.end() ? 0.0 : double(it->second));
  }
  w.family("infill_edits", "gauge", "Edits in the engine's ledger now (live ones and kept results), by state.");
  for (RequestState s : {RequestState::kQueued, RequestState::kPreparing, RequestState::kRunning, RequestState::kDone,
                         RequestState::kFailed, RequestState::kCancelled, RequestState::kExpired}) {
    auto it = m.edits_by_state.find(request_state_name(s));
    w.sample("infill_edits", {{"state", request_state_name(s)}}, it == m.edits_by_state.end() ? 0.0 : double(it->second));
  }
  w.family("infill_live_edits", "gauge", "Edits not yet finished.");
  w.sample("infill_live_edits", {}, double(m.live_edits));
  w.family("infill_templates", "gauge", "Templates held by the engine.");
  w.sample("infill_templates", {}, double(m.templates));
  w.family("infill_templates_created_total", "counter", "Templates uploaded since the engine started.");
  w.sample("infill_templates_created_total", {}, double(m.templates_created));

  w.family("infill_queue_requests", "gauge", "Requests routed to a worker and not yet finished (its queue depth).");
  for (const ServiceWorkerLoad& l : m.loads)
    w.sample("infill_queue_requests", {{"device", l.device}, {"worker", std::to_string(l.worker)}}, double(l.load.requests));
  w.family("infill_queue_backlog_seconds", "gauge", "Predicted compute time of everything a worker holds.");
  for (const ServiceWorkerLoad& l : m.loads)
    w.sample("infill_queue_backlog_seconds", {{"device", l.device}, {"worker", std::to_string(l.worker)}},
             l.load.backlog_ms / 1000.0);

  auto worker_labels = [](const ServiceWorkerMetrics& mw) {
    return Labels{{"device", mw.worker.device}, {"worker", std::to_string(mw.worker.index)}};
  };
  struct Counter {
    const char* name;
    const char* help;
    uint64_t WorkerMetrics::*field;
  };
  for (const Counter& c : {Counter{"infill_worker_steps_total", "Batched denoising steps run.", &WorkerMetrics::steps},
                           Counter{"infill_worker_failed_steps_total", "Steps whose forward failed (their requests failed).",
                                   &WorkerMetrics::failed_steps},
                           Counter{"infill_worker_rerouted_total",
                                   "Edits handed to another worker after this one's device failed for good.",
                                   &WorkerMetrics::rerouted},
                           Counter{"infill_worker_prepare_steps_total", "Prepare-run slices (one full denoising step each).",
                                   &WorkerMetrics::prepare_steps},
                           Counter{"infill_worker_prepare_steps_parallel_total",
                                   "Prepare steps this worker led in sequence parallel over other devices too.",
                                   &WorkerMetrics::prepare_steps_parallel},
                           Counter{"infill_worker_steps_parallel_total",
                                   "Steps of a whole-sequence edit this worker led in sequence parallel over other devices too.",
                                   &WorkerMetrics::steps_parallel},
                           Counter{"infill_worker_steps_halves_split_total",
                                   "Guided steps whose two halves ran at once on this worker's device and another.",
                                   &WorkerMetrics::steps_halves_split},
                           Counter{"infill_worker_team_shares_total",
                                   "Shares of other workers' sequence-parallel steps this worker's device ran.",
                                   &WorkerMetrics::team_shares},
                           Counter{"infill_worker_team_holds_total",
                                   "Steps the device team held back: a round while this worker's device served another's step, "
                                   "or until the devices planned for the step ended others' steps.",
                                   &WorkerMetrics::team_holds},
                           Counter{"infill_worker_requests_advanced_total", "Request-steps run (sum of batch sizes).",
                                   &WorkerMetrics::requests_advanced}}) {
    w.family(c.name, "counter", c.help);
    for (const ServiceWorkerMetrics& mw : m.workers) w.sample(c.name, worker_labels(mw), double(mw.worker.*c.field));
  }
  w.family("infill_worker_model_steps_total", "counter", "Batched steps that ran a forward of the model.");
  for (const ServiceWorkerMetrics& mw : m.workers) {
    for (const auto& [model, steps] : mw.worker.steps_by_model)
      w.sample("infill_worker_model_steps_total", with(worker_labels(mw), {{"model", model}}), double(steps));
  }
  // The step graphs (CUDA graphs of masked rounds) of each model on a GPU worker.
  struct GraphFigure {
    const char* name;
    const char* type;
    const char* help;
    int64_t StepGraphStats::*field;
  };
  for (const GraphFigure& g :
       {GraphFigure{"infill_step_graphs", "gauge", "Step graphs held (one per round shape).", &StepGraphStats::graphs},
        GraphFigure{"infill_step_graph_bytes", "gauge", "Device bytes the step graphs hold.", &StepGraphStats::bytes},
        GraphFigure{"infill_step_graph_budget_bytes", "gauge", "Their budget (step_graph_bytes).", &StepGraphStats::budget_bytes},
        GraphFigure{"infill_step_graph_recorded_total", "counter", "Step graphs recorded.", &StepGraphStats::recorded},
        GraphFigure{"infill_step_graph_replays_total", "counter", "Rounds replayed through a recorded graph.",
                    &StepGraphStats::replayed},
        GraphFigure{"infill_step_graph_evictions_total", "counter", "Step graphs dropped for the budget or for a deleted adapter they held.",
                    &StepGraphStats::evicted},
        GraphFigure{"infill_step_graph_eager_rounds_total", "counter",
                    "Rounds run eagerly: a shape no graph takes (full steps, prepare runs, rows above 1024) or whose "
                    "recording failed.",
                    &StepGraphStats::eager_rounds},
        GraphFigure{"infill_step_graph_failed_recordings_total", "counter",
                    "Recordings that failed (out of device memory): their shapes run eagerly, no edit fails.",
                    &StepGraphStats::failed_recordings}}) {
    w.family(g.name, g.type, g.help);
    for (const ServiceWorkerMetrics& mw : m.workers) {
      for (const auto& [model, stats] : mw.worker.step_graphs_by_model)
        w.sample(g.name, with(worker_labels(mw), {{"model", model}}), double(stats.*g.field));
    }
  }
  w.family("infill_codec_host_fallbacks_total", "counter",
           "Codec calls (template encodes, result and preview decodes) run on the codec's CPU copy because the GPU was "
           "out of memory: slower, and no edit failed.");
  for (const ServiceWorkerMetrics& mw : m.workers) {
    for (const auto& [model, n] : mw.worker.codec_host_fallbacks_by_model)
      w.sample("infill_codec_host_fallbacks_total", with(worker_labels(mw), {{"model", model}}), double(n));
  }
  w.family("infill_worker_in_service", "gauge", "1 while the worker takes edits, 0 after its device failed for good.");
  for (const ServiceWorkerMetrics& mw : m.workers)
    w.sample("infill_worker_in_service", worker_labels(mw), mw.worker.in_service ? 1.0 : 0.0);
  w.family("infill_device_in_service", "gauge",
           "1 while the device serves (loaded, a worker of it in service), 0 when it was left out at load or failed.");
  for (const ServiceDevice& d : m.devices) w.sample("infill_device_in_service", {{"device", d.device}}, d.in_service ? 1.0 : 0.0);
  w.family("infill_router_routed_total", "counter",
           "Edits the router sent to the worker, by why: template_locality (it held the template's entry), "
           "live_client (the live client's earlier edits ran there), least_loaded.");
  for (const ServiceWorkerMetrics& mw : m.workers) {
    for (RouteReason r : {RouteReason::kLeastLoaded, RouteReason::kTemplateLocality, RouteReason::kLiveClient}) {
      const auto it = mw.worker.routed.find(route_reason_name(r));
      w.sample("infill_router_routed_total", with(worker_labels(mw), {{"reason", route_reason_name(r)}}),
               it == mw.worker.routed.end() ? 0.0 : double(it->second));
    }
  }
  w.family("infill_router_locality_misses_total", "counter",
           "Edits of a template whose entry the worker held that the router sent elsewhere.");
  for (const ServiceWorkerMetrics& mw : m.workers)
    w.sample("infill_router_locality_misses_total", worker_labels(mw), double(mw.worker.locality_missed));
  w.family("infill_worker_busy_ratio", "gauge", "Share of the worker's uptime spent on steps, prepare slices and scheduling.");
  for (const ServiceWorkerMetrics& mw : m.workers) w.sample("infill_worker_busy_ratio", worker_labels(mw), mw.worker.utilisation());

  w.family("infill_step_duration_seconds", "histogram",
           "Whole step-loop time of a batched step: scheduling, packing, forward and sampler updates.");
  for (const ServiceWorkerMetrics& mw : m.workers) {
    const WorkerMetrics& wm = mw.worker;
    const Labels base = worker_labels(mw);
    uint64_t cumulative = 0;
    for (size_t b = 0; b < WorkerMetrics::kStepSecondsBounds.size(); ++b) {
      cumulative += wm.step_seconds_buckets[b];
      char le[32];
      std::snprintf(le, sizeof le, "%g", WorkerMetrics::kStepSecondsBounds[b]);
      w.sample("infill_step_duration_seconds_bucket", with(base, {{"le", le}}), double(cumulative));
    }
    cumulative += wm.step_seconds_buckets.back();
    w.sample("infill_step_duration_seconds_bucket", with(base, {{"le", "+Inf"}}), double(cumulative));
    w.sample("infill_step_duration_seconds_sum", base, wm.step_seconds_sum);
    w.sample("infill_step_duration_seconds_count", base, double(cumulative));
  }

  const ActivationStoreStats& c = m.cache;
  w.family("infill_cache_bytes", "gauge", "Bytes of cached template activations, by tier.");
  w.sample("infill_cache_bytes", {{"tier", "ram"}}, double(c.ram_bytes));
  w.sample("infill_cache_bytes", {{"tier", "disk"}}, double(c.disk_bytes));
  w.family("infill_cache_entries", "gauge", "Cached template activation entries, by tier.");
  w.sample("infill_cache_entries", {{"tier", "ram"}}, double(c.ram_entries));
  w.sample("infill_cache_entries", {{"tier", "disk"}}, double(c.disk_entries));
  w.family("infill_cache_hits_total", "counter", "Cache lookups answered, by the tier that answered.");
  w.sample("infill_cache_hits_total", {{"tier", "ram"}}, double(c.hits_ram));
  w.sample("infill_cache_hits_total", {{"tier", "disk"}}, double(c.hits_disk));
  w.family("infill_cache_misses_total", "counter", "Cache lookups that found nothing usable.");
  w.sample("infill_cache_misses_total", {}, double(c.misses));
  w.family("infill_cache_evictions_total", "counter",
           "Entries leaving a tier: RAM victims moved to disk or dropped, disk files deleted for the budget or as corrupt.");
  w.sample("infill_cache_evictions_total", {{"from", "ram"}, {"outcome", "to_disk"}}, double(c.evictions_to_disk));
  w.sample("infill_cache_evictions_total", {{"from", "ram"}, {"outcome", "dropped"}}, double(c.evictions_dropped));
  w.sample("infill_cache_evictions_total", {{"from", "disk"}, {"outcome", "budget"}}, double(c.disk_evictions));
  w.sample("infill_cache_evictions_total", {{"from", "disk"}, {"outcome", "corrupt"}}, double(c.corrupt_dropped));
  w.family("infill_cache_promotions_total", "counter", "Disk hits copied into the RAM tier.");
  w.sample("infill_cache_promotions_total", {}, double(c.promotions));

  const AdapterStoreStats& a = m.adapters;
  w.family("infill_adapter_files", "gauge", "LoRA files in the adapter store.");
  w.sample("infill_adapter_files", {}, double(a.files));
  const std::pair<const char*, const AdapterTierStats*> tiers[] = {{"host", &a.host}, {"device", &a.device}};
  w.family("infill_adapter_bytes", "gauge", "Bytes of LoRAs held in memory, by tier (host: as read; device: a GPU model's copies).");
  for (const auto& [name, t] : tiers) w.sample("infill_adapter_bytes", {{"tier", name}}, double(t->bytes));
  w.family("infill_adapter_hits_total", "counter", "Adapter lookups a tier answered.");
  for (const auto& [name, t] : tiers) w.sample("infill_adapter_hits_total", {{"tier", name}}, double(t->hits));
  w.family("infill_adapter_misses_total", "counter", "Adapter lookups a tier could not answer (host: a file read; device: a copy).");
  for (const auto& [name, t] : tiers) w.sample("infill_adapter_misses_total", {{"tier", name}}, double(t->misses));
  w.family("infill_adapter_evictions_total", "counter", "Adapters leaving a tier for its byte budget.");
  for (const auto& [name, t] : tiers) w.sample("infill_adapter_evictions_total", {{"tier", name}}, double(t->evictions));

  // CPU workers keep weights, the RAM tier and activations in the process's memory; a GPU's
  // memory in use is what libtorch's caching allocator holds there (its tensors and the free
  // blocks it keeps for them).
  std::vector<const ServiceDevice*> gpus;
  for (const ServiceDevice& d : m.devices)
    if (d.memory) gpus.push_back(&d);
  if (m.resident_bytes >= 0 || !gpus.empty()) {
    w.family("infill_device_memory_bytes", "gauge",
             "Memory in use on each compute device (the CPU: the process's resident set; a GPU: "
             "what the caching allocator holds there).");
    if (m.resident_bytes >= 0)
      w.sample("infill_device_memory_bytes", {{"device", "cpu"}}, double(m.resident_bytes));
    for (const ServiceDevice* d : gpus)
      w.sample("infill_device_memory_bytes", {{"device", d->device}},
               double(d->memory->reserved_bytes));
  }
  if (!gpus.empty()) {
    w.family("infill_device_memory_allocated_bytes", "gauge",
             "Bytes of this process's tensors on each GPU.");
    for (const ServiceDevice* d : gpus)
      w.sample("infill_device_memory_allocated_bytes", {{"device", d->device}},
               double(d->memory->allocated_bytes));
    w.family("infill_device_memory_free_bytes", "gauge",
             "Free memory on each GPU, as its driver says (every process counted).");
    for (const ServiceDevice* d : gpus)
      w.sample("infill_device_memory_free_bytes", {{"device", d->device}},
               double(d->memory->free_bytes));
    w.family("infill_device_memory_total_bytes", "gauge", "Memory of each GPU.");
    for (const ServiceDevice* d : gpus)
      w.sample("infill_device_memory_total_bytes", {{"device", d->device}},
               double(d->memory->total_bytes));
  }
  if (m.team) {
    // The device team's planner (serving/team_planner.h): how it shares steps out.
    const TeamPlannerMetrics& p = m.team->planner;
    w.family("infill_team_rounds_total", "counter", "Rounds the device team's planner planned.");
    w.sample("infill_team_rounds_total", {}, double(p.rounds));
    w.family("infill_team_decisions_total", "counter",
             "Steps the device team's planner placed, by Ulysses degree (1: on the asking device alone or halves split).");
    for (const auto& [degree, count] : p.by_degree)
      w.sample("infill_team_decisions_total", {{"degree", std::to_string(degree)}}, double(count));
    w.family("infill_team_split_decisions_total", "counter", "Guided steps whose halves the planner split over two devices.");
    w.sample("infill_team_split_decisions_total", {}, double(p.split));
    w.family("infill_team_short_of_plan_total", "counter",
             "Steps that ran on fewer devices than planned (a planned device still busy).");
    w.sample("infill_team_short_of_plan_total", {}, double(p.short_of_plan));
    w.family("infill_team_held_total", "counter",
             "Steps the planner held back a round, their device given to another request's step.");
    w.sample("infill_team_held_total", {}, double(p.held));
    w.family("infill_team_awaited_total", "counter",
             "Steps held until their planned devices ended others' steps (sooner than running on fewer).");
    w.sample("infill_team_awaited_total", {}, double(p.awaited));
    w.family("infill_team_wakes_total", "counter",
             "Such waits ended early: their planned devices came free before the predicted time.");
    w.sample("infill_team_wakes_total", {}, double(m.team->wakes));
    if (!p.correction.empty()) {
      w.family("infill_team_step_correction", "gauge",
               "Measured over predicted time of the team's shared steps, by mode (d<degree> or split).");
      for (const auto& [mode, factor] : p.correction) w.sample("infill_team_step_correction", {{"mode", mode}}, factor);
    }
    w.family("infill_team_groups", "gauge", "Process groups the device team holds.");
    w.sample("infill_team_groups", {}, double(m.team->groups));
    w.family("infill_team_group_failures_total", "counter", "Process groups the team could not make (the step ran alone).");
    w.sample("infill_team_group_failures_total", {}, double(m.team->group_failures));
  }
  if (m.resident_bytes >= 0) {
    w.family("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.");
    w.sample("process_resident_memory_bytes", {}, double(m.resident_bytes));
  }
  w.family("infill_journal_pending_writes", "gauge", "Journal writes queued on the journal thread, not yet committed.");
  w.sample("infill_journal_pending_writes", {}, double(m.journal_pending));
  w.family("infill_uptime_seconds", "gauge", "Seconds since the engine service was created.");
  w.sample("infill_uptime_seconds", {}, m.uptime_s);
  return w.take();
}

}  // namespace infill
