#include "server/service_notify.h"

#include <systemd/sd-daemon.h>

#include <string>

namespace infill {
namespace {

void notify(const std::string& state) {
  // unset_environment = 0: a later call (STOPPING after READY) still finds the socket.
  (void)sd_notify(0, state.c_str());
}

std::string status_line(std::string_view status) {
  std::string s(status);
  for (char& c : s)
    if (c == '\n') c = ' ';
  return "STATUS=" + s;
}

}  // namespace

void notify_ready(std::string_view status) { notify("READY=1\n" + status_line(status)); }
void notify_stopping(std::string_view status) { notify("STOPPING=1\n" + status_line(status)); }
void notify_status(std::string_view status) { notify(status_line(status)); }

}  // namespace infill
