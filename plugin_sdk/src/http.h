#pragma once
// HTTP/1.1 to the engine over a Unix socket or TCP (Boost.Beast). A call takes a kept-alive
// connection from the client's pool (each with its own io_context, so calls from many threads
// never share one) or opens a new one, and gives it back when the engine keeps it open;
// timeouts come from beast::basic_stream, which closes the socket when an operation overruns.
//
// The event stream (/v1/events, Server-Sent Events) runs as a coroutine on the client's own
// io_context instead: see run_event_stream.
// Asio headers need <utility> first under g++ 12 with Boost 1.74.
#include <utility>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "endpoint.h"
#include "status.h"

namespace infill::sdk {

class ConnectionPool;

/// A new pool of kept-alive connections (one per client; copies of its HttpConfig share it).
std::shared_ptr<ConnectionPool> make_connection_pool();

struct HttpConfig {
  Endpoint endpoint;
  std::string token;        // sent as "Authorization: Bearer" on TCP only
  std::string client_name;  // X-Infill-Client
  uint32_t connect_timeout_ms = 5000;
  uint32_t request_timeout_ms = 60000;
  /// Idle connections for reuse; null = a connection per call.
  std::shared_ptr<ConnectionPool> pool;
};

struct HttpResponse {
  int status = 0;
  std::string content_type;
  std::string body;
  int retry_after_s = 0;
};

/// One request and its answer. Transport failures (cannot connect, timeout, broken
/// connection) are errors; any HTTP status is a response. `what` names the call in messages.
Result<HttpResponse> http_call(const HttpConfig& config, const std::string& method, const std::string& target,
                               const std::string& body = {}, const std::string& content_type = {});

/// The error for a non-2xx response: code from the status, message from the engine's JSON
/// error body, prefixed by `what` ("upload of template photo.png").
Error response_error(const HttpConfig& config, const HttpResponse& response, const std::string& what);

/// Subscribes to /v1/events for config.client_name on `ioc` and reads until the stream ends.
/// `on_open` runs once the engine answered 200 and returns the reason to give up the stream
/// (ok: go on); `on_event(type, data)` runs per event. Returns the reason the stream ended
/// (never ok: a stream ends only by an error or the engine closing).
boost::asio::awaitable<Status> run_event_stream(const HttpConfig& config, uint32_t idle_timeout_ms,
                                                std::function<Status()> on_open,
                                                std::function<void(const std::string&, const std::string&)> on_event);

}  // namespace infill::sdk
