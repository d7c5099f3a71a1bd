#include "model/file_identity.h"

#include <algorithm>
#include <fstream>

#include "common/hash.h"

namespace infill {

Result<uint64_t> file_identity(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return not_found("weight file " + path + " cannot be opened");
  const std::streamoff size = in.tellg();
  constexpr std::streamoff kChunk = 64 * 1024;
  std::string buffer(static_cast<size_t>(std::min(size, kChunk)), '\0');
  in.seekg(0);
  in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
  uint64_t h = fnv1a64(buffer) ^ static_cast<uint64_t>(size);
  if (size > kChunk) {
    in.seekg(size - std::min(size - kChunk, kChunk));
    std::string tail(static_cast<size_t>(std::min(size - kChunk, kChunk)), '\0');
    in.read(tail.data(), static_cast<std::streamsize>(tail.size()));
    h = h * 1099511628211ull ^ fnv1a64(tail);
  }
  return h;
}

Result<uint64_t> files_identity(const std::vector<std::string>& paths) {
  uint64_t identity = 0;
  for (const std::string& path : paths) {
    INFILL_ASSIGN_OR_RETURN(uint64_t id, file_identity(path));
    identity = identity * 1099511628211ull ^ id;
  }
  return identity;
}

}  // namespace infill
