#include "model/qwen3_prompt_encoder.h"

#include <c10/core/InferenceMode.h>

#include <filesystem>

#include "model/safetensors.h"
#include "model/safetensors_shards.h"

namespace infill {

namespace fs = std::filesystem;

Residency text_encoder_residency(int64_t transformer_bytes, int64_t encoder_bytes, int64_t memory_bytes) {
  const int64_t needed = (transformer_bytes + encoder_bytes) + (transformer_bytes + encoder_bytes) / 4;
  return needed > memory_bytes ? Residency::kUnloadAfterEncode : Residency::kKeep;
}

int64_t qwen3_folder_weight_bytes(const std::string& encoder_dir) {
  auto files = safetensors_shards(encoder_dir, "model");
  if (!files.ok()) return 0;
  int64_t bytes = 0;
  for (const std::string& path : *files) {
    auto file = SafetensorsFile::open(path);
    if (!file.ok()) return 0;
    for (const TensorInfo& t : file->tensors()) {
      // FP8 weights are held dequantized to bf16 (model/float8_checkpoint.h): twice their bytes.
      const bool float8 = t.dtype == DType::kF8E4M3 || t.dtype == DType::kF8E5M2;
      bytes += float8 ? 2 * t.numel() : static_cast<int64_t>(t.end - t.begin);
    }
  }
  return bytes;
}

bool text_encoder_fits_device(int64_t encoder_bytes, int64_t reserved_bytes, int64_t free_bytes) {
  return encoder_bytes > 0 && encoder_bytes + encoder_bytes / 4 + reserved_bytes <= free_bytes;
}

Status Qwen3PromptEncoder::load_encoder() {
  INFILL_ASSIGN_OR_RETURN(encoder_, Qwen3Encoder::load(encoder_dir_));
  if (!options_.device.cuda || placement_.starts_with("cpu (")) return {};
  auto moved = encoder_->on_device(options_.device);
  if (!moved.ok()) {
    // A reload after unload() must encode as the first load did (the cache's entries are bf16's).
    if (placement_ != "cpu") {
      encoder_.reset();
      return moved.status();
    }
    placement_ = "cpu (" + moved.status().message() + ")";
    return {};
  }
  encoder_ = *moved;  // the host copy is unmapped here
  placement_ = options_.device.name();
  return {};
}

std::string Qwen3PromptEncoder::placement() const {
  std::lock_guard lock(mutex_);
  return placement_;
}

bool Qwen3PromptEncoder::on_gpu() const {
  std::lock_guard lock(mutex_);
  return on_gpu_locked();
}

Result<std::unique_ptr<Qwen3PromptEncoder>> Qwen3PromptEncoder::load(const std::string& tokenizer_dir,
                                                                     const std::string& encoder_dir,
                                                                     std::shared_ptr<PromptEmbeddingCache> cache,
                                                                     Options options) {
  if (options.max_length < 1) return invalid_argument("text encoder: max_length must be >= 1");
  std::unique_ptr<Qwen3PromptEncoder> out(new Qwen3PromptEncoder());
  INFILL_ASSIGN_OR_RETURN(out->tokenizer_, PromptTokenizer::load(tokenizer_dir));
  INFILL_ASSIGN_OR_RETURN(Qwen3Config config, read_qwen3_config((fs::path(encoder_dir) / "config.json").string()));
  if (out->tokenizer_.tokenizer().id_count() > config.vocab_size) {
    return invalid_argument((fs::path(tokenizer_dir) / "tokenizer.json").string() + " has ids up to " +
                            std::to_string(out->tokenizer_.tokenizer().id_count() - 1) + " but " +
                            (fs::path(encoder_dir) / "config.json").string() + " has vocab_size " +
                            std::to_string(config.vocab_size) + " (tokenizer and text encoder do not match)");
  }
  for (const int k : options.layers) {
    if (k < 0 || k > config.num_layers) {
      return invalid_argument("text encoder: hidden state " + std::to_string(k) + " does not exist in " + encoder_dir +
                              " (expected 0.." + std::to_string(config.num_layers) + ")");
    }
  }
  out->encoder_dir_ = encoder_dir;
  out->options_ = std::move(options);
  out->context_dim_ = static_cast<int>(out->options_.layers.size()) * config.hidden_size;
  out->cache_ = std::move(cache);
  std::error_code ec;
  out->id_ = fs::weakly_canonical(encoder_dir, ec).string() + "|" + std::to_string(out->options_.max_length);
  for (const int k : out->options_.layers) {
    out->id_ += ',';
    out->id_ += std::to_string(k);
  }
  if (out->options_.residency == Residency::kKeep || out->options_.device.cuda) {
    INFILL_RETURN_IF_ERROR(out->load_encoder());
  }
  // Encodings on a GPU are bf16's, on the CPU float32's: entries of one are not the other's.
  if (out->on_gpu_locked()) out->id_ += "|bf16";
  return out;
}

Result<std::shared_ptr<const PromptEmbedding>> Qwen3PromptEncoder::encode(std::string_view prompt_view) {
  const std::string prompt(prompt_view);
  if (cache_) {
    if (auto hit = cache_->find(id_, prompt)) return hit;
  }
  std::lock_guard lock(mutex_);
  // Another thread may have encoded the same prompt while this one waited.
  if (cache_) {
    if (auto hit = cache_->find(id_, prompt)) return hit;
  }
  if (!encoder_) INFILL_RETURN_IF_ERROR(load_encoder());
  const PromptTokens tokens = tokenizer_.encode(prompt, options_.max_length);
  c10::InferenceMode guard;
  INFILL_ASSIGN_OR_RETURN(at::Tensor rows, encoder_->encode(tokens.ids, tokens.mask, options_.layers));
  auto embedding = std::make_shared<PromptEmbedding>();
  embedding->rows = std::move(rows);
  embedding->real_length = tokens.real_length;
  embedding->full_length = tokens.full_length;
  embedding->truncated = tokens.truncated;
  // On a GPU the encoder stays: its memory was judged to fit there, and reloading costs seconds.
  if (options_.residency == Residency::kUnloadAfterEncode && !on_gpu_locked()) encoder_.reset();
  if (cache_) cache_->insert(id_, prompt, embedding);
  return std::shared_ptr<const PromptEmbedding>(std::move(embedding));
}

void Qwen3PromptEncoder::unload() {
  std::lock_guard lock(mutex_);
  encoder_.reset();
}

bool Qwen3PromptEncoder::resident() const {
  std::lock_guard lock(mutex_);
  return encoder_ != nullptr;
}

}  // namespace infill
