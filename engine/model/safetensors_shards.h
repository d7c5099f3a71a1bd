#pragma once
/// The weight files of a Hugging Face component folder (`transformer/`, `vae/`,
/// `text_encoder/`): `stem`.safetensors, or the shards its `stem`.safetensors.index.json lists.
/// Torch-free; pure apart from reading the folder.

#include <string>
#include <vector>

#include "common/status.h"

namespace infill {

/// `dir`/`stem`.safetensors when it exists, else every shard named by the index's
/// "weight_map" (each once), each checked to exist. Errors name the missing or malformed file.
Result<std::vector<std::string>> safetensors_shards(const std::string& dir, const std::string& stem);

}  // namespace infill
