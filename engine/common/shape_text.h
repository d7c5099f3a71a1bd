#pragma once
/// "[3, 512, 512]": how error messages write a tensor shape.

#include <cstdint>
#include <span>
#include <string>

namespace infill {

inline std::string shape_text(std::span<const int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace infill
