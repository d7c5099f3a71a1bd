#include "cache/host_memory.h"

#include <cstdlib>
#include <new>

namespace infill {

HostBuffer allocate_plain_host(size_t bytes) {
  // Rounded up to the alignment, as std::aligned_alloc requires.
  const size_t rounded = bytes == 0 ? 64 : (bytes + 63) / 64 * 64;
  void* data = std::aligned_alloc(64, rounded);
  if (data == nullptr) throw std::bad_alloc();
  return HostBuffer(data, [](void* p) { std::free(p); });
}

}  // namespace infill
