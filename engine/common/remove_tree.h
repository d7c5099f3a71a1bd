#pragma once
/// Removes a file or a directory tree, as `rm -rf` does.
///
/// Not std::filesystem::remove_all: pip torch's libtorch.so (2.11) exports its own copy of
/// remove_all(path, error_code&), and a process linked against it binds there and jumps to a
/// null pointer (seen on a GPU machine with torch 2.11.0+cu130). nftw is plain libc.

#include <string>

namespace infill {

/// Removes `path` and everything below it without following symbolic links. A missing path
/// is not an error. Returns false when something could not be removed (errno tells why).
bool remove_tree(const std::string& path);

}  // namespace infill
