#pragma once
/// A cheap identity of a weight file, part of a model's id and so of every cache key: the
/// activation cache's disk tier outlives the process, and a model retrained into the same
/// folder must not read the K/V its previous weights wrote. Reads at most 128 KiB per file.

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace infill {

/// The file's size and the hash of its first 64 KiB (a safetensors header with every name,
/// shape and offset) and last 64 KiB. not_found naming the file when it cannot be opened.
Result<uint64_t> file_identity(const std::string& path);

/// The identities of `paths` combined in order.
Result<uint64_t> files_identity(const std::vector<std::string>& paths);

}  // namespace infill
