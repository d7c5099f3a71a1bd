#pragma once
// Damages cache files on purpose: flips one byte 100 bytes before the end of every regular
// file in a folder (in the last slab's data, which the checksums cover). Returns how many.
#include <filesystem>
#include <fstream>
#include <string>

namespace infill::test {

inline int flip_byte_near_end_of_files(const std::string& dir) {
  int damaged = 0;
  for (const auto& file : std::filesystem::directory_iterator(dir)) {
    if (!file.is_regular_file() || std::filesystem::file_size(file.path()) < 100) continue;
    std::fstream io(file.path(), std::ios::in | std::ios::out | std::ios::binary);
    const auto at = static_cast<std::streamoff>(std::filesystem::file_size(file.path()) - 100);
    io.seekg(at);
    const char byte = static_cast<char>(io.get());
    io.seekp(at);
    io.put(static_cast<char>(~byte));  // always a different byte
    damaged += io.good();
  }
  return damaged;
}

}  // namespace infill::test
