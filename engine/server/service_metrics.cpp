#include "server/service_metrics.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace infill {
namespace {

using nlohmann::json;

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t i = static_cast<size_t>(std::min<double>(double(v.size() - 1), std::floor(q * double(v.size() - 1) + 0.5)));
  return v[i];
}

}  // namespace

int64_t process_resident_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return -1;
  long long size_pages = 0, resident_pages = 0;
  const int n = std::fscanf(f, "%lld %lld", &size_pages, &resident_pages);
  std::fclose(f);
  if (n != 2) return -1;
  return static_cast<int64_t>(resident_pages) * static_cast<int64_t>(::sysconf(_SC_PAGESIZE));
}

json service_metrics_json(const ServiceMetrics& m) {
  json workers = json::array();
  for (const ServiceWorkerMetrics& mw : m.workers) {
    const WorkerMetrics& w = mw.worker;
    json costs = json::object();
    for (const auto& [model, c] : w.cost_by_model)
      costs[model] = {{"coefficients", c.coefficients}, {"samples", c.samples}, {"refits_adopted", c.refits_adopted},
                      {"mape", c.mape}};
    json graphs = json::object();
    for (const auto& [model, g] : w.step_graphs_by_model)
      graphs[model] = {{"graphs", g.graphs},       {"bytes", g.bytes},
                       {"budget_bytes", g.budget_bytes}, {"recorded", g.recorded},
                       {"replayed", g.replayed},   {"evicted", g.evicted},
                       {"eager_rounds", g.eager_rounds}, {"failed_recordings", g.failed_recordings},
                       {"last_failure", g.last_failure}};
    workers.push_back({{"index", w.index},
                       {"device", w.device},
                       {"in_service", w.in_service},
                       {"fault", w.fault},
                       {"models", mw.models},
                       {"steps", w.steps},
                       {"steps_by_model", w.steps_by_model},
                       {"routed", w.routed},
                       {"locality_missed", w.locality_missed},
                       {"cost_by_model", costs},
                       {"step_graphs", graphs},
                       {"codec_host_fallbacks", w.codec_host_fallbacks_by_model},
                       {"failed_steps", w.failed_steps},
                       {"rerouted", w.rerouted},
                       {"prepare_steps", w.prepare_steps},
                       {"prepare_steps_parallel", w.prepare_steps_parallel},
                       {"team_shares", w.team_shares},
                       {"team_holds", w.team_holds},
                       {"steps_parallel", w.steps_parallel},
                       {"steps_halves_split", w.steps_halves_split},
                       {"requests_advanced", w.requests_advanced},
                       {"max_batch", w.max_batch},
                       {"mean_batch", w.mean_batch()},
                       {"mean_step_ms", w.mean_step_ms()},
                       {"step_ms_total", w.step_ms_total},
                       {"prepare_ms_total", w.prepare_ms_total},
                       {"sched_ms_total", w.sched_ms_total},
                       {"pack_ms_total", w.pack_ms_total},
                       {"uptime_ms", w.uptime_ms},
                       {"utilisation", w.utilisation()}});
  }
  json devices = json::array();
  for (const ServiceDevice& d : m.devices) {
    json device = {{"device", d.device},
                   {"in_service", d.in_service},
                   {"fault", d.fault},
                   {"workers", d.workers}};
    if (d.memory) {
      device["memory"] = {{"allocated_bytes", d.memory->allocated_bytes},
                          {"reserved_bytes", d.memory->reserved_bytes},
                          {"free_bytes", d.memory->free_bytes},
                          {"total_bytes", d.memory->total_bytes}};
    }
    devices.push_back(std::move(device));
  }
  json loads = json::array();
  for (const ServiceWorkerLoad& l : m.loads)
    loads.push_back({{"worker", l.worker}, {"device", l.device}, {"requests", l.load.requests}, {"backlog_ms", l.load.backlog_ms}});
  std::vector<double> total, queue;
  size_t met = 0;
  for (const RequestMetrics& r : m.recent_requests) {
    total.push_back(r.total_ms);
    queue.push_back(r.queue_ms);
    met += r.deadline_met ? 1 : 0;
  }
  const size_t n = m.recent_requests.size();
  const ActivationStoreStats& st = m.cache;
  const auto tier = [](const AdapterTierStats& t) {
    return json{{"bytes", t.bytes},         {"budget", t.budget}, {"adapters", t.adapters},
                {"hits", t.hits},           {"misses", t.misses}, {"evictions", t.evictions}};
  };
  json team = nullptr;
  if (m.team) {
    const TeamPlannerMetrics& p = m.team->planner;
    json by_degree = json::object();
    for (const auto& [degree, count] : p.by_degree) by_degree[std::to_string(degree)] = count;
    team = {{"round_ms", p.round_ms},
            {"link",
             {{"latency_ms", p.link.all_to_all_latency_ms},
              {"gbytes_per_s", p.link.link_bytes_per_ms / 1e6},
              {"bytes_per_element", p.link.bytes_per_element}}},
            {"masked_share", m.team->masked_share},
            {"rounds", p.rounds},
            {"decisions", p.decisions},
            {"alone", p.alone},
            {"split", p.split},
            {"short_of_plan", p.short_of_plan},
            {"held", p.held},
            {"awaited", p.awaited},
            {"by_degree", by_degree},
            {"correction", p.correction},
            {"last_error", p.last_error},
            {"wakes", m.team->wakes},
            {"groups", m.team->groups},
            {"groups_made_later", m.team->groups_made_later},
            {"group_failures", m.team->group_failures},
            {"last_group_failure", m.team->last_group_failure}};
  }
  return {{"devices", devices},
          {"device_team", team},
          {"workers", workers},
          {"loads", loads},
          {"requests",
           {{"count", n},
            {"total_ms_p50", percentile(total, 0.5)},
            {"total_ms_p99", percentile(total, 0.99)},
            {"queue_ms_p50", percentile(queue, 0.5)},
            {"deadline_met_fraction", n == 0 ? 0.0 : double(met) / double(n)}}},
          {"cache",
           {{"ram_bytes", st.ram_bytes}, {"ram_entries", st.ram_entries}, {"disk_bytes", st.disk_bytes},
            {"disk_entries", st.disk_entries}, {"hits_ram", st.hits_ram}, {"hits_disk", st.hits_disk},
            {"misses", st.misses}}},
          {"adapters", {{"files", m.adapters.files}, {"host", tier(m.adapters.host)}, {"device", tier(m.adapters.device)}}},
          {"service",
           {{"live_edits", m.live_edits},
            {"templates", m.templates},
            {"templates_created", m.templates_created},
            {"edits_submitted", m.edits_submitted},
            {"edits_rejected", m.edits_rejected},
            {"edits_resumed", m.edits_resumed},
            {"edits_finished", m.edits_finished},
            {"journal", m.journal_path},
            {"journal_pending", m.journal_pending},
            {"results_kept", m.results_kept},
            {"resident_bytes", m.resident_bytes}}}};
}

}  // namespace infill
