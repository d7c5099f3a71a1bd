#pragma once
// A fresh directory under /tmp, removed with its content when the object dies.
#include <stdlib.h>

#include <filesystem>
#include <iterator>
#include <stdexcept>
#include <string>

#include "common/remove_tree.h"

namespace infill::test {

class TempDir {
 public:
  explicit TempDir(const std::string& tag = "infill-test") {
    std::string pattern = "/tmp/" + tag + "-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + pattern);
    path_ = pattern;
  }
  ~TempDir() { infill::remove_tree(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  /// Number of directory entries (files left behind by a failed write, say).
  size_t entries() const {
    return static_cast<size_t>(
        std::distance(std::filesystem::directory_iterator(path_), std::filesystem::directory_iterator()));
  }

 private:
  std::string path_;
};

}  // namespace infill::test
