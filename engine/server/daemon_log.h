#pragma once
/// The engine's log: one plain line per event on stderr ("infill-engine: ready"). When stderr
/// is connected to journald (JOURNAL_STREAM names stderr's device and inode, as systemd sets
/// it for a service), each line starts with its syslog priority ("<3>" for errors, the
/// sd-daemon convention), so `journalctl -p err` finds the errors; anywhere else the lines
/// stay plain. Torch-free; thread-safe (one write() per line, so lines never interleave).

#include <string_view>

namespace infill {

enum class LogLevel { kError = 3, kWarning = 4, kNotice = 5, kInfo = 6 };

/// Writes "infill-engine: <text>" (one line; a newline in `text` is replaced by a space).
void log_line(LogLevel level, std::string_view text);

/// True when stderr is journald's stream (JOURNAL_STREAM matches stderr's device:inode).
bool stderr_is_journal();

}  // namespace infill
