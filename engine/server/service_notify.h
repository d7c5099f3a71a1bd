#pragma once
/// Tells the service manager how the engine is doing (sd_notify of libsystemd): READY=1 once
/// the model is loaded (the unit is Type=notify, so `systemctl --user start` returns when
/// edits can run), STOPPING=1 on SIGTERM, and a STATUS= line that `systemctl status` shows.
/// Without NOTIFY_SOCKET (not started by systemd) every call does nothing. Torch-free.

#include <string_view>

namespace infill {

void notify_ready(std::string_view status);
void notify_stopping(std::string_view status);
void notify_status(std::string_view status);

}  // namespace infill
