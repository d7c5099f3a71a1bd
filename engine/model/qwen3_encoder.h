#pragma once
/// The Qwen3 decoder as a text encoder (Hugging Face `Qwen3ForCausalLM`, the FLUX.2 [klein]
/// text encoders Qwen3-4B and Qwen3-8B): token embedding, then per layer RMSNorm, grouped-query
/// attention with q/k RMSNorm per head and RoPE (rotate-half, the config's theta), causal
/// attention with the padding mask upstream uses (padding keys masked for every query), a
/// second RMSNorm and a SwiGLU MLP, each with a residual.
///
/// `encode` returns the hidden states klein reads: Hugging Face's `hidden_states[k]` (0 = the
/// embeddings, k = the output of 0-based layer k-1) for each requested k, stacked along the
/// channel axis; for klein k = 9, 18, 27, so 3 x 2560 = 7680 channels for Qwen3-4B. Only the
/// layers up to the deepest requested one run (27 of Qwen3-4B's 36).
///
/// Weights keep their stored dtype (BF16 / F16 / F32), memory-mapped (FP8 files, such as
/// ComfyUI's `qwen_3_4b_fp8_mixed`, are dequantized to bf16: model/float8_checkpoint.h); on
/// the CPU each layer is converted into a reused per-thread scratch when it runs
/// (stored_linear), so no float32 copy of the model is held and compute is float32.
/// Threading: immutable after load; encode may run on several threads at once.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "common/status.h"
#include "model/compute_device.h"

namespace infill {

struct Qwen3Config {
  int vocab_size = 151936;
  int hidden_size = 2560;
  int num_layers = 36;
  int num_heads = 32;
  int num_kv_heads = 8;
  int head_dim = 128;
  int intermediate_size = 9728;
  double rope_theta = 1000000.0;
  double rms_norm_eps = 1e-6;

  /// invalid_argument naming the field unless the sizes are consistent.
  Status validate() const;
  /// "qwen3-4b", "qwen3-8b" for the published sizes, else "custom".
  std::string family_size() const;
};

/// Reads a Hugging Face `config.json` of model_type "qwen3"; errors name the file and field
/// (another model type, rope scaling, attention biases are refused).
Result<Qwen3Config> read_qwen3_config(const std::string& path);

class Qwen3Encoder {
 public:
  /// Loads a text encoder folder: `config.json`, `model.safetensors` or its index and shards.
  /// Every tensor is checked against the config's shapes and for NaN/Inf; errors name the
  /// tensor and file, and nothing is half-loaded.
  static Result<std::shared_ptr<const Qwen3Encoder>> load(const std::string& dir);
  /// Random weights (norm scales near 1) for tests and benchmarks.
  static std::shared_ptr<const Qwen3Encoder> random(const Qwen3Config& config, uint64_t seed, at::ScalarType dtype);
  /// Writes `dir`/config.json and the weights under Hugging Face's names: `model.safetensors`,
  /// or with `shards` > 1 `model-0000k-of-0000N.safetensors` and their index.
  Status save(const std::string& dir, int shards = 1) const;

  ~Qwen3Encoder();

  /// A copy of this encoder on CUDA device `device`, its weights converted to `dtype` there
  /// (norm scales stay float32), computing there in `dtype` with the norms and the softmax in
  /// float32, as Hugging Face's Qwen3 runs in bf16: a klein prompt in milliseconds instead of
  /// the CPU's seconds. Errors name the device: the CPU (this encoder already computes there),
  /// no CUDA, out of its memory.
  Result<std::shared_ptr<const Qwen3Encoder>> on_device(const ComputeDevice& device,
                                                        at::ScalarType dtype = at::kBFloat16) const;
  /// Where the weights live and encode computes.
  at::Device device() const;

  /// ids [S] (each < vocab_size) and mask [S] (1 real, 0 padding; the first token real) ->
  /// float32 [S, layers.size() * hidden_size] on the CPU: hidden_states[k] for k in `layers`
  /// (each in 0..num_layers), concatenated per token in that order. Errors: an id out of
  /// range, a size mismatch, a layer index out of range.
  Result<at::Tensor> encode(const std::vector<int32_t>& ids, const std::vector<uint8_t>& mask,
                            const std::vector<int>& layers) const;

  const Qwen3Config& config() const;
  int64_t weight_bytes() const;

  struct Weights;

 private:
  explicit Qwen3Encoder(std::unique_ptr<Weights> weights);
  std::unique_ptr<Weights> w_;
};

/// The hidden-state indices FLUX.2 [klein] stacks (Hugging Face indexing; diffusers'
/// `text_encoder_out_layers`).
inline const std::vector<int>& klein_text_layers() {
  static const std::vector<int> layers{9, 18, 27};
  return layers;
}

/// The hidden states a FLUX.2 transformer reading `context_dim`-wide text rows takes from an
/// encoder of `config`: klein's (9, 18, 27) when it reads three of an encoder with 27 layers or
/// more, else as many evenly spaced layers as the width holds (the bundled model's small
/// encoder). Errors name `where` when the width does not fit the encoder.
Result<std::vector<int>> flux2_text_layers(const Qwen3Config& config, int context_dim, const std::string& where);

}  // namespace infill
