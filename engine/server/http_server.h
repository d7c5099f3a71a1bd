#pragma once
/// The engine's HTTP/1.1 API on Boost.Asio + Boost.Beast with C++20 coroutines: a Unix socket
/// for local clients and, optionally, TCP for remote ones (bearer token required there).
/// Routes, error format and events are documented in docs/api.md.
///
/// Threading: one io_context on one thread of its own runs every connection; work that
/// decodes images or touches the model goes to the EngineService's pool, and its answer
/// comes back to the io thread. The public methods are safe from any thread except the io
/// thread itself. No exception leaves a connection's coroutine.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "server/engine_service.h"
#include "server/server_config.h"

namespace infill {

struct HttpServerOptions {
  std::string socket_path;  ///< "" = no Unix socket; its parent is created with mode 0700
  std::string tcp_host;     ///< "" = no TCP listener
  uint16_t tcp_port = 0;    ///< 0 = any free port (see HttpServer::tcp_port)
  /// Required on every TCP route except /health as "Authorization: Bearer <token>";
  /// must be non-empty when tcp_host is set.
  std::string token;
  /// Requests with an Origin header not in this list are refused (403).
  std::vector<std::string> allowed_origins;
  ServerLimits limits;
  /// Listening sockets passed by socket activation (socket_activation.h), used instead of
  /// binding: the Unix one in place of socket_path (which then only names it; the server
  /// leaves the file to the service manager), the TCP one in place of tcp_host:tcp_port
  /// (the token is still required). -1 = none.
  int activated_unix_fd = -1;
  int activated_tcp_fd = -1;
};

class HttpServer {
 public:
  /// Binds the listeners and starts the io thread. Errors: a socket path in use by a live
  /// engine, a bind failure, TCP without a token. `service` must outlive the server.
  static Result<std::unique_ptr<HttpServer>> start(EngineService& service, HttpServerOptions options);
  /// stop().
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  /// The bound TCP port (0 without TCP).
  uint16_t tcp_port() const;
  const std::string& socket_path() const;
  /// Closes the listeners (and removes the socket file); open connections carry on.
  void stop_accepting();
  /// Closes every connection and joins the io thread. Idempotent.
  void stop();
  /// Connections open now (for tests and metrics).
  int connections() const;
  /// Connections accepted since start (a client that reuses connections adds few).
  uint64_t accepted_connections() const;

 private:
  HttpServer() = default;
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace infill
