#pragma once
// A unique temporary directory removed at the end of the scope.
#include <filesystem>
#include <random>
#include <string>

namespace infill::test {

class TempDir {
 public:
  explicit TempDir(const std::string& tag = "infill-test") {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() / (tag + "-" + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace infill::test
