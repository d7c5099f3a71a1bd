#include "model/float8_checkpoint.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <optional>
#include <span>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>

#include "common/shape_text.h"
#include "model/float8.h"
#include "model/safetensors_torch.h"

namespace infill {
namespace {

using json = nlohmann::json;

std::optional<Float8Format> float8_format_of(DType dtype) {
  if (dtype == DType::kF8E4M3) return Float8Format::kE4M3FN;
  if (dtype == DType::kF8E5M2) return Float8Format::kE5M2;
  return std::nullopt;
}

// A quantization format name as ComfyUI's comfy_quant and _quantization_metadata write it:
// the FP8 format it is, or nothing for every other one.
std::optional<Float8Format> float8_format_named(const std::string& name) {
  if (name == "float8_e4m3fn") return Float8Format::kE4M3FN;
  if (name == "float8_e5m2") return Float8Format::kE5M2;
  return std::nullopt;
}

std::string unsupported_format(const std::string& where, const std::string& layer, const std::string& format) {
  return where + ": layer " + layer + " is quantized as '" + format +
         "'; only FP8 weights (float8_e4m3fn, float8_e5m2) load, and bf16, fp16 or float32 ones";
}

// Suffixes of tensors that scale the weight `<layer>.weight`.
constexpr const char* kWeightScaleSuffixes[] = {".weight_scale", ".scale_weight"};
// Scales of the activations, for FP8 matrix products: not needed to read the weights.
constexpr const char* kInputScaleSuffixes[] = {".input_scale", ".scale_input"};
// Parts of formats that are not per-tensor or per-row FP8.
constexpr const char* kOtherFormatSuffixes[] = {".weight_scale_2", ".pre_quant_scale", ".weight_scale_inv"};

struct Stored {
  size_t file;
  const TensorInfo* info;
};

Status check_scale(const std::string& where, const TensorInfo& scale, const TensorInfo& weight) {
  if (scale.dtype != DType::kF32 && scale.dtype != DType::kF16 && scale.dtype != DType::kBF16) {
    return invalid_argument(where + ": " + scale.name + " is " + dtype_name(scale.dtype) + ", expected F32, F16 or BF16");
  }
  if (!float8_format_of(weight.dtype)) {
    return invalid_argument(where + ": " + scale.name + " scales " + weight.name + ", which is " +
                            dtype_name(weight.dtype) + " (expected F8_E4M3 or F8_E5M2)");
  }
  const int64_t rows = weight.shape.empty() ? 1 : weight.shape[0];
  const std::vector<int64_t>& s = scale.shape;
  const bool per_tensor = s.empty() || s == std::vector<int64_t>{1};
  const bool per_row = !weight.shape.empty() && (s == std::vector<int64_t>{rows} || s == std::vector<int64_t>{rows, 1});
  if (!per_tensor && !per_row) {
    return invalid_argument(where + ": " + scale.name + " is " + shape_text(s) + ", expected [] or [1] (one scale) or [" +
                            std::to_string(rows) + "] (one per row of " + weight.name + " " +
                            shape_text(weight.shape) + ")");
  }
  return {};
}

}  // namespace

Result<Float8Layout> read_float8_layout(const std::vector<SafetensorsFile>& files) {
  Float8Layout layout;
  std::map<std::string, Stored> stored;
  for (size_t f = 0; f < files.size(); ++f) {
    for (const TensorInfo& t : files[f].tensors()) {
      stored.emplace(t.name, Stored{f, &t});
    }
  }
  auto where_of = [&](size_t f) { return files[f].path(); };

  // The header's record of the layers' formats.
  for (size_t f = 0; f < files.size(); ++f) {
    const auto it = files[f].metadata().find("_quantization_metadata");
    if (it == files[f].metadata().end()) continue;
    const json meta = json::parse(it->second, nullptr, /*allow_exceptions=*/false);
    if (meta.is_discarded() || !meta.is_object()) {
      return invalid_argument(where_of(f) + ": _quantization_metadata in the header is not a JSON object");
    }
    const auto layers = meta.find("layers");
    if (layers == meta.end()) continue;
    if (!layers->is_object()) {
      return invalid_argument(where_of(f) + ": _quantization_metadata.layers is a " +
                              std::string(layers->type_name()) + ", expected an object");
    }
    for (const auto& [layer, config] : layers->items()) {
      const std::string format = config.is_object() && config.contains("format") && config["format"].is_string()
                                     ? config["format"].get<std::string>()
                                     : std::string();
      if (format.empty()) {
        return invalid_argument(where_of(f) + ": _quantization_metadata.layers." + layer +
                                " has no format (expected {\"format\": \"float8_e4m3fn\"} or float8_e5m2)");
      }
      if (!float8_format_named(format)) return invalid_argument(unsupported_format(where_of(f), layer, format));
    }
  }

  for (const auto& [name, entry] : stored) {
    const std::string& where = where_of(entry.file);
    for (const char* suffix : kOtherFormatSuffixes) {
      if (name.ends_with(suffix)) {
        return invalid_argument(where + ": " + name + " belongs to a quantized format other than FP8 (" + suffix +
                                "); expected FP8 weights with one scale per tensor or per row, or unquantized ones");
      }
    }
    if (name == "scaled_fp8" || name.ends_with(".scaled_fp8")) {
      layout.companions.insert(name);
      continue;
    }
    for (const char* suffix : kInputScaleSuffixes) {
      if (name.ends_with(suffix)) layout.companions.insert(name);
    }
    for (const char* suffix : kWeightScaleSuffixes) {
      if (!name.ends_with(suffix)) continue;
      const std::string weight = name.substr(0, name.size() - std::string(suffix).size()) + ".weight";
      const auto w = stored.find(weight);
      if (w == stored.end()) return invalid_argument(where + ": " + name + " has no " + weight + " to scale");
      INFILL_RETURN_IF_ERROR(check_scale(where, *entry.info, *w->second.info));
      if (!layout.scale_of.emplace(weight, Float8Layout::Scale{entry.file, name}).second) {
        return invalid_argument(where + ": " + weight + " has two scales (" + layout.scale_of[weight].name + " and " +
                                name + ")");
      }
      layout.companions.insert(name);
    }
    if (name.ends_with(".comfy_quant")) {
      const std::string layer = name.substr(0, name.size() - std::string(".comfy_quant").size());
      const std::span<const std::byte> bytes = files[entry.file].bytes(*entry.info);
      const json record = entry.info->dtype == DType::kU8
                              ? json::parse(reinterpret_cast<const char*>(bytes.data()),
                                            reinterpret_cast<const char*>(bytes.data()) + bytes.size(), nullptr, false)
                              : json(json::value_t::discarded);
      if (record.is_discarded() || !record.is_object() || !record.contains("format") || !record["format"].is_string()) {
        return invalid_argument(where + ": " + name + " is not a quantization record (expected U8 bytes of JSON "
                                "{\"format\": \"float8_e4m3fn\"})");
      }
      const std::string format = record["format"].get<std::string>();
      const std::optional<Float8Format> said = float8_format_named(format);
      if (!said) return invalid_argument(unsupported_format(where, layer, format));
      const auto w = stored.find(layer + ".weight");
      if (w != stored.end() && float8_format_of(w->second.info->dtype) != said) {
        return invalid_argument(where + ": " + layer + ".weight is " + dtype_name(w->second.info->dtype) + " but " + name +
                                " says " + format);
      }
      layout.companions.insert(name);
    }
  }
  return layout;
}

Result<at::Tensor> load_weight_tensor(const std::vector<SafetensorsFile>& files, size_t file, const std::string& name,
                                      const std::vector<int64_t>& expected_shape, const Float8Layout& layout) {
  const TensorInfo* info = files[file].find(name);
  const std::optional<Float8Format> format = info ? float8_format_of(info->dtype) : std::nullopt;
  if (!format) return load_stored_tensor(files[file], name, expected_shape);
  const std::string& where = files[file].path();
  if (!expected_shape.empty() && info->shape != expected_shape) {
    return invalid_argument(where + ": " + name + " is " + shape_text(info->shape) + ", expected " +
                            shape_text(expected_shape));
  }
  at::Tensor scales = at::ones({1}, at::kFloat);
  if (const auto s = layout.scale_of.find(name); s != layout.scale_of.end()) {
    INFILL_ASSIGN_OR_RETURN(scales, load_float_tensor(files[s->second.file], s->second.name));
    scales = scales.reshape({-1}).contiguous();
  }
  const std::span<const std::byte> bytes = files[file].bytes(*info);
  const std::span<const uint8_t> codes(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  at::Tensor values = at::empty(info->shape, at::kBFloat16);
  const int64_t rows = info->shape.empty() ? 1 : info->shape[0];
  const int64_t row_length = rows == 0 ? 1 : info->numel() / rows;
  const std::span<const float> all_scales(scales.data_ptr<float>(), static_cast<size_t>(scales.numel()));
  // Rows in parallel (a klein 4B file is 4 G codes); each range reports its first bad code.
  std::atomic<int64_t> bad{-1};
  at::parallel_for(0, rows, std::max<int64_t>(1, (int64_t{1} << 20) / row_length), [&](int64_t begin, int64_t end) {
    const int64_t first = begin * row_length;
    const std::span<const float> range_scales = all_scales.size() == 1 ? all_scales : all_scales.subspan(begin, end - begin);
    const int64_t local = decode_float8_to_bf16(codes.subspan(first, (end - begin) * row_length), *format, range_scales,
                                                row_length, static_cast<uint16_t*>(values.data_ptr()) + first);
    if (local < 0) return;
    int64_t seen = bad.load();
    while ((seen < 0 || first + local < seen) && !bad.compare_exchange_weak(seen, first + local)) {
    }
  });
  if (const int64_t i = bad.load(); i >= 0) {
    const float value = float8_to_float(codes[i], *format);
    const std::string code = std::string(float8_format_name(*format)) + " code " + std::to_string(codes[i]);
    return corrupt_data(where + ": " + name + " has a non-finite value at flat index " + std::to_string(i) + " (" +
                        (std::isfinite(value) ? code + " = " + std::to_string(value) + ", times its scale, is beyond bf16"
                                              : code + " is " + std::to_string(value)) +
                        ")");
  }
  return values;
}

Result<at::Tensor> float8_e4m3_row_scales(const std::vector<SafetensorsFile>& files, size_t file,
                                          const std::string& name, const Float8Layout& layout) {
  const TensorInfo* info = files[file].find(name);
  if (info == nullptr || info->dtype != DType::kF8E4M3 || info->shape.empty()) return at::Tensor();
  const int64_t rows = info->shape[0];
  const auto s = layout.scale_of.find(name);
  if (s == layout.scale_of.end()) return at::ones({rows}, at::kFloat);  // a plain cast: scale 1
  INFILL_ASSIGN_OR_RETURN(at::Tensor scales, load_float_tensor(files[s->second.file], s->second.name));
  scales = scales.reshape({-1});
  // read_float8_layout admitted one scale or one per row.
  return scales.numel() == 1 ? scales.expand({rows}).contiguous() : scales.contiguous();
}

}  // namespace infill
