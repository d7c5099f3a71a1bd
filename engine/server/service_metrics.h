#pragma once
/// One snapshot of what the engine service measures: its workers, queues, activation store,
/// edit ledger and process. `GET /v1/metrics` renders it as JSON (service_metrics_json) and
/// `GET /metrics` in the Prometheus text format (prometheus_metrics.h), so both always say
/// the same thing.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cache/activation_store.h"
#include "model/device_memory.h"
#include "pipeline/adapter_store_stats.h"
#include "serving/router.h"
#include "serving/serving_metrics.h"
#include "serving/team_planner.h"

namespace infill {

/// One worker: a step loop on a device, serving every loaded model.
struct ServiceWorkerMetrics {
  std::vector<std::string> models;  ///< ids of the models it serves
  WorkerMetrics worker;             ///< its device, steps (also per model), times
};

/// One device of the engine (`--device`), with or without workers.
struct ServiceDevice {
  std::string device;        ///< its label: "cpu", "cuda:1", "cpu:0"
  /// Loaded and at least one of its workers in service.
  bool in_service = false;
  std::string fault;         ///< why not: the load's error, or its workers' device fault
  std::vector<int> workers;  ///< its workers' indices (none when it was left out at load)
  /// A GPU's memory (model/device_memory.h) when it could be read; none for a CPU device, whose
  /// memory is the process's resident set (ServiceMetrics::resident_bytes).
  std::optional<DeviceMemory> memory;
};

struct ServiceWorkerLoad {
  std::string device;
  int worker = 0;  ///< the worker's index in the runtime
  WorkerLoad load;
};

struct ServiceMetrics {
  std::vector<ServiceDevice> devices;
  std::vector<ServiceWorkerMetrics> workers;
  std::vector<ServiceWorkerLoad> loads;
  /// The runtime's recent finished requests (each worker keeps a bounded window).
  std::vector<RequestMetrics> recent_requests;
  /// The device team's planner and groups (serving/device_team.h); unset without a team.
  std::optional<DeviceTeamMetrics> team;
  ActivationStoreStats cache;
  AdapterStoreStats adapters;
  int live_edits = 0;
  size_t templates = 0;
  uint64_t templates_created = 0;
  uint64_t edits_submitted = 0;
  uint64_t edits_rejected = 0;
  uint64_t edits_resumed = 0;
  /// Edits that ended since the engine started, by terminal state name (done, failed,
  /// cancelled, expired).
  std::map<std::string, uint64_t> edits_finished;
  /// Edits in the ledger now (live ones and kept results), by state name.
  std::map<std::string, uint64_t> edits_by_state;
  std::string journal_path;  ///< "" without a journal
  size_t journal_pending = 0;  ///< journal writes queued and not yet committed
  size_t results_kept = 0;
  /// The process's resident memory (/proc/self/statm); the model, the RAM tier and
  /// activations all live there on a CPU worker. -1 where it cannot be read.
  int64_t resident_bytes = -1;
  double uptime_s = 0.0;
};

/// The process's resident set in bytes, or -1.
int64_t process_resident_bytes();

/// The `GET /v1/metrics` body (documented in docs/api.md).
nlohmann::json service_metrics_json(const ServiceMetrics& m);

}  // namespace infill
