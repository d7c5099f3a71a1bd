#include "support/catch.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "common/remove_tree.h"

namespace fs = std::filesystem;

TEST_CASE("remove_tree removes a tree as rm -rf does, never following links", "[common]") {
  char pattern[] = "/tmp/infill-remove-tree-XXXXXX";
  REQUIRE(::mkdtemp(pattern) != nullptr);
  const std::string root = pattern;
  char outside_pattern[] = "/tmp/infill-remove-tree-outside-XXXXXX";
  REQUIRE(::mkdtemp(outside_pattern) != nullptr);
  const std::string outside = outside_pattern;
  std::ofstream(outside + "/keep.txt") << "not below the tree";

  fs::create_directories(root + "/a/b/c");
  std::ofstream(root + "/a/b/c/file.bin") << "x";
  std::ofstream(root + "/top.txt") << "y";
  REQUIRE(::symlink(outside.c_str(), (root + "/a/link").c_str()) == 0);
  ::chmod((root + "/a/b").c_str(), 0700);

  CHECK(infill::remove_tree(root));
  CHECK_FALSE(fs::exists(root));
  // The link is removed, not what it points to.
  CHECK(fs::exists(outside + "/keep.txt"));
  // A missing path is not an error; a single file is removed.
  CHECK(infill::remove_tree(root));
  CHECK(infill::remove_tree(outside + "/keep.txt"));
  CHECK_FALSE(fs::exists(outside + "/keep.txt"));
  CHECK(infill::remove_tree(outside));
  CHECK_FALSE(fs::exists(outside));
}
