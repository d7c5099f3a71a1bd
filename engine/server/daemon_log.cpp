#include "server/daemon_log.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace infill {

bool stderr_is_journal() {
  // Decided once: the variable and stderr do not change while the engine runs.
  static const bool journal = [] {
    const char* stream = std::getenv("JOURNAL_STREAM");
    if (stream == nullptr || *stream == '\0') return false;
    struct stat st {};
    if (::fstat(STDERR_FILENO, &st) != 0) return false;
    unsigned long long dev = 0, ino = 0;
    if (std::sscanf(stream, "%llu:%llu", &dev, &ino) != 2) return false;
    return dev == static_cast<unsigned long long>(st.st_dev) && ino == static_cast<unsigned long long>(st.st_ino);
  }();
  return journal;
}

void log_line(LogLevel level, std::string_view text) {
  std::string line;
  if (stderr_is_journal()) {
    line += '<';
    line += std::to_string(static_cast<int>(level));
    line += '>';
  }
  line += "infill-engine: ";
  for (const char c : text) line += c == '\n' ? ' ' : c;
  line += '\n';
  // One write: lines from several threads never interleave (stderr is unbuffered anyway).
  for (size_t done = 0; done < line.size();) {
    const ssize_t n = ::write(STDERR_FILENO, line.data() + done, line.size() - done);
    if (n <= 0) return;  // nowhere to log to: nothing to do about it
    done += static_cast<size_t>(n);
  }
}

}  // namespace infill
