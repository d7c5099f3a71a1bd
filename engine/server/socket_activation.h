#pragma once
/// Listening sockets handed over by systemd socket activation (the `LISTEN_FDS` protocol, as
/// `infill-engine.socket` or `systemd-socket-activate` pass them): the engine serves on them
/// instead of binding its own, so the socket exists before the engine starts and connections
/// made while it loads wait in the backlog instead of failing.

#include <string>

#include "common/status.h"

namespace infill {

struct ActivatedSockets {
  int unix_fd = -1;       ///< a listening Unix stream socket, or -1
  std::string unix_path;  ///< its path (from getsockname)
  int tcp_fd = -1;        ///< a listening TCP socket (IPv4 or IPv6), or -1
  bool any() const { return unix_fd >= 0 || tcp_fd >= 0; }
};

/// Takes the sockets passed to this process and unsets LISTEN_PID, LISTEN_FDS and
/// LISTEN_FDNAMES (so children do not see them). Nothing passed: an empty result. Errors name
/// the descriptor: a socket that is not a listening stream socket of either kind, a second
/// socket of a kind, an abstract or unnamed Unix socket.
Result<ActivatedSockets> take_activated_sockets();

}  // namespace infill
