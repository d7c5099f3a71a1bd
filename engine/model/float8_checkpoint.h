#pragma once
/// FP8 checkpoints as they are published: weights stored as F8_E4M3 or F8_E5M2 beside the
/// tensors that say how to read them.
///
/// - BFL's FLUX.2 [klein] FP8 files (`flux-2-klein-4b-fp8.safetensors`, ...) and ComfyUI's
///   quantized format: `<layer>.weight` in FP8, `<layer>.weight_scale` (its scale, float),
///   `<layer>.input_scale` (the activations' scale for FP8 matrix products),
///   `<layer>.comfy_quant` (U8 bytes of JSON, {"format": "float8_e4m3fn"}), and
///   `_quantization_metadata` in the header ({"layers": {"<layer>": {"format": ...}}});
/// - ComfyUI's earlier scaled FP8: a `scaled_fp8` marker tensor, `<layer>.scale_weight`,
///   `<layer>.scale_input`;
/// - plain FP8 casts (Kijai's files): FP8 tensors without scales (scale 1).
///
/// A weight is dequantized when it is read: value(code) x scale in float32, rounded to bf16,
/// the dtype of the bf16 checkpoints these files are made from (so the model holds what a
/// bf16 checkpoint of the same numbers would hold). A scale is one float (shape [] or [1])
/// or one per output row ([out] or [out, 1]). The activation scales are not needed: the
/// engine computes in bf16 on a GPU and float32 on the CPU.
///
/// Refused, naming the tensor and what was expected: other quantized formats (NVFP4's
/// `weight_scale_2`, block scales, a `comfy_quant` or metadata format that is not FP8), a
/// scale without its weight or beside a weight that is not FP8, a scale of another shape, a
/// weight whose `comfy_quant` names the other FP8 format, and NaN or infinite codes.

#include <cstddef>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "common/status.h"
#include "model/safetensors.h"

namespace infill {

/// Which stored tensors of a checkpoint are weights and which describe them.
struct Float8Layout {
  struct Scale {
    size_t file = 0;  ///< index into the files given to read_float8_layout
    std::string name;
  };
  /// Stored weight name -> its scale; an FP8 weight without one has scale 1.
  std::map<std::string, Scale> scale_of;
  /// Stored names that are not weights of their own (scales, activation scales, format
  /// records, markers): a checkpoint reader skips them.
  std::set<std::string> companions;
};

/// Reads the layout of `files` (the shards of one checkpoint; a tensor name is in one only).
Result<Float8Layout> read_float8_layout(const std::vector<SafetensorsFile>& files);

/// Tensor `name` of files[file] as load_stored_tensor reads it (stored dtype, shape checked
/// against `expected_shape` when non-empty, non-finite values refused), except that an FP8
/// tensor is dequantized with its scale from `layout` into a new bf16 tensor.
Result<at::Tensor> load_weight_tensor(const std::vector<SafetensorsFile>& files, size_t file, const std::string& name,
                                      const std::vector<int64_t>& expected_shape, const Float8Layout& layout);

/// The scale of each row of tensor `name` of files[file] ([rows] float32: the tensor's one scale
/// repeated, or its own per row) when it is stored as E4M3 codes; an undefined tensor when it
/// is stored otherwise (bf16, fp16, float32, or E5M2, whose codes E4M3 cannot all hold).
///
/// With these scales the file's own codes come back from the bf16 tensor load_weight_tensor
/// made: bf16(value x scale) / scale is within 2^-8 of the code's value relatively, while
/// neighbouring E4M3 values lie more than 2^-4 apart relatively (2^-9 apart, in units of the
/// scale, below the normals), so rounding it to the nearest E4M3 value gives the stored code.
/// The FP8 compute path (Flux2Transformer::to_device_float8) multiplies the numbers the file's
/// publisher quantized, not a second quantization of them.
Result<at::Tensor> float8_e4m3_row_scales(const std::vector<SafetensorsFile>& files, size_t file,
                                          const std::string& name, const Float8Layout& layout);

}  // namespace infill
