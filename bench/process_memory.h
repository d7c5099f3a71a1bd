#pragma once
// Peak memory and page-cache control for the benchmarks that load large weight files (Linux).
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

namespace infill::bench {

/// Peak resident set (VmHWM) in bytes since the process started or the last reset_peak().
inline int64_t peak_rss_bytes() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return 0;
}

/// The resident set now by kind: anonymous (allocations), file-backed (memory-mapped weights,
/// which the kernel may drop and read again under pressure) and total, in bytes.
inline nlohmann::json rss_breakdown() {
  nlohmann::json out;
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    for (const char* field : {"VmRSS:", "RssAnon:", "RssFile:"}) {
      if (line.rfind(field, 0) == 0) out[std::string(field, std::string(field).size() - 1)] = std::stoll(line.substr(std::string(field).size())) * 1024;
    }
  }
  return out;
}

/// Starts a new peak measurement (Linux clear_refs "5").
inline void reset_peak() { std::ofstream("/proc/self/clear_refs") << "5"; }

/// Drops `path` from the page cache (posix_fadvise DONTNEED after a sync), so that the next
/// load reads the disk as a first load after boot does.
inline void drop_from_page_cache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

}  // namespace infill::bench
