#pragma once
/// A memory-mapped, validating reader for the safetensors format (torch-free).
///
/// Format: 8-byte little-endian header length N, N bytes of JSON header
/// {"name": {"dtype": "F16", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
/// then the data section. Offsets are relative to the data section.
///
/// `open` checks everything before any tensor is used: the file is at least 8 bytes, N does
/// not run past the end, the header is valid JSON of the expected shape, every dtype is
/// known, begin <= end <= data size, end - begin == product(shape) * dtype size, and no two
/// tensors overlap. A file that fails any check is rejected with a Status naming the file,
/// the tensor and what was expected. Threading: an open file is immutable; share freely.

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace infill {

/// Element types a weight file may hold. F32, F16 and BF16 convert to compute tensors; the
/// FP8 types (F8_E4M3, F8_E5M2: FP8 checkpoints) are decoded with their scales
/// (model/float8_checkpoint.h); the others are recognised so that errors can name them.
enum class DType {
  kF32 = 1,
  kF16 = 2,
  kBF16 = 3,
  kF64 = 4,
  kI64 = 5,
  kI32 = 6,
  kI16 = 7,
  kI8 = 8,
  kU8 = 9,
  kBool = 10,
  kF8E4M3 = 11,
  kF8E5M2 = 12
};

/// "F32", "F16", ... as written in safetensors headers.
const char* dtype_name(DType dtype);
/// Size of one element in bytes.
size_t dtype_size(DType dtype);

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  ///< byte offset into the data section
  uint64_t end = 0;    ///< one past the last byte
  int64_t numel() const;
};

class SafetensorsFile {
 public:
  /// Maps and validates `path`. The mapping lives as long as any copy of the returned object.
  static Result<SafetensorsFile> open(const std::string& path);

  const std::string& path() const { return path_; }
  /// Tensors in header order.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  /// nullptr when absent.
  const TensorInfo* find(std::string_view name) const;
  /// The raw bytes of one tensor, valid while this object (or a copy) lives.
  std::span<const std::byte> bytes(const TensorInfo& info) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// Every byte of the file (header and data), e.g. to hash it; valid while this object lives.
  std::span<const std::byte> file_bytes() const;

 private:
  struct Mapping;
  std::string path_;
  std::shared_ptr<const Mapping> mapping_;
  const std::byte* data_ = nullptr;  // start of the data section inside the mapping
  uint64_t data_bytes_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace infill
