#include "model/safetensors_shards.h"

#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

namespace infill {

namespace fs = std::filesystem;

Result<std::vector<std::string>> safetensors_shards(const std::string& dir_name, const std::string& stem) {
  const fs::path dir(dir_name);
  const fs::path single = dir / (stem + ".safetensors");
  if (fs::is_regular_file(single)) return std::vector<std::string>{single.string()};
  const fs::path index = dir / (stem + ".safetensors.index.json");
  if (!fs::is_regular_file(index)) {
    return not_found(single.string() + " is missing (expected the weights, or " + index.filename().string() +
                     " listing their shards)");
  }
  std::ifstream in(index);
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    return corrupt_data(index.string() + " is not valid JSON: " + e.what());
  }
  if (!doc.contains("weight_map") || !doc["weight_map"].is_object() || doc["weight_map"].empty()) {
    return corrupt_data(index.string() + " has no \"weight_map\" object naming the shards");
  }
  std::vector<std::string> files;
  std::set<std::string> seen;
  for (const auto& [tensor, shard] : doc["weight_map"].items()) {
    if (!shard.is_string()) return corrupt_data(index.string() + ": the shard of " + tensor + " is not a file name");
    const std::string name = shard.get<std::string>();
    if (!seen.insert(name).second) continue;
    if (!fs::is_regular_file(dir / name)) {
      return not_found((dir / name).string() + " is missing (expected a shard listed in " + index.filename().string() + ")");
    }
    files.push_back((dir / name).string());
  }
  return files;
}

}  // namespace infill
