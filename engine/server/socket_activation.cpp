#include "server/socket_activation.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>

#include <cstring>

namespace infill {

Result<ActivatedSockets> take_activated_sockets() {
  // unset_environment = 1: the variables describe this process only.
  const int n = sd_listen_fds(1);
  if (n < 0) return invalid_argument(std::string("LISTEN_FDS from the service manager is unusable: ") + std::strerror(-n));
  ActivatedSockets s;
  for (int fd = SD_LISTEN_FDS_START; fd < SD_LISTEN_FDS_START + n; ++fd) {
    const std::string which = "socket-activated descriptor " + std::to_string(fd);
    if (sd_is_socket_unix(fd, SOCK_STREAM, 1, nullptr, 0) > 0) {
      if (s.unix_fd >= 0) return invalid_argument(which + " is a second Unix socket; infill-engine serves on one");
      sockaddr_un addr{};
      socklen_t len = sizeof addr;
      if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
          len <= offsetof(sockaddr_un, sun_path) || addr.sun_path[0] == '\0')
        return invalid_argument(which + " is an unnamed or abstract Unix socket; give ListenStream= a path");
      s.unix_fd = fd;
      s.unix_path = addr.sun_path;
    } else if (sd_is_socket_inet(fd, AF_UNSPEC, SOCK_STREAM, 1, 0) > 0) {
      if (s.tcp_fd >= 0) return invalid_argument(which + " is a second TCP socket; infill-engine serves on one");
      s.tcp_fd = fd;
    } else {
      return invalid_argument(which + " is not a listening stream socket (Unix or TCP); check ListenStream= in the .socket unit");
    }
  }
  return s;
}

}  // namespace infill
