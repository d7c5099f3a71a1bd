#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <unordered_set>

#include <nlohmann/json.hpp>

namespace infill {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian data; a big-endian host would need byte swaps");

namespace {

using nlohmann::json;

// Same bound as the reference Rust implementation: real headers are kilobytes, so anything
// larger is a damaged length field, and refusing it early avoids parsing garbage for minutes.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct DTypeEntry {
  DType dtype;
  const char* name;
  size_t size;
};

constexpr DTypeEntry kDTypes[] = {
    {DType::kF32, "F32", 4},   {DType::kF16, "F16", 2}, {DType::kBF16, "BF16", 2},
    {DType::kF64, "F64", 8},   {DType::kI64, "I64", 8}, {DType::kI32, "I32", 4},
    {DType::kI16, "I16", 2},   {DType::kI8, "I8", 1},   {DType::kU8, "U8", 1},
    {DType::kBool, "BOOL", 1}, {DType::kF8E4M3, "F8_E4M3", 1}, {DType::kF8E5M2, "F8_E5M2", 1},
};

const DTypeEntry* find_dtype(std::string_view name) {
  for (const DTypeEntry& e : kDTypes) {
    if (name == e.name) return &e;
  }
  return nullptr;
}

std::string errno_text() { return std::strerror(errno); }

// Reads a JSON integer that must be a non-negative int64. `what` names the field in errors.
Status read_count(const json& value, const std::string& where, const std::string& what,
                  int64_t* out) {
  if (value.is_number_unsigned()) {
    const uint64_t v = value.get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return corrupt_data(where + ": " + what + " " + std::to_string(v) + " is too large");
    }
    *out = static_cast<int64_t>(v);
    return {};
  }
  if (value.is_number_integer()) {
    const int64_t v = value.get<int64_t>();
    if (v < 0) {
      return corrupt_data(where + ": " + what + " is negative (" + std::to_string(v) +
                          "), expected >= 0");
    }
    *out = v;
    return {};
  }
  return corrupt_data(where + ": " + what + " is a " + value.type_name() + ", expected an integer");
}

}  // namespace

const char* dtype_name(DType dtype) {
  for (const DTypeEntry& e : kDTypes) {
    if (e.dtype == dtype) return e.name;
  }
  return "unknown";
}

size_t dtype_size(DType dtype) {
  for (const DTypeEntry& e : kDTypes) {
    if (e.dtype == dtype) return e.size;
  }
  return 0;
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

struct SafetensorsFile::Mapping {
  void* addr = nullptr;
  size_t bytes = 0;
  Mapping(void* a, size_t b) : addr(a), bytes(b) {}
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (addr != nullptr) munmap(addr, bytes);
  }
};

std::span<const std::byte> SafetensorsFile::file_bytes() const {
  if (!mapping_) return {};
  return {static_cast<const std::byte*>(mapping_->addr), mapping_->bytes};
}

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return not_found(path + ": no such file");
    return io_error(path + ": cannot open: " + errno_text());
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    Status s = io_error(path + ": cannot stat: " + errno_text());
    ::close(fd);
    return s;
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return invalid_argument(path + ": not a regular file");
  }
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);
  if (file_bytes < 8) {
    ::close(fd);
    return corrupt_data(path + ": file is " + std::to_string(file_bytes) +
                        " bytes, a safetensors file has at least the 8-byte header length");
  }
  void* addr = mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  // The mapping keeps the file referenced; the descriptor is no longer needed either way.
  const int map_errno = errno;
  ::close(fd);
  if (addr == MAP_FAILED) {
    return io_error(path + ": cannot mmap " + std::to_string(file_bytes) +
                    " bytes: " + std::strerror(map_errno));
  }

  SafetensorsFile file;
  file.path_ = path;
  file.mapping_ = std::make_shared<const Mapping>(addr, file_bytes);
  const auto* base = static_cast<const std::byte*>(addr);

  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, base, 8);
  if (header_bytes > kMaxHeaderBytes) {
    return corrupt_data(path + ": header length " + std::to_string(header_bytes) +
                        " is absurdly large (limit " + std::to_string(kMaxHeaderBytes) + ")");
  }
  if (header_bytes > file_bytes - 8) {
    return corrupt_data(path + ": header length " + std::to_string(header_bytes) +
                        " runs past the end of the file (" + std::to_string(file_bytes - 8) +
                        " bytes after the length field)");
  }
  file.data_ = base + 8 + header_bytes;
  file.data_bytes_ = file_bytes - 8 - header_bytes;

  // nlohmann's object keeps keys sorted and lets a repeated key overwrite the first, so the
  // header order and duplicates are recorded from the parser's key events at depth 1.
  std::vector<std::string> keys;
  std::unordered_set<std::string> seen;
  std::string duplicate;
  const char* header_begin = reinterpret_cast<const char*>(base + 8);
  json header = json::parse(
      header_begin, header_begin + header_bytes,
      [&](int depth, json::parse_event_t event, json& parsed) {
        if (depth == 1 && event == json::parse_event_t::key && parsed.is_string()) {
          const std::string& key = parsed.get_ref<const std::string&>();
          if (!seen.insert(key).second && duplicate.empty()) duplicate = key;
          keys.push_back(key);
        }
        return true;
      },
      /*allow_exceptions=*/false);
  if (header.is_discarded()) {
    return corrupt_data(path + ": header (" + std::to_string(header_bytes) +
                        " bytes) is not valid JSON");
  }
  if (!header.is_object()) {
    return corrupt_data(path + ": header is a JSON " + header.type_name() + ", expected an object");
  }
  if (!duplicate.empty()) {
    return corrupt_data(path + ": tensor '" + duplicate + "' appears twice in the header");
  }

  for (const std::string& name : keys) {
    const json& entry = header.at(name);
    if (name == "__metadata__") {
      if (!entry.is_object()) {
        return corrupt_data(path + ": __metadata__ is a " + entry.type_name() +
                            ", expected an object of strings");
      }
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) {
          return corrupt_data(path + ": __metadata__['" + key + "'] is a " + value.type_name() +
                              ", expected a string");
        }
        file.metadata_[key] = value.get<std::string>();
      }
      continue;
    }
    const std::string where = path + ": tensor '" + name + "'";
    if (!entry.is_object()) {
      return corrupt_data(where + " is a " + entry.type_name() + ", expected an object");
    }
    TensorInfo info;
    info.name = name;

    const auto dtype_it = entry.find("dtype");
    if (dtype_it == entry.end()) return corrupt_data(where + " has no dtype");
    if (!dtype_it->is_string()) {
      return corrupt_data(where + ": dtype is a " + dtype_it->type_name() + ", expected a string");
    }
    const std::string& dtype_text = dtype_it->get_ref<const std::string&>();
    const DTypeEntry* dtype = find_dtype(dtype_text);
    if (dtype == nullptr) {
      return corrupt_data(where + ": unknown dtype '" + dtype_text +
                          "' (expected F32, F16, BF16, F8_E4M3, F8_E5M2, F64, I64, I32, I16, I8, U8 or BOOL)");
    }
    info.dtype = dtype->dtype;

    const auto shape_it = entry.find("shape");
    if (shape_it == entry.end()) return corrupt_data(where + " has no shape");
    if (!shape_it->is_array()) {
      return corrupt_data(where + ": shape is a " + shape_it->type_name() + ", expected an array");
    }
    // Overflow-checked byte count: a hostile shape must not wrap around into a small size.
    uint64_t expected_bytes = dtype->size;
    bool overflow = false;
    bool empty = false;
    for (size_t i = 0; i < shape_it->size(); ++i) {
      int64_t dim = 0;
      INFILL_RETURN_IF_ERROR(
          read_count((*shape_it)[i], where, "shape[" + std::to_string(i) + "]", &dim));
      info.shape.push_back(dim);
      empty = empty || dim == 0;
      overflow = overflow || __builtin_mul_overflow(expected_bytes, static_cast<uint64_t>(dim),
                                                    &expected_bytes);
    }
    if (empty) {
      expected_bytes = 0;
    } else if (overflow) {
      return corrupt_data(where + ": shape " + shape_it->dump() + " is too large");
    }

    const auto offsets_it = entry.find("data_offsets");
    if (offsets_it == entry.end()) return corrupt_data(where + " has no data_offsets");
    if (!offsets_it->is_array() || offsets_it->size() != 2) {
      return corrupt_data(where + ": data_offsets is " + offsets_it->dump() +
                          ", expected [begin, end]");
    }
    int64_t begin = 0;
    int64_t end = 0;
    INFILL_RETURN_IF_ERROR(read_count((*offsets_it)[0], where, "data_offsets[0]", &begin));
    INFILL_RETURN_IF_ERROR(read_count((*offsets_it)[1], where, "data_offsets[1]", &end));
    info.begin = static_cast<uint64_t>(begin);
    info.end = static_cast<uint64_t>(end);
    if (info.begin > info.end) {
      return corrupt_data(where + ": data_offsets begin " + std::to_string(info.begin) +
                          " is after end " + std::to_string(info.end));
    }
    if (info.end > file.data_bytes_) {
      return corrupt_data(where + ": data ends at " + std::to_string(info.end) +
                          ", past the data section of " + std::to_string(file.data_bytes_) +
                          " bytes");
    }
    if (info.end - info.begin != expected_bytes) {
      return corrupt_data(where + " holds " + std::to_string(info.end - info.begin) +
                          " bytes, expected " + std::to_string(expected_bytes) + " for " +
                          dtype->name + " " + shape_it->dump());
    }
    file.index_[name] = file.tensors_.size();
    file.tensors_.push_back(std::move(info));
  }

  // Empty tensors occupy no bytes, so they cannot overlap anything.
  std::vector<const TensorInfo*> by_begin;
  for (const TensorInfo& t : file.tensors_) {
    if (t.end > t.begin) by_begin.push_back(&t);
  }
  std::sort(by_begin.begin(), by_begin.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_begin.size(); ++i) {
    const TensorInfo& prev = *by_begin[i - 1];
    const TensorInfo& cur = *by_begin[i];
    if (cur.begin < prev.end) {
      return corrupt_data(path + ": tensor '" + cur.name + "' [" + std::to_string(cur.begin) +
                          ", " + std::to_string(cur.end) + ") overlaps tensor '" + prev.name +
                          "' [" + std::to_string(prev.begin) + ", " + std::to_string(prev.end) +
                          ")");
    }
  }
  return file;
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  const auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

std::span<const std::byte> SafetensorsFile::bytes(const TensorInfo& info) const {
  return {data_ + info.begin, static_cast<size_t>(info.end - info.begin)};
}

}  // namespace infill
