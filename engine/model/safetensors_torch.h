#pragma once
/// Conversions between safetensors files and libtorch tensors. Kept apart from the reader so
/// that torch-free code (and its tests) can use the reader alone.

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "common/status.h"
#include "model/safetensors.h"

namespace infill {

/// Copies tensor `name` into a new contiguous float32 CPU tensor.
/// Errors: not_found (missing name), invalid_argument (dtype not F32/F16/BF16, or shape not
/// `expected_shape` when it is non-empty: "blocks.3.attn.qkv.weight is [1152, 384], expected
/// [1152, 385]"), corrupt_data (a NaN or infinite value, naming the tensor and the index).
Result<at::Tensor> load_float_tensor(const SafetensorsFile& file, const std::string& name,
                                     const std::vector<int64_t>& expected_shape = {});

/// Tensor `name` in its stored dtype (F32, F16 or BF16), without a float copy: a read-only view
/// of the file's mapping when the data is aligned for its element type (the view keeps the
/// mapping alive; writing through it is a programming error), else a copy. Checks the shape
/// as load_float_tensor does and refuses NaN or infinite values (corrupt_data naming the
/// tensor and the flat index), so large checkpoints load without a float32 copy of the model.
Result<at::Tensor> load_stored_tensor(const SafetensorsFile& file, const std::string& name,
                                      const std::vector<int64_t>& expected_shape = {});

/// Writes tensors (F32, F16 or BF16, CPU) in header order plus string metadata, atomically
/// (temporary file + rename).
Status write_safetensors(const std::string& path,
                         const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                         const std::map<std::string, std::string>& metadata = {});

}  // namespace infill
