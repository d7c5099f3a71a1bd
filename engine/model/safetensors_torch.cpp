#include "model/safetensors_torch.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <memory>
#include <set>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "common/shape_text.h"

namespace infill {
namespace {

// Writes all of `bytes` to `fd`, retrying short writes.
bool write_all(int fd, const void* bytes, size_t count) {
  const auto* p = static_cast<const char*>(bytes);
  while (count > 0) {
    const ssize_t n = ::write(fd, p, count);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += n;
    count -= static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

namespace {

// The torch dtype of a stored tensor, or an error naming it when it is not a float type.
Result<at::ScalarType> float_storage_type(const SafetensorsFile& file, const TensorInfo& info) {
  switch (info.dtype) {
    case DType::kF32:
      return at::kFloat;
    case DType::kF16:
      return at::kHalf;
    case DType::kBF16:
      return at::kBFloat16;
    default:
      return invalid_argument(file.path() + ": " + info.name + " is " + dtype_name(info.dtype) +
                              ", expected F32, F16 or BF16");
  }
}

Result<const TensorInfo*> find_checked(const SafetensorsFile& file, const std::string& name,
                                       const std::vector<int64_t>& expected_shape) {
  const TensorInfo* info = file.find(name);
  if (info == nullptr) return not_found(file.path() + ": no tensor '" + name + "'");
  if (!expected_shape.empty() && info->shape != expected_shape) {
    return invalid_argument(file.path() + ": " + name + " is " + shape_text(info->shape) +
                            ", expected " + shape_text(expected_shape));
  }
  return info;
}

// corrupt_data naming the first non-finite value of `t`, or success.
// Index of the first NaN or infinity in `count` values of `bits` (their IEEE bit patterns):
// all exponent bits set. A scan of the stored bits allocates nothing; at::isfinite made a
// temporary per tensor, and the freed temporaries of a 4B model stayed in the heap (5 GB).
template <typename Bits>
int64_t first_non_finite(const Bits* bits, int64_t count, Bits exponent) {
  for (int64_t i = 0; i < count; ++i) {
    if ((bits[i] & exponent) == exponent) return i;
  }
  return -1;
}

Status check_finite(const SafetensorsFile& file, const std::string& name, const at::Tensor& t) {
  if (t.numel() == 0) return {};
  const at::Tensor c = t.contiguous();
  int64_t index = -1;
  switch (c.scalar_type()) {
    case at::kFloat:
      index = first_non_finite(static_cast<const uint32_t*>(c.data_ptr()), c.numel(), uint32_t{0x7F800000});
      break;
    case at::kHalf:
      index = first_non_finite(static_cast<const uint16_t*>(c.data_ptr()), c.numel(), uint16_t{0x7C00});
      break;
    case at::kBFloat16:
      index = first_non_finite(static_cast<const uint16_t*>(c.data_ptr()), c.numel(), uint16_t{0x7F80});
      break;
    default:
      if (at::isfinite(c).all().item<bool>()) return {};
      index = at::logical_not(at::isfinite(c.reshape({-1}))).nonzero()[0][0].item<int64_t>();
  }
  if (index < 0) return {};
  return corrupt_data(file.path() + ": " + name + " has a non-finite value (" +
                      std::to_string(c.reshape({-1})[index].item<float>()) + ") at flat index " + std::to_string(index));
}

}  // namespace

Result<at::Tensor> load_float_tensor(const SafetensorsFile& file, const std::string& name,
                                     const std::vector<int64_t>& expected_shape) {
  INFILL_ASSIGN_OR_RETURN(const TensorInfo* info, find_checked(file, name, expected_shape));
  INFILL_ASSIGN_OR_RETURN(const at::ScalarType stored, float_storage_type(file, *info));
  // Copy rather than wrap: the data section need not be aligned for the element type, and
  // the result must outlive the mapping.
  at::Tensor raw = at::empty(info->shape, at::TensorOptions().dtype(stored));
  const std::span<const std::byte> bytes = file.bytes(*info);
  if (!bytes.empty()) std::memcpy(raw.data_ptr(), bytes.data(), bytes.size());
  at::Tensor out = stored == at::kFloat ? raw : raw.to(at::kFloat);

  const float* values = out.data_ptr<float>();
  const int64_t n = out.numel();
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(values[i])) {
      return corrupt_data(file.path() + ": " + name + " has a non-finite value (" +
                          std::to_string(values[i]) + ") at flat index " + std::to_string(i));
    }
  }
  return out;
}

Result<at::Tensor> load_stored_tensor(const SafetensorsFile& file, const std::string& name,
                                      const std::vector<int64_t>& expected_shape) {
  INFILL_ASSIGN_OR_RETURN(const TensorInfo* info, find_checked(file, name, expected_shape));
  INFILL_ASSIGN_OR_RETURN(const at::ScalarType stored, float_storage_type(file, *info));
  const std::span<const std::byte> bytes = file.bytes(*info);
  const auto options = at::TensorOptions().dtype(stored);
  at::Tensor out;
  const auto address = reinterpret_cast<uintptr_t>(bytes.data());
  if (!bytes.empty() && address % dtype_size(info->dtype) == 0) {
    // The deleter owns a copy of the file object, which shares the mapping.
    auto keep_alive = std::make_shared<SafetensorsFile>(file);
    out = at::from_blob(const_cast<std::byte*>(bytes.data()), info->shape,
                        [keep_alive](void*) mutable { keep_alive.reset(); }, options);
  } else {
    out = at::empty(info->shape, options);
    if (!bytes.empty()) std::memcpy(out.data_ptr(), bytes.data(), bytes.size());
  }
  INFILL_RETURN_IF_ERROR(check_finite(file, name, out));
  return out;
}

Status write_safetensors(const std::string& path,
                         const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  // ordered_json keeps the caller's order in the header.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [key, value] : metadata) meta[key] = value;
    header["__metadata__"] = std::move(meta);
  }
  std::vector<at::Tensor> contiguous;
  contiguous.reserve(tensors.size());
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    const std::string where = path + ": tensor '" + name + "'";
    if (name.empty() || name == "__metadata__") {
      return invalid_argument(path + ": tensor name '" + name + "' is reserved or empty");
    }
    if (!names.insert(name).second) return invalid_argument(where + " is given twice");
    if (!tensor.defined()) return invalid_argument(where + " is undefined");
    if (!tensor.device().is_cpu()) {
      return invalid_argument(where + " is on " + tensor.device().str() + ", expected CPU");
    }
    const char* dtype = nullptr;
    switch (tensor.scalar_type()) {
      case at::kFloat:
        dtype = "F32";
        break;
      case at::kHalf:
        dtype = "F16";
        break;
      case at::kBFloat16:
        dtype = "BF16";
        break;
      default:
        return invalid_argument(where + " is " + std::string(c10::toString(tensor.scalar_type())) +
                                ", expected float32, float16 or bfloat16");
    }
    at::Tensor c = tensor.contiguous();
    const uint64_t bytes = static_cast<uint64_t>(c.numel()) * c.element_size();
    header[name] = {
        {"dtype", dtype}, {"shape", c.sizes().vec()}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    contiguous.push_back(std::move(c));
  }

  std::string header_text;
  try {
    header_text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    // Names and metadata must be valid UTF-8 to be stored as JSON strings.
    return invalid_argument(path + ": header cannot be written as JSON: " + e.what());
  }
  // Padding keeps the data section 8-byte aligned, so readers may map tensors in place.
  header_text.append((8 - header_text.size() % 8) % 8, ' ');
  const uint64_t header_bytes = header_text.size();

  static std::atomic<uint64_t> counter{0};
  const std::string tmp_path =
      path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1));
  const int fd = ::open(tmp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return io_error(path + ": cannot create temporary file " + tmp_path + ": " +
                    std::strerror(errno));
  }
  bool ok =
      write_all(fd, &header_bytes, 8) && write_all(fd, header_text.data(), header_text.size());
  for (size_t i = 0; ok && i < contiguous.size(); ++i) {
    const at::Tensor& c = contiguous[i];
    ok = write_all(fd, c.data_ptr(), static_cast<size_t>(c.numel()) * c.element_size());
  }
  ok = ok && ::fsync(fd) == 0;
  const int write_errno = errno;
  ok = (::close(fd) == 0) && ok;
  if (!ok) {
    ::unlink(tmp_path.c_str());
    return io_error(path + ": cannot write " + tmp_path + ": " + std::strerror(write_errno));
  }
  if (::rename(tmp_path.c_str(), path.c_str()) != 0) {
    const int rename_errno = errno;
    ::unlink(tmp_path.c_str());
    return io_error(path + ": cannot rename " + tmp_path +
                    " into place: " + std::strerror(rename_errno));
  }
  return {};
}

}  // namespace infill
