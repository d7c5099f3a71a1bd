#pragma once
/// The weights of a FLUX.2 transformer under the upstream (BFL) names, whatever layout they
/// are stored in:
/// - upstream naming: the BFL file (`flux-2-klein-4b.safetensors`), a ComfyUI file with a
///   key prefix ("model.diffusion_model."), the reference files ("weights.");
/// - diffusers naming (`transformer/diffusion_pytorch_model*.safetensors`, one file or
///   shards): mapped back to upstream names as the inverse of diffusers'
///   scripts/convert_flux2_to_diffusers.py (huggingface/diffusers 207bae7): its renames
///   (x_embedder -> img_in, transformer_blocks.N.ff.linear_in -> double_blocks.N.img_mlp.0,
///   ...), its q/k/v split fused again into one qkv weight, and the final layer's
///   (scale, shift) halves swapped back to upstream's (shift, scale).
///
/// Tensors are read in their stored dtype (memory-mapped where possible; a fused qkv is a
/// new tensor). FP8 checkpoints (BFL's `flux-2-klein-4b-fp8.safetensors`, ComfyUI's scaled
/// FP8, in either naming) are read dequantized to bf16, each weight with its own scale (a
/// diffusers q, k and v each with theirs); model/float8_checkpoint.h. Threading: immutable
/// after open; read may run on several threads at once.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "common/status.h"
#include "model/safetensors.h"

namespace infill {

struct Float8Layout;

class Flux2Checkpoint {
 public:
  enum class Naming { kUpstream = 1, kDiffusers = 2 };

  /// One or more safetensors files (shards of one checkpoint). The naming is recognised from
  /// the keys (`img_in.weight` under some prefix, or diffusers' `x_embedder.weight`); errors
  /// name the files when neither is found, and the tensor when a diffusers key has no
  /// upstream counterpart or a q/k/v triple is incomplete.
  static Result<Flux2Checkpoint> open(const std::vector<std::string>& paths);
  /// The upstream-named transformer under `prefix` of an open file (e.g. a reference file).
  static Result<Flux2Checkpoint> from_file(const SafetensorsFile& file, const std::string& prefix);

  Naming naming() const { return naming_; }
  /// The files, for error messages ("a.safetensors" or "a.safetensors (+2 shards)").
  const std::string& where() const { return where_; }
  /// Upstream name -> shape of every tensor held (fused qkv shapes for diffusers).
  const std::map<std::string, std::vector<int64_t>>& shapes() const { return shapes_; }
  /// The dtypes its weights are stored in ("BF16", "F8_E4M3", ...), sorted; FP8 ones are read
  /// dequantized to bf16.
  std::vector<std::string> stored_dtypes() const;
  /// Reads one tensor by its upstream name, checking `expected_shape` (when non-empty) and
  /// finiteness; errors name the stored tensor and file.
  Result<at::Tensor> read(const std::string& upstream_name, const std::vector<int64_t>& expected_shape) const;
  /// The scale of each output row of a weight stored as E4M3 codes ([rows] float32, a
  /// diffusers q, k and v each with its own), so that the FP8 compute path takes the file's own
  /// codes back from what read gives (model/float8_checkpoint.h: float8_e4m3_row_scales); an
  /// undefined tensor when any part of it is stored otherwise.
  Result<at::Tensor> float8_row_scales(const std::string& upstream_name) const;

  struct Source;

 private:
  Naming naming_ = Naming::kUpstream;
  std::string where_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, std::vector<int64_t>> shapes_;
  std::shared_ptr<const std::map<std::string, Source>> sources_;
  std::shared_ptr<const Float8Layout> float8_;
};

}  // namespace infill
