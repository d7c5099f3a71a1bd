#pragma once
// A file's whole content as bytes (empty when it cannot be read), for tests that hand files
// to APIs taking bytes (templates, job outputs).
#include <cstddef>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace infill::test {

inline std::vector<std::byte> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto* first = reinterpret_cast<const std::byte*>(s.data());
  return {first, first + s.size()};
}

}  // namespace infill::test
