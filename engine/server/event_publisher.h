#pragma once
/// Where an edit's events go: one sink (the HTTP server's SSE and WebSocket streams), set and
/// replaced at any time. Torch-free.
///
/// Threading: emit() is called from pool, worker and journal threads; the sink runs on the
/// caller's thread under the publisher's mutex, so set_sink({}) returns only once no call is
/// in progress (the server detaches before it goes away). The sink must not block.

#include <functional>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

namespace infill {

/// One event of one edit, for the clients of `client`.
struct ServiceEvent {
  std::string client;
  std::string type;  ///< queued, started, progress, preview, done, failed
  std::string json;  ///< the event's data: {"id":..,"type":..,...}
};

class EventPublisher {
 public:
  /// Replaces the sink; {} detaches (waits for calls in progress to return).
  void set_sink(std::function<void(const ServiceEvent&)> sink);
  /// Sends `data` with "type" set to `type` to the clients of `client`; nothing without a sink.
  void emit(const std::string& client, const std::string& type, nlohmann::json data);

 private:
  std::mutex mu_;
  std::function<void(const ServiceEvent&)> sink_;
};

}  // namespace infill
