#include "pipeline/flux2_edit_model.h"

#include <unistd.h>

#include <algorithm>
#include <span>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include "common/hash.h"
#include "model/device_memory.h"
#include "model/file_identity.h"
#include "model/float8_linear.h"
#include "model/host_fallback_codec.h"
#include "model/safetensors_shards.h"
#include "model/flux2_model.h"
#include "model/flux2_sequence_parallel.h"
#include "pipeline/flux2_edit_session.h"
#include "pipeline/flux2_prepare_run.h"
#include "pipeline/host_to_device_speed.h"

namespace infill {

namespace {

class Flux2StepSession final : public StepSession {
 public:
  Flux2StepSession(std::unique_ptr<Flux2EditSession> session, bool prompt_truncated, int heads)
      : s_(std::move(session)), prompt_truncated_(prompt_truncated), heads_(heads) {}
  Flux2EditSession& session() { return *s_; }

  bool done() const override { return s_->done(); }
  int step() const override { return s_->step(); }
  int first_step() const override { return s_->first_step(); }
  int steps() const override { return s_->steps(); }
  const TokenSet& tokens() const override { return s_->tokens(); }
  bool guided() const override { return s_->guided(); }
  int64_t prediction_rows() const override { return s_->prediction_rows(); }
  Status apply(const at::Tensor& prediction, int next_step) override { return s_->apply(prediction, next_step); }
  at::Tensor predicted_latent() const override { return s_->predicted_latent(); }
  bool waiting_for_adapters() const override { return s_->waiting_for_adapters(); }
  int parallel_heads() const override { return s_->sequence_splits() && !s_->done() ? heads_ : 0; }
  bool reads_cached_kv() const override { return s_->mode() != Flux2CacheMode::kOff; }
  ParallelForward parallel_step() override {
    std::span<Flux2Segment> built = s_->segments();
    // Built once here; every rank runs each segment in sequence parallel through its own
    // device's transformer, a masked one reading the entry through a reader of its own, and
    // gets every segment's rows, in order, as the packed forward.
    return [segments = std::vector<Flux2Segment>(built.begin(), built.end()),
            readers = s_->segment_readers()](SequenceGroup& member, const EditModel& model_here) {
      const auto& here = static_cast<const Flux2EditModel&>(model_here);
      std::vector<at::Tensor> rows;
      for (size_t i = 0; i < segments.size(); ++i) {
        Flux2Segment s = segments[i];
        std::unique_ptr<EntryKvSource> mine = readers[i] ? readers[i]->another_reader() : nullptr;
        s.kv = mine.get();
        rows.push_back(flux2_forward_sequence_parallel(*here.parts().transformer, s, member));
      }
      return rows.size() == 1 ? rows[0] : at::cat(rows, 0);
    };
  }
  bool splits_halves() const override { return s_->halves_split() && !s_->done(); }
  ParallelForward halves_step() override {
    std::span<Flux2Segment> built = s_->split_segments();
    return [segments = std::vector<Flux2Segment>(built.begin(), built.end())](SequenceGroup& member,
                                                                               const EditModel& model_here) mutable {
      const auto& here = static_cast<const Flux2EditModel&>(model_here);
      return flux2_forward_segment_per_rank(*here.parts().transformer, segments, member);
    };
  }
  HalvesForward halves_parallel_step() override {
    std::span<Flux2Segment> built = s_->segments();
    // As parallel_step: every rank reads the entries through readers of its own.
    return [segments = std::vector<Flux2Segment>(built.begin(), built.end()),
            readers = s_->segment_readers()](SequenceGroup& whole, SequenceGroup& half, const EditModel& model_here) {
      const auto& here = static_cast<const Flux2EditModel&>(model_here);
      std::vector<Flux2Segment> mine = segments;
      std::vector<std::unique_ptr<EntryKvSource>> kept;
      for (size_t i = 0; i < mine.size(); ++i) {
        kept.push_back(readers[i] ? readers[i]->another_reader() : nullptr);
        mine[i].kv = kept.back().get();
      }
      return flux2_forward_halves_sequence_parallel(*here.parts().transformer, mine, whole, half);
    };
  }
  Result<EditOutput> finish() const override {
    INFILL_ASSIGN_OR_RETURN(EditOutput out, s_->finish());
    out.prompt_truncated = prompt_truncated_;
    return out;
  }

 private:
  std::unique_ptr<Flux2EditSession> s_;
  bool prompt_truncated_;
  int heads_;
};

class Flux2StepPrepare final : public StepPrepare {
 public:
  Flux2StepPrepare(std::unique_ptr<Flux2PrepareRun> run, ActivationKey key, std::string template_id)
      : run_(std::move(run)), key_(std::move(key)), template_id_(std::move(template_id)) {}
  const ActivationKey& key() const override { return key_; }
  const std::string& template_id() const override { return template_id_; }
  int64_t tokens() const override { return run_->tokens(); }
  double attention_pairs() const override { return run_->attention_pairs(); }
  int steps() const override { return run_->steps(); }
  bool done() const override { return run_->done(); }
  void run_step() override { run_->run_step(); }
  bool waiting_for_adapters() const override { return run_->waiting_for_adapters(); }
  std::shared_ptr<const ActivationEntry> entry() const override { return run_->entry(); }
  int parallel_heads() const override {
    return run_->splits_over_devices() && !run_->done() ? run_->model().config().num_heads : 0;
  }
  ParallelShare parallel_step() override {
    // Built once here; every rank reads the same segments (their sinks write the one entry,
    // each rank its own rows) through its own device's transformer.
    return [segments = run_->step_segments()](SequenceGroup& member, const EditModel& model_here) {
      const auto& here = static_cast<const Flux2EditModel&>(model_here);
      for (const Flux2Segment& s : segments) (void)flux2_forward_sequence_parallel(*here.parts().transformer, s, member);
    };
  }
  void parallel_step_done() override { run_->step_done(); }

 private:
  std::unique_ptr<Flux2PrepareRun> run_;
  ActivationKey key_;
  std::string template_id_;
};

std::vector<at::Tensor> reference_latents(const EditParams& params) {
  std::vector<at::Tensor> latents;
  for (const ReferenceImage& r : params.references) latents.push_back(r.latent);
  return latents;
}

// An edit's session parameters, its prompt encoded; `truncated` tells whether it was cut.

Result<Flux2EditParams> session_params(const Flux2EditModelParts& parts, const PromptEmbedding& empty_prompt,
                                       const EditParams& params, int steps, bool& truncated) {
  if (params.prompt.defined()) {
    return invalid_argument("FLUX.2 model " + parts.name + " takes prompts as text (prompt_text), not as a vector");
  }
  INFILL_ASSIGN_OR_RETURN(std::shared_ptr<const PromptEmbedding> prompt, parts.text->encode(params.prompt_text));
  truncated = prompt->truncated;
  Flux2EditParams p;
  p.mask = params.mask;
  p.prompt = prompt->rows;
  p.guidance = params.guidance_scale;
  if (!parts.transformer->config().guidance_embed && params.guidance_scale > 1.0) p.null_prompt = empty_prompt.rows;
  p.seed = params.seed;
  p.strength = params.strength;
  p.steps = steps;
  p.template_seed = params.schedule.template_seed;
  p.halo_tokens = params.halo_tokens;
  p.feather_px = params.feather_px;
  p.decode_margin = params.decode_margin;
  p.adapters = params.adapters;
  p.adapter_load = params.adapter_load;
  p.adapters_from_step = params.adapters_from_step;
  p.references = reference_latents(params);
  return p;
}

}  // namespace

Flux2EditModel::Flux2EditModel(Flux2EditModelParts parts) : parts_(std::move(parts)) {
  info_.id = parts_.id.empty() ? parts_.name : parts_.id;
  info_.name = parts_.name;
  info_.description = parts_.description;
  info_.family = "flux2";
  info_.default_steps = parts_.default_steps;
  info_.default_sampler = "euler_rf";
  info_.default_guidance = parts_.default_guidance;
  info_.max_image_pixels = parts_.max_image_pixels;
  info_.free_text = true;
}

DeviceKvTierStats Flux2EditModel::device_tier_stats() const {
  return device_tier_ ? device_tier_->stats() : DeviceKvTierStats{};
}

StepGraphStats Flux2EditModel::step_graph_stats() const {
  return step_graphs_ ? step_graphs_->stats() : StepGraphStats{};
}

void Flux2EditModel::release_unused() const {
  if (step_graphs_) step_graphs_->drop_released_adapters();
  if (device_tier_) device_tier_->drop_orphans();
}

std::optional<int64_t> Flux2EditModel::codec_host_fallbacks() const {
  const auto* fallback = dynamic_cast<const HostFallbackCodec*>(parts_.codec.get());
  if (fallback == nullptr) return std::nullopt;
  return fallback->host_fallbacks();
}

EditModel::ParallelShape Flux2EditModel::parallel_shape() const {
  const Flux2Config& c = parts_.transformer->config();
  return {c.hidden_size, c.depth(), c.in_channels};
}

ComputeDevice Flux2EditModel::device() const {
  const at::Device d = parts_.transformer->device();
  return d.is_cuda() ? ComputeDevice{true, d.index() < 0 ? 0 : static_cast<int>(d.index())} : ComputeDevice{};
}

Status Flux2EditModel::set_prompt(EditParams& params, const std::string& text) const {
  params.prompt = at::Tensor();
  params.prompt_text = text;
  return {};
}

Status Flux2EditModel::check_schedule(const EditParams& params) const {
  if (!params.schedule.sampler.empty() && params.schedule.sampler != "euler_rf") {
    return invalid_argument("sampler '" + params.schedule.sampler + "' is not one model " + parts_.name +
                            " runs (expected euler_rf, FLUX.2's flow-matching Euler)");
  }
  const int steps = resolved_steps(params);
  if (steps < 1 || steps > Sampler::kMaxSteps) {
    return invalid_argument("steps is " + std::to_string(steps) + ", expected 1.." + std::to_string(Sampler::kMaxSteps));
  }
  if (params.adapters_from_step < 0 || params.adapters_from_step > steps) {
    return invalid_argument("adapters_from_step is " + std::to_string(params.adapters_from_step) + ", expected 0.." +
                            std::to_string(steps) + " (the edit's steps)");
  }
  return {};
}

Result<std::shared_ptr<const Flux2EditModel>> Flux2EditModel::create(Flux2EditModelParts parts) {
  if (!parts.transformer || !parts.codec || !parts.text) {
    return invalid_argument("FLUX.2 model " + parts.name + " needs a transformer, an autoencoder and a text encoder");
  }
  const Flux2Config& cfg = parts.transformer->config();
  if (parts.codec->latent_channels() != cfg.in_channels) {
    return invalid_argument("FLUX.2 model " + parts.name + ": the autoencoder's latent has " +
                            std::to_string(parts.codec->latent_channels()) + " channels, the transformer reads " +
                            std::to_string(cfg.in_channels));
  }
  if (parts.preview_codec && (parts.preview_codec->latent_channels() != cfg.in_channels ||
                              parts.preview_codec->factor() != parts.codec->factor())) {
    return invalid_argument("FLUX.2 model " + parts.name + ": the preview decoder does not read the autoencoder's latent");
  }
  if (parts.text->context_dim() != cfg.context_dim) {
    return invalid_argument("FLUX.2 model " + parts.name + ": the text encoder gives rows of " +
                            std::to_string(parts.text->context_dim()) + " channels, the transformer reads " +
                            std::to_string(cfg.context_dim));
  }
  if (parts.default_steps < 1) return invalid_argument("FLUX.2 model " + parts.name + ": default_steps must be >= 1");
  INFILL_ASSIGN_OR_RETURN(std::shared_ptr<const PromptEmbedding> empty, parts.text->encode(""));
  std::shared_ptr<Flux2EditModel> model(new Flux2EditModel(std::move(parts)));
  model->empty_prompt_ = std::move(empty);
  if (const ComputeDevice device = model->device(); device.cuda) {
    model->device_tier_ = std::make_shared<DeviceKvTier>(device, model->parts_.device_cache_bytes,
                                                         model->parts_.transformer->compute_dtype());
    if (model->parts_.host_to_device_bytes_per_ms <= 0) {
      try {
        model->parts_.host_to_device_bytes_per_ms = measure_host_to_device_bytes_per_ms(device.torch_device());
      } catch (const c10::Error&) {
        // No room for the probe's 64 MiB: left at 0, the worker copies entries without a plan.
      }
    }
  }
  if ((model->device().cuda || model->parts_.step_graphs_on_cpu) && model->parts_.step_graph_bytes > 0) {
    model->step_graphs_ = std::make_shared<Flux2GraphCache>(*model->parts_.transformer, model->parts_.step_graph_bytes);
  }
  return std::shared_ptr<const Flux2EditModel>(std::move(model));
}

int Flux2EditModel::resolved_steps(const EditParams& params) const {
  return params.schedule.steps > 0 ? params.schedule.steps : parts_.default_steps;
}

Result<std::shared_ptr<const TemplateImage>> Flux2EditModel::make_template(std::span<const std::byte> bytes,
                                                                           const std::string& name_for_errors) const {
  return infill::make_template(*parts_.codec, parts_.codec->factor(), 0.0, 1.0, parts_.max_image_pixels, bytes,
                               name_for_errors);
}

ActivationKey Flux2EditModel::cache_key(const TemplateImage& tmpl, const EditParams& params) const {
  ActivationKey key;
  key.model_id = info_.id;
  key.template_hash = tmpl.id;
  key.width = static_cast<int>(tmpl.latent.size(2));
  key.height = static_cast<int>(tmpl.latent.size(1));
  key.steps = resolved_steps(params);
  key.sampler = "flux2_euler_rf";  // template-keyed: recorded under the empty prompt
  key.seed = params.schedule.template_seed;
  key.adapters = params.adapter_load ? params.adapter_load->key() : adapter_set_key(params.adapters);
  // An entry recorded with the adapters from step K holds K steps without them.
  if (!key.adapters.empty() && params.adapters_from_step > 0) key.adapters += "@" + std::to_string(params.adapters_from_step);
  for (const ReferenceImage& r : params.references) key.references += (key.references.empty() ? "" : ",") + r.id;
  return key;
}

std::optional<ActivationKey> Flux2EditModel::prompt_cache_key(const TemplateImage& tmpl, const EditParams& params) const {
  ActivationKey key = cache_key(tmpl, params);
  const std::string text = parts_.text->id() + '\n' + params.prompt_text;
  key.conditioning = "prompt-" + sha256_hex(std::as_bytes(std::span<const char>(text.data(), text.size())));
  return key;
}

Result<std::unique_ptr<StepSession>> Flux2EditModel::session_with(std::shared_ptr<const TemplateImage> tmpl,
                                                                  const EditParams& params, Flux2Cache cache) const {
  bool truncated = false;
  INFILL_ASSIGN_OR_RETURN(Flux2EditParams p, session_params(parts_, *empty_prompt_, params, resolved_steps(params), truncated));
  INFILL_ASSIGN_OR_RETURN(std::unique_ptr<Flux2EditSession> session,
                          Flux2EditSession::create(parts_.transformer, parts_.codec, std::move(tmpl), p, std::move(cache)));
  return std::unique_ptr<StepSession>(std::make_unique<Flux2StepSession>(std::move(session), truncated,
                                                                                parts_.transformer->config().num_heads));
}

Result<std::unique_ptr<StepSession>> Flux2EditModel::create_session(std::shared_ptr<const TemplateImage> tmpl,
                                                                    const EditParams& params,
                                                                    std::shared_ptr<const ActivationEntry> entry,
                                                                    std::shared_ptr<const ActivationEntry> prompt_entry) const {
  return create_session_planned(std::move(tmpl), params, std::move(entry), std::move(prompt_entry), 0);
}

Result<std::unique_ptr<StepSession>> Flux2EditModel::create_session_planned(std::shared_ptr<const TemplateImage> tmpl,
                                                                            const EditParams& params,
                                                                            std::shared_ptr<const ActivationEntry> entry,
                                                                            std::shared_ptr<const ActivationEntry> prompt_entry,
                                                                            int recompute_if_copied) const {
  Flux2Cache cache;
  if (params.cache == CacheMode::kUse) {
    cache.template_keyed = std::move(entry);
    cache.prompt_keyed = std::move(prompt_entry);
    if (device_tier_) {
      // On the pool, before the session's first step: the copy never stalls the step loop.
      // The entry the session reads first is placed last, so it is the most recently used.
      if (cache.template_keyed) cache.template_keyed_resident = device_tier_->get(cache.template_keyed);
      if (cache.prompt_keyed) cache.prompt_keyed_resident = device_tier_->get(cache.prompt_keyed);
      // A template-keyed entry the tier could not take crosses the bus at every step: the
      // plan's leading blocks are recomputed instead.
      if (cache.template_keyed && !cache.template_keyed_resident && !cache.prompt_keyed) {
        cache.recompute_blocks = std::clamp(recompute_if_copied, 0, streamable_blocks());
      }
    }
  }
  return session_with(std::move(tmpl), params, std::move(cache));
}

int Flux2EditModel::streamable_blocks() const { return parts_.transformer->config().depth(); }

Result<ReferenceImage> Flux2EditModel::make_reference(const TemplateImage& tmpl) const {
  if (tmpl.latent.size(0) != parts_.transformer->config().in_channels)
    return invalid_argument("reference image " + tmpl.id + " was not encoded for model " + name());
  {
    std::lock_guard lock(references_mu_);
    for (auto it = recent_references_.begin(); it != recent_references_.end(); ++it) {
      if (it->id != tmpl.id) continue;
      recent_references_.splice(recent_references_.begin(), recent_references_, it);
      return *it;
    }
  }
  // Encoding a scaled-down image is a VAE pass: the strokes of a live session reuse it.
  INFILL_ASSIGN_OR_RETURN(ReferenceImage made, make_reference_image(*parts_.codec, parts_.codec->factor(), tmpl));
  std::lock_guard lock(references_mu_);
  recent_references_.push_front(made);
  if (recent_references_.size() > 2 * kMaxReferenceImages) recent_references_.pop_back();
  return made;
}

Result<std::shared_ptr<const LoraAdapter>> Flux2EditModel::read_adapter(const std::string& path) const {
  INFILL_ASSIGN_OR_RETURN(std::shared_ptr<const LoraAdapter> adapter,
                          load_lora(path, parts_.transformer->config(), "model " + parts_.name));
  if (parts_.transformer->device().is_cpu()) return adapter;
  // In the compute dtype (half the bytes to keep and to copy) and pinned, so that the copy to
  // the device runs by DMA on the copy stream.
  bool pinned = false;
  return adapter->pinned(parts_.transformer->compute_dtype(), &pinned);
}

Result<std::shared_ptr<const LoraAdapter>> Flux2EditModel::adapter_on_device(std::shared_ptr<const LoraAdapter> host) const {
  const at::Device device = parts_.transformer->device();
  if (device.is_cpu()) return host;
  c10::InferenceMode guard;
  try {
    // Allocated and filled on a copy stream, so the copy does not queue behind the step the
    // worker is computing; each tensor is then recorded on the compute stream, so that its
    // memory is not reused before the steps that read it are done.
    c10::impl::VirtualGuardImpl guard_impl(device.type());
    const c10::Stream copy_stream = guard_impl.getStreamFromGlobalPool(device);
    const c10::Stream compute = guard_impl.getDefaultStream(device);
    auto copy = std::make_shared<LoraAdapter>(*host);
    {
      c10::StreamGuard on_copy_stream(copy_stream);
      const auto options = at::TensorOptions().device(device).dtype(parts_.transformer->compute_dtype());
      for (auto& [_, layer] : copy->layers) {
        layer.down = at::empty(layer.down.sizes(), options).copy_(layer.down, /*non_blocking=*/true);
        layer.up = at::empty(layer.up.sizes(), options).copy_(layer.up, /*non_blocking=*/true);
      }
    }
    copy_stream.synchronize();
    for (auto& [_, layer] : copy->layers) {
      layer.down.record_stream(compute);
      layer.up.record_stream(compute);
    }
    return std::shared_ptr<const LoraAdapter>(std::move(copy));
  } catch (const c10::Error& e) {
    return Status(ErrorCode::kResourceExhausted, host->path + ": no room on " + device.str() + " for the LoRA (" +
                                                     std::to_string(host->bytes()) + " bytes): " + e.what_without_backtrace());
  }
}

Result<std::unique_ptr<StepSession>> Flux2EditModel::create_session_recomputing(std::shared_ptr<const TemplateImage> tmpl,
                                                                                const EditParams& params,
                                                                                std::shared_ptr<const ActivationEntry> entry,
                                                                                int recompute_blocks) const {
  if (!entry) return invalid_argument("a recomputed prefix on a resident entry needs the entry");
  Flux2Cache cache;
  cache.template_keyed = std::move(entry);
  cache.recompute_blocks = recompute_blocks;
  return session_with(std::move(tmpl), params, std::move(cache));
}

Result<std::unique_ptr<StepSession>> Flux2EditModel::create_streamed_session(std::shared_ptr<const TemplateImage> tmpl,
                                                                             const EditParams& params,
                                                                             std::shared_ptr<StreamedKvSource> streamed,
                                                                             int recompute_blocks) const {
  if (!streamed) return invalid_argument("a streamed edit needs its streamed source");
  Flux2Cache cache;
  cache.template_keyed_streamed = std::move(streamed);
  cache.recompute_blocks = recompute_blocks;
  return session_with(std::move(tmpl), params, std::move(cache));
}

Result<std::unique_ptr<StepPrepare>> Flux2EditModel::create_prepare(std::shared_ptr<const TemplateImage> tmpl,
                                                                    const EditParams& params) const {
  ActivationKey key = cache_key(*tmpl, params);
  std::string id = tmpl->id;
  INFILL_ASSIGN_OR_RETURN(std::unique_ptr<Flux2PrepareRun> run,
                          Flux2PrepareRun::create(parts_.transformer, std::move(tmpl), empty_prompt_->rows, resolved_steps(params),
                                                  params.schedule.template_seed, params.guidance_scale, at::Tensor(),
                                                  params.adapters, reference_latents(params), params.adapter_load,
                                                  params.adapters_from_step));
  return std::unique_ptr<StepPrepare>(std::make_unique<Flux2StepPrepare>(std::move(run), std::move(key), std::move(id)));
}

Result<std::unique_ptr<StepPrepare>> Flux2EditModel::create_prompt_prepare(std::shared_ptr<const TemplateImage> tmpl,
                                                                           const EditParams& params) const {
  ActivationKey key = *prompt_cache_key(*tmpl, params);
  std::string id = tmpl->id;
  bool truncated = false;
  INFILL_ASSIGN_OR_RETURN(Flux2EditParams p, session_params(parts_, *empty_prompt_, params, resolved_steps(params), truncated));
  std::unique_ptr<Flux2PrepareRun> run;
  if (params.mask.defined() && (params.mask > 0).any().item<bool>()) {
    Flux2Stroke stroke{std::move(p), parts_.codec};
    INFILL_ASSIGN_OR_RETURN(run, Flux2PrepareRun::from_stroke(parts_.transformer, std::move(tmpl), std::move(stroke)));
  } else {
    const bool guided = flux2_runs_cfg(parts_.transformer->config(), p.guidance);
    INFILL_ASSIGN_OR_RETURN(run, Flux2PrepareRun::create(parts_.transformer, std::move(tmpl), p.prompt, p.steps,
                                                         p.template_seed, p.guidance, guided ? p.null_prompt : at::Tensor(),
                                                         p.adapters, p.references, p.adapter_load, p.adapters_from_step));
  }
  return std::unique_ptr<StepPrepare>(std::make_unique<Flux2StepPrepare>(std::move(run), std::move(key), std::move(id)));
}

at::Tensor Flux2EditModel::forward(std::span<StepSession* const> sessions) const {
  std::vector<Flux2Segment> segments;
  for (StepSession* s : sessions) {
    for (const Flux2Segment& segment : static_cast<Flux2StepSession*>(s)->session().segments()) segments.push_back(segment);
  }
  if (step_graphs_) {
    // A masked round of a shape it holds (or can record) replays; any other runs eagerly.
    if (at::Tensor rows = step_graphs_->run(segments); rows.defined()) return rows;
  }
  return parts_.transformer->forward_on_device(segments);  // the sessions apply it there
}

at::Tensor Flux2EditModel::decode_preview(const at::Tensor& latent, const PixelRect& box) const {
  if (box.empty()) return {};
  c10::InferenceMode guard;
  const LatentCodec& codec = parts_.preview_codec ? *parts_.preview_codec : *parts_.codec;
  const int f = codec.factor();
  // 3 latent pixels of context: the bundled model's learned decoder needs 3 for a crop to equal
  // the full decode (LearnedDecoderCodec::context_margin); the VAE's differences fade within 2.
  return codec.decode_crop(latent.unsqueeze(0), box.x / f, box.y / f, (box.width + f - 1) / f, (box.height + f - 1) / f,
                           3)[0];
}

}  // namespace infill

namespace infill {

Result<std::shared_ptr<const Flux2EditModel>> load_flux2_edit_model(const std::string& path, const Flux2LoadOptions& options) {
  INFILL_ASSIGN_OR_RETURN(std::unique_ptr<Flux2Model> loaded, load_flux2_model(path));
  const Flux2Folder& folder = loaded->folder;
  if (folder.text_encoder_dir.empty() || folder.tokenizer_dir.empty()) {
    return not_found(folder.root + " has no text_encoder/ and tokenizer/ beside the transformer (expected the Qwen3 "
                     "text encoder and its tokenizer: without them prompts cannot be encoded)");
  }
  INFILL_ASSIGN_OR_RETURN(Qwen3Config text_config, read_qwen3_config(folder.text_encoder_dir + "/config.json"));
  Qwen3PromptEncoder::Options text_options;
  text_options.max_length = folder.max_sequence_length;
  INFILL_ASSIGN_OR_RETURN(text_options.layers,
                          flux2_text_layers(text_config, loaded->transformer.config().context_dim, folder.text_encoder_dir));
  int64_t memory = options.memory_bytes;
  if (memory <= 0) memory = int64_t{::sysconf(_SC_PHYS_PAGES)} * ::sysconf(_SC_PAGESIZE);
  const int64_t encoder_bytes = qwen3_folder_weight_bytes(folder.text_encoder_dir);
  text_options.residency = text_encoder_residency(loaded->transformer.weight_bytes(), encoder_bytes, memory);
  // The transformer goes first, so that what is left of the GPU decides where the text
  // encoder computes (in bf16 there when it fits beside the K/V tier's budget).
  bool float8 = false;
  if (options.device.cuda) {
    if (options.float8_weights) {
      INFILL_RETURN_IF_ERROR(loaded->transformer.to_device_float8(options.device));
      float8 = true;
    } else {
      INFILL_RETURN_IF_ERROR(loaded->transformer.to_device(options.device));
    }
    const auto device_memory = cuda_device_memory(options.device.index);
    if (device_memory.ok() && text_encoder_fits_device(encoder_bytes, options.device_cache_bytes, device_memory->free_bytes)) {
      text_options.device = options.device;
    }
  } else if (options.float8_weights) {
    return invalid_argument(folder.root + ": float8_weights: " + float8_compute_status(options.device).message());
  }
  if (options.fused_norms) {
    auto fused = loaded->transformer.with_fused_norms();
    if (!fused.ok()) return invalid_argument(folder.root + ": fused_norm_kernels: " + fused.status().message());
    loaded->transformer = std::move(*fused);
  }
  INFILL_ASSIGN_OR_RETURN(std::unique_ptr<Qwen3PromptEncoder> text,
                          Qwen3PromptEncoder::load(folder.tokenizer_dir, folder.text_encoder_dir,
                                                   std::make_shared<PromptEmbeddingCache>(options.prompt_cache_bytes),
                                                   text_options));
  Flux2EditModelParts parts;
  parts.name = folder.name;
  std::vector<std::string> weight_files = folder.transformer_files;
  weight_files.push_back(folder.autoencoder_file);
  INFILL_ASSIGN_OR_RETURN(std::vector<std::string> text_files, safetensors_shards(folder.text_encoder_dir, "model"));
  weight_files.insert(weight_files.end(), text_files.begin(), text_files.end());
  weight_files.push_back(folder.tokenizer_dir + "/tokenizer.json");
  INFILL_ASSIGN_OR_RETURN(uint64_t identity, files_identity(weight_files));
  parts.id = folder.name + "-" + hex64(identity);
  parts.description = !folder.description.empty()
                          ? folder.description
                          : "FLUX.2 " + loaded->transformer.config().family_size() + " (" + flux2_layout_name(folder.layout) +
                                " folder, " + (folder.distilled ? "distilled" : "base") + ")";
  if (float8) {
    parts.id += "-fp8";
    parts.description += ", FP8 block weights";
  }
  if (loaded->transformer.fused_norms()) parts.description += ", fused norm kernels";
  // Prompt rows encoded in bf16 on the GPU are not the CPU's float32 ones: neither reads the
  // other's activation entries.
  if (text->on_gpu()) {
    parts.id += "-text-bf16";
    parts.description += ", text encoder on " + options.device.name();
  }
  parts.transformer = std::make_shared<const Flux2Transformer>(std::move(loaded->transformer));
  parts.codec = loaded->codec;
  if (options.device.cuda && loaded->autoencoder && loaded->codec == loaded->autoencoder) {
    // The VAE's template encodes and crop decodes on the GPU too: on the CPU a 1024x1024
    // stroke's crop takes seconds. Where the device cannot hold it, it stays on the CPU; a call
    // whose activations do not fit runs on the CPU copy (model/host_fallback_codec.h).
    if (auto moved = loaded->autoencoder->on_device(options.device); moved.ok()) {
      parts.codec = std::make_shared<const HostFallbackCodec>(std::make_shared<const Flux2Autoencoder>(std::move(*moved)),
                                                              loaded->autoencoder);
    }
  }
  parts.text = std::shared_ptr<Qwen3PromptEncoder>(std::move(text));
  parts.default_steps = folder.default_steps;
  parts.default_guidance = folder.default_guidance;
  parts.device_cache_bytes = options.device_cache_bytes;
  parts.step_graph_bytes = options.step_graph_bytes;
  return Flux2EditModel::create(std::move(parts));
}

}  // namespace infill
