#pragma once
/// The engine's metrics in the Prometheus text exposition format (version 0.0.4), served as
/// `GET /metrics`: edits by state, queue depth per worker, a step-time histogram, the
/// activation store's hits, bytes and entries per tier, and the process's resident memory.
/// Names follow Prometheus conventions (base units, `_total` counters); docs/api.md lists
/// them.

#include <string>

#include "server/service_metrics.h"

namespace infill {

/// "text/plain; version=0.0.4; charset=utf-8"
extern const char* const kPrometheusContentType;

std::string prometheus_metrics_text(const ServiceMetrics& m);

}  // namespace infill
