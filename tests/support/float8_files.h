#pragma once
// FP8 checkpoints written as the published ones are (model/float8_checkpoint.h), for tests:
// a quantizer and expected values from the formats' definitions, and a byte-level writer for
// the dtypes libtorch 1.13 cannot hold.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/Half.h>
#include <nlohmann/json.hpp>

#include "model/float8.h"
#include "model/safetensors.h"
#include "model/safetensors_torch.h"
#include "support/catch.h"

namespace infill::test {

// The expected values come from the formats' definitions, not from the engine's decoder:
// E4M3FN by the OCP specification's formula, E5M2 through libtorch's own half conversion
// (an E5M2 code is the upper byte of a half).
inline float e4m3_by_definition(uint8_t code) {
  const int sign = code >> 7, exp = (code >> 3) & 15, man = code & 7;
  if (exp == 15 && man == 7) return std::numeric_limits<float>::quiet_NaN();
  const double v = exp == 0 ? std::ldexp(man / 8.0, -6) : std::ldexp(1.0 + man / 8.0, exp - 7);
  return static_cast<float>(sign ? -v : v);
}

inline float e5m2_by_half(uint8_t code) {
  c10::Half h;
  h.x = static_cast<uint16_t>(code << 8);
  return static_cast<float>(h);
}

inline float expected_value(uint8_t code, infill::Float8Format format) {
  return format == infill::Float8Format::kE4M3FN ? e4m3_by_definition(code) : e5m2_by_half(code);
}

// The nearest code to x (ties to the smaller magnitude), among the finite codes.
class Quantizer {
 public:
  explicit Quantizer(infill::Float8Format format) : format_(format) {
    const int last = format == infill::Float8Format::kE4M3FN ? 0x7E : 0x7B;  // the largest finite code
    for (int c = 0; c <= last; ++c) positive_.push_back(expected_value(static_cast<uint8_t>(c), format));
  }
  float max() const { return positive_.back(); }
  uint8_t code(float x) const {
    const float a = std::min(std::fabs(x), max());
    const auto it = std::lower_bound(positive_.begin(), positive_.end(), a);
    size_t c = static_cast<size_t>(it - positive_.begin());
    if (c > 0 && (c == positive_.size() || a - positive_[c - 1] <= positive_[c] - a)) --c;
    return static_cast<uint8_t>(c | (x < 0 ? 0x80 : 0));
  }
  infill::Float8Format format() const { return format_; }

 private:
  infill::Float8Format format_;
  std::vector<float> positive_;
};

// Every tensor of a safetensors file under `prefix`, as float32, with the prefix removed: what
// the tests quantize.
inline std::vector<std::pair<std::string, at::Tensor>> float_tensors(const std::string& path,
                                                                     const std::string& prefix = "") {
  auto file = infill::SafetensorsFile::open(path);
  REQUIRE(file.ok());
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& t : file->tensors()) {
    if (t.name.rfind(prefix, 0) == 0) out.emplace_back(t.name.substr(prefix.size()), *infill::load_float_tensor(*file, t.name));
  }
  return out;
}

struct RawTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

inline RawTensor raw_of(const std::string& name, const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  const std::string dtype = c.scalar_type() == at::kFloat ? "F32" : c.scalar_type() == at::kBFloat16 ? "BF16" : "?";
  REQUIRE(dtype != "?");
  return {name, dtype, c.sizes().vec(), std::string(static_cast<const char*>(c.data_ptr()), c.nbytes())};
}

// A safetensors file written byte by byte, for the dtypes libtorch 1.13 cannot hold.
inline void write_raw(const std::string& path, const std::vector<RawTensor>& tensors,
               const std::map<std::string, std::string>& metadata = {}) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const RawTensor& t : tensors) {
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  const std::string text = header.dump();
  const uint64_t n = text.size();
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << text;
  for (const RawTensor& t : tensors) out << t.bytes;
  REQUIRE(out.good());
}

enum class Companions {
  kComfyQuant,  // BFL's and ComfyUI's: weight_scale, input_scale, comfy_quant, _quantization_metadata
  kScaledFp8,   // ComfyUI's earlier: scaled_fp8 marker, scale_weight, scale_input
  kNone,        // a plain cast, every tensor (norm scales too) in FP8 with scale 1
};

struct Fp8Checkpoint {
  std::vector<RawTensor> fp8;                                 // the FP8 file's tensors
  std::vector<std::pair<std::string, at::Tensor>> expected;  // the same numbers in bf16
  std::map<std::string, std::string> metadata;
};

// Quantizes `tensors` (float32) the way the published files are made: each 2-D weight (every
// tensor for kNone) to FP8 with one scale (amax / the format's largest value), or one per row
// for `per_row`; the rest in bf16. `expected` holds what reading it must give.
inline Fp8Checkpoint quantize(const std::vector<std::pair<std::string, at::Tensor>>& tensors, const Quantizer& q,
                       Companions companions, const std::string& per_row = "") {
  Fp8Checkpoint out;
  const std::string dtype = q.format() == infill::Float8Format::kE4M3FN ? "F8_E4M3" : "F8_E5M2";
  const std::string format = infill::float8_format_name(q.format());
  nlohmann::json layers = nlohmann::json::object();
  bool marker = false;
  for (const auto& [name, tensor] : tensors) {
    const bool is_weight = name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0 && tensor.dim() == 2;
    if (!is_weight && companions != Companions::kNone) {
      out.fp8.push_back(raw_of(name, tensor.to(at::kBFloat16)));
      out.expected.emplace_back(name, tensor.to(at::kBFloat16));
      continue;
    }
    const at::Tensor w = tensor.to(at::kFloat).contiguous();
    const int64_t rows = w.dim() == 0 ? 1 : w.size(0);
    const int64_t cols = rows == 0 ? 0 : w.numel() / rows;
    const bool rowwise = name == per_row;
    std::vector<float> scales(rowwise ? rows : 1, 1.0f);
    if (companions != Companions::kNone) {
      const at::Tensor amax = rowwise ? w.abs().amax(1) : w.abs().max().reshape({1});
      for (size_t i = 0; i < scales.size(); ++i) scales[i] = std::max(amax[i].item<float>(), 1e-12f) / q.max();
    }
    std::string codes(static_cast<size_t>(w.numel()), '\0');
    at::Tensor expected = at::empty(w.sizes(), at::kFloat);
    const float* values = w.data_ptr<float>();
    float* exp = expected.data_ptr<float>();
    for (int64_t i = 0; i < w.numel(); ++i) {
      const float scale = scales[rowwise ? i / cols : 0];
      const uint8_t c = q.code(values[i] / scale);
      codes[i] = static_cast<char>(c);
      exp[i] = expected_value(c, q.format()) * scale;
    }
    out.fp8.push_back({name, dtype, w.sizes().vec(), codes});
    out.expected.emplace_back(name, expected.to(at::kBFloat16));
    const std::string layer = name.substr(0, name.size() - 7);
    const at::Tensor scale_tensor = rowwise ? at::tensor(scales) : at::full({}, scales[0]);
    if (companions == Companions::kComfyQuant) {
      out.fp8.push_back(raw_of(layer + ".weight_scale", scale_tensor));
      out.fp8.push_back(raw_of(layer + ".input_scale", at::full({}, 0.05f)));
      const std::string record = nlohmann::json{{"format", format}}.dump();
      out.fp8.push_back({layer + ".comfy_quant", "U8", {static_cast<int64_t>(record.size())}, record});
      layers[layer] = {{"format", format}};
    } else if (companions == Companions::kScaledFp8) {
      out.fp8.push_back(raw_of(layer + ".scale_weight", scale_tensor));
      out.fp8.push_back(raw_of(layer + ".scale_input", at::full({1}, 0.05f)));
      marker = true;
    }
  }
  if (marker) out.fp8.push_back({"scaled_fp8", dtype, {0}, ""});
  if (!layers.empty()) out.metadata["_quantization_metadata"] = nlohmann::json{{"format_version", "1.0"}, {"layers", layers}}.dump();
  return out;
}

}  // namespace infill::test
