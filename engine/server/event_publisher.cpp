#include "server/event_publisher.h"

namespace infill {

void EventPublisher::set_sink(std::function<void(const ServiceEvent&)> sink) {
  std::lock_guard lock(mu_);
  sink_ = std::move(sink);
}

void EventPublisher::emit(const std::string& client, const std::string& type, nlohmann::json data) {
  data["type"] = type;
  // A prompt with invalid UTF-8 must not stop the event: replace, do not throw.
  ServiceEvent e{client, type, data.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)};
  std::lock_guard lock(mu_);
  if (sink_) sink_(e);
}

}  // namespace infill
