#include "pipeline/edit_session.h"

#include <algorithm>
#include <cmath>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "pipeline/region_composite.h"

namespace infill {

namespace {

Status validate_prompt(const Model& model, const at::Tensor& prompt) {
  if (!prompt.defined()) return {};
  const DitConfig& cfg = model.manifest.dit;
  switch (cfg.conditioning) {
    case ConditioningType::kNone:
      return invalid_argument("model " + model.manifest.name + " takes no prompt conditioning");
    case ConditioningType::kClass: {
      if (prompt.numel() != 1 || at::isFloatingType(prompt.scalar_type())) {
        return invalid_argument("prompt must be one integer class id for model " + model.manifest.name);
      }
      const int64_t id = prompt.item<int64_t>();
      if (id < 0 || id >= cfg.num_classes) {
        return invalid_argument("class id " + std::to_string(id) + " is outside [0, " +
                                std::to_string(cfg.num_classes) + ")");
      }
      return {};
    }
    case ConditioningType::kVector:
      if (prompt.numel() != cfg.conditioning_dim) {
        return invalid_argument("prompt vector has " + std::to_string(prompt.numel()) + " values, model " +
                                model.manifest.name + " expects " + std::to_string(cfg.conditioning_dim));
      }
      if (!at::isfinite(prompt.to(at::kFloat)).all().item<bool>()) {
        return invalid_argument("prompt vector holds NaN or infinite values");
      }
      return {};
  }
  return {};
}

at::Generator seeded(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }

}  // namespace

ScheduleSpec resolve_schedule(const Model& model, const ScheduleSpec& spec) {
  ScheduleSpec s = spec;
  if (s.sampler.empty()) s.sampler = model.manifest.sampler.sampler;
  if (s.steps == 0) s.steps = model.manifest.sampler.steps;
  return s;
}

ActivationKey make_cache_key(const Model& model, const TemplateImage& tmpl, const ScheduleSpec& spec) {
  const ScheduleSpec s = resolve_schedule(model, spec);
  ActivationKey key;
  key.model_id = model.id;
  key.template_hash = tmpl.id;
  key.width = static_cast<int>(tmpl.latent.size(2));
  key.height = static_cast<int>(tmpl.latent.size(1));
  key.steps = s.steps;
  key.sampler = s.sampler;
  key.seed = s.template_seed;
  return key;
}

Result<Sampler> make_model_sampler(const Model& model, const ScheduleSpec& spec) {
  const ScheduleSpec s = resolve_schedule(model, spec);
  INFILL_ASSIGN_OR_RETURN(SamplerKind kind, parse_sampler(s.sampler));
  const Prediction prediction =
      model.manifest.dit.prediction == PredictionType::kFlow ? Prediction::kFlow : Prediction::kEpsilon;
  return Sampler::make(kind, s.steps, prediction, model.manifest.sampler.shift);
}

at::Tensor template_noise(const TemplateImage& tmpl, uint64_t seed) {
  return at::randn(tmpl.latent.sizes(), seeded(seed), at::kFloat);
}

namespace {

// Positions, in a contiguous [c, h, w] tensor, of the values that Dit::patchify puts in the
// rows `token_ids` ([gh, gw, c, p, p] layout: a row holds its patch's c x p x p values,
// channel-major): [M, c * p * p], for at::take.
at::Tensor patch_row_positions(int64_t c, int64_t h, int64_t w, int64_t p, const at::Tensor& token_ids) {
  const int64_t gw = w / p;
  const at::Tensor gy = at::floor_divide(token_ids, gw), gx = at::remainder(token_ids, gw);
  const at::Tensor corner = (gy * (p * w) + gx * p).unsqueeze(1);  // top-left of the patch, channel 0
  const at::Tensor ch = at::arange(c, at::kLong).view({c, 1, 1});
  const at::Tensor py = at::arange(p, at::kLong).view({1, p, 1});
  const at::Tensor px = at::arange(p, at::kLong).view({1, 1, p});
  return corner + (ch * (h * w) + py * w + px).reshape({1, c * p * p});
}

}  // namespace

at::Tensor patch_rows(const at::Tensor& chw, int64_t patch_size, const at::Tensor& token_ids) {
  return at::take(chw, patch_row_positions(chw.size(0), chw.size(1), chw.size(2), patch_size, token_ids));
}

namespace {

// The model's inputs in its manifest's order, each [c, h, w].
std::vector<at::Tensor> model_input_parts(const Model& model, const at::Tensor& noisy, const at::Tensor& known,
                                          const at::Tensor& latent_mask) {
  std::vector<at::Tensor> parts;
  for (DitInput input : model.manifest.dit.inputs) {
    switch (input) {
      case DitInput::kNoisyLatent: parts.push_back(noisy); break;
      case DitInput::kMaskedLatent: parts.push_back(known); break;
      case DitInput::kMask: parts.push_back(latent_mask.unsqueeze(0)); break;
    }
  }
  return parts;
}

}  // namespace

at::Tensor model_input(const Model& model, const at::Tensor& noisy, const at::Tensor& known,
                       const at::Tensor& latent_mask) {
  const std::vector<at::Tensor> parts = model_input_parts(model, noisy, known, latent_mask);
  return parts.size() == 1 ? parts[0] : at::cat(parts, 0);
}

Result<at::Tensor> checked_edit_mask(const at::Tensor& mask, const TemplateImage& tmpl) {
  if (!mask.defined() || mask.dim() != 2) {
    return invalid_argument("mask must be a 2-D [height, width] array");
  }
  if (mask.size(0) != tmpl.height || mask.size(1) != tmpl.width) {
    return invalid_argument("mask is " + std::to_string(mask.size(1)) + "x" + std::to_string(mask.size(0)) +
                            ", template is " + std::to_string(tmpl.width) + "x" + std::to_string(tmpl.height));
  }
  at::Tensor out = mask.to(at::kFloat);
  if (!at::isfinite(out).all().item<bool>()) return invalid_argument("mask holds NaN or infinite values");
  return out.clamp(0.0, 1.0);
}

Status check_edit_ranges(double strength, int halo_tokens, float feather_px) {
  if (!(strength > 0.0 && strength <= 1.0)) {
    return invalid_argument("strength is " + std::to_string(strength) + ", expected a value in (0, 1]");
  }
  if (halo_tokens < 0 || halo_tokens > 64) {
    return invalid_argument("halo_tokens is " + std::to_string(halo_tokens) + ", expected 0..64");
  }
  if (!(feather_px >= 0.0f && feather_px <= 256.0f)) {
    return invalid_argument("feather_px must be in [0, 256]");
  }
  return {};
}

Result<std::unique_ptr<EditSession>> EditSession::create(std::shared_ptr<const Model> model,
                                                         std::shared_ptr<const TemplateImage> tmpl,
                                                         const EditParams& params, CacheSource cache) {
  c10::InferenceMode guard;
  INFILL_ASSIGN_OR_RETURN(at::Tensor mask, checked_edit_mask(params.mask, *tmpl));
  INFILL_RETURN_IF_ERROR(check_edit_ranges(params.strength, params.halo_tokens, params.feather_px));
  INFILL_RETURN_IF_ERROR(validate_prompt(*model, params.prompt));
  if (!(params.guidance_scale >= 1.0 && params.guidance_scale <= 20.0)) {
    return invalid_argument("guidance_scale is " + std::to_string(params.guidance_scale) +
                            ", expected a value in [1, 20]");
  }
  INFILL_ASSIGN_OR_RETURN(Sampler sampler, make_model_sampler(*model, params.schedule));

  std::unique_ptr<EditSession> s(new EditSession());
  s->model_ = model;
  s->tmpl_ = tmpl;
  s->params_ = params;
  s->params_.mask = mask;
  s->params_.schedule = resolve_schedule(*model, params.schedule);
  s->sampler_.emplace(std::move(sampler));

  const DitConfig& cfg = model->manifest.dit;
  // The padding added to reach the model grid is never edited.
  at::Tensor padded = at::zeros({tmpl->model_height, tmpl->model_width}, at::kFloat);
  padded.narrow(0, 0, tmpl->height).narrow(1, 0, tmpl->width).copy_(s->params_.mask);
  s->latent_mask_ = latent_mask(padded, model->manifest.autoencoder.factor);
  s->tokens_ = masked_tokens(s->latent_mask_, cfg.patch_size, params.halo_tokens);
  s->keep_mask_ = (s->latent_mask_ == 0).unsqueeze(0);
  s->known_ = tmpl->latent * (1.0 - s->latent_mask_).unsqueeze(0);
  s->template_noise_ = template_noise(*tmpl, s->params_.schedule.template_seed);
  at::Tensor edit_noise = at::randn(tmpl->latent.sizes(), seeded(params.seed), at::kFloat);
  s->noise_ = at::where(s->keep_mask_, s->template_noise_, edit_noise);
  s->first_step_ = s->sampler_->start_step(params.strength);
  s->step_ = s->first_step_;
  s->x_ = s->sampler_->add_noise(tmpl->latent, s->noise_, s->step_).contiguous();

  if (s->uses_cache() && s->tokens_.count() > 0) {
    if (cache.empty()) return invalid_argument("edit needs the template's cache entry (run prepare first)");
    const ActivationLayout& l = cache.entry ? cache.entry->layout() : cache.streamed->layout();
    const int64_t tokens = static_cast<int64_t>(s->tokens_.grid_w) * s->tokens_.grid_h;
    if (l.steps != s->sampler_->steps() || l.blocks != cfg.depth || l.tokens != tokens || l.hidden != cfg.hidden_size) {
      return invalid_argument("cache entry layout (steps " + std::to_string(l.steps) + ", blocks " +
                              std::to_string(l.blocks) + ", tokens " + std::to_string(l.tokens) +
                              ") does not match this edit (steps " + std::to_string(s->sampler_->steps()) +
                              ", blocks " + std::to_string(cfg.depth) + ", tokens " + std::to_string(tokens) + ")");
    }
    if (cache.recompute_blocks < 0 || cache.recompute_blocks > cfg.depth) {
      return invalid_argument("recompute_blocks must be in [0, depth]");
    }
    s->cache_ = std::move(cache);
    if (s->cache_.entry) s->kv_ = std::make_unique<EntryKvSource>(s->cache_.entry, s->step_);
  }
  s->guided_ = params.prompt.defined() && params.guidance_scale != 1.0;
  const bool split_prompt = cfg.prompt_scope == PromptScope::kMaskedTokens || s->guided_;
  for (int k = s->first_step_; k < s->sampler_->steps(); ++k) {
    const double t = s->sampler_->model_timestep(k);
    s->cond_.push_back(model->dit.conditioning(t, params.prompt));
    s->null_cond_.push_back(split_prompt ? model->dit.conditioning(t, at::Tensor()) : s->cond_.back());
  }
  if (s->uses_cache() && s->tokens_.count() > 0) {
    const int64_t p = cfg.patch_size;
    s->noisy_positions_ =
        patch_row_positions(s->x_.size(0), s->x_.size(1), s->x_.size(2), p, s->tokens_.indices);
    // The noisy latent's part stays undefined: masked_input_rows() gathers it each step.
    for (const at::Tensor& part : model_input_parts(*model, at::Tensor(), s->known_, s->latent_mask_)) {
      s->input_rows_.push_back(part.defined() ? patch_rows(part, p, s->tokens_.indices) : at::Tensor());
    }
  }
  if (s->guided_) {
    KvSource* inner = s->cache_.streamed ? static_cast<KvSource*>(s->cache_.streamed.get()) : s->kv_.get();
    if (inner != nullptr) s->shared_kv_ = std::make_unique<RepeatingKvSource>(inner);
  }
  return s;
}

at::Tensor EditSession::masked_input_rows() const {
  std::vector<at::Tensor> parts;
  parts.reserve(input_rows_.size());
  for (const at::Tensor& rows : input_rows_) parts.push_back(rows.defined() ? rows : at::take(x_, noisy_positions_));
  return parts.size() == 1 ? parts[0] : at::cat(parts, 1);
}

std::span<DitSegment> EditSession::segments() {
  c10::InferenceMode guard;
  const Dit& dit = model_->dit;
  const DitConfig& cfg = model_->manifest.dit;
  DitSegment& seg = segments_[0];
  seg = DitSegment{};
  seg.grid_h = tokens_.grid_h;
  seg.grid_w = tokens_.grid_w;
  seg.cond = cond_[static_cast<size_t>(step_ - first_step_)];
  const at::Tensor& null_cond = null_cond_[static_cast<size_t>(step_ - first_step_)];
  seg.null_cond = cfg.prompt_scope == PromptScope::kMaskedTokens ? null_cond : seg.cond;
  const int recompute = cache_.recompute_blocks;
  // With every token masked nothing is read from the cache (all K/V rows are fresh).
  const int64_t grid_tokens = static_cast<int64_t>(tokens_.grid_h) * tokens_.grid_w;
  const bool reads_cache = uses_cache() && recompute < cfg.depth && tokens_.count() < grid_tokens;
  if (reads_cache) {
    if (cache_.streamed) {
      cache_.streamed->start_step(step_, recompute);
      seg.kv = cache_.streamed.get();
    } else {
      kv_->set_step(step_);
      seg.kv = kv_.get();
    }
    if (shared_kv_) {
      shared_kv_->reset();
      seg.kv = shared_kv_.get();
    }
  }
  if (uses_cache() && recompute == 0) {
    seg.tokens = masked_input_rows();
    seg.token_ids = tokens_.indices;
  } else {
    // All tokens for the first blocks (all of them without a cache), then the masked rows.
    seg.tokens = dit.patchify(model_input(*model_, x_, known_, latent_mask_));
    seg.token_ids = at::arange(grid_tokens, at::kLong);
    seg.full_blocks = uses_cache() ? recompute : cfg.depth;
    seg.carry_rows = tokens_.indices;
    if (cfg.prompt_scope == PromptScope::kMaskedTokens) seg.prompted = tokens_.token_mask();
  }
  if (!guided_) return {segments_, 1};
  // The null-prompt half: the same rows and K/V, every row conditioned on the null prompt.
  // Its fresh K/V rows go into its own buffers inside Dit::forward, never into the cache.
  DitSegment& null_seg = segments_[1];
  null_seg = seg;
  null_seg.cond = null_cond;
  null_seg.null_cond = null_cond;
  null_seg.prompted = at::Tensor();
  null_seg.sink = nullptr;
  return {segments_, 2};
}

int64_t EditSession::prediction_rows() const { return (guided_ ? 2 : 1) * tokens_.count(); }

Status EditSession::apply(const at::Tensor& prediction) { return apply(prediction, step_ + 1); }

Status EditSession::apply(const at::Tensor& prediction, int next_step) {
  c10::InferenceMode guard;
  if (next_step <= step_ || next_step > sampler_->steps()) {
    return invalid_argument("next step " + std::to_string(next_step) + " is outside (" + std::to_string(step_) + ", " +
                            std::to_string(sampler_->steps()) + "]");
  }
  if (cache_.streamed) INFILL_RETURN_IF_ERROR(cache_.streamed->status());
  if (prediction.dim() != 2 || prediction.size(0) != prediction_rows()) {
    return invalid_argument("prediction has " + std::to_string(prediction.dim() == 2 ? prediction.size(0) : -1) +
                            " rows, the step expects " + std::to_string(prediction_rows()));
  }
  at::Tensor rows = prediction;
  if (guided_) {
    const int64_t m = tokens_.count();
    const at::Tensor with_prompt = prediction.narrow(0, 0, m);
    const at::Tensor without = prediction.narrow(0, m, m);
    rows = without + (with_prompt - without) * params_.guidance_scale;
  }
  at::Tensor pred = at::zeros_like(x_);
  model_->dit.unpatchify_into(pred, rows, tokens_.indices);
  at::Tensor next = sampler_->step_to(x_, pred, step_, next_step);
  at::Tensor reset = sampler_->add_noise(tmpl_->latent, template_noise_, next_step);
  last_prediction_ = sampler_->predict_x0(x_, pred, step_);
  x_ = at::where(keep_mask_, reset, next).contiguous();
  steps_dropped_ += next_step - step_ - 1;
  step_ = next_step;
  return {};
}

at::Tensor EditSession::predicted_latent() const {
  c10::InferenceMode guard;
  if (!last_prediction_.defined()) return tmpl_->latent;
  return at::where(keep_mask_, tmpl_->latent, last_prediction_);
}

Result<EditOutput> EditSession::finish() const {
  c10::InferenceMode guard;
  EditOutput out;
  out.steps_run = step_ - first_step_ - steps_dropped_;
  out.steps_dropped = steps_dropped_;
  out.masked_tokens = tokens_.count();
  out.total_tokens = static_cast<int64_t>(tokens_.grid_w) * tokens_.grid_h;
  out.used_cache = uses_cache() && tokens_.count() > 0;
  out.cache_mode = out.used_cache ? "template_keyed" : "off";
  out.streamed_cache = cache_.streamed != nullptr;
  out.recomputed_blocks = cache_.recompute_blocks;
  if (tokens_.count() == 0) {
    // Nothing to regenerate: the template itself, bit for bit.
    out.steps_run = 0;
    out.image = tmpl_->pixels;
    return out;
  }
  if (!done()) return invalid_argument("edit is not finished: step " + std::to_string(step_) + " of " +
                                       std::to_string(sampler_->steps()));
  const at::Tensor z = to_autoencoder_scale(*model_, at::where(keep_mask_, tmpl_->latent, x_));
  RegionComposite done = decode_region_and_composite(*model_->autoencoder, *tmpl_, z, params_.mask, params_.feather_px,
                                                     params_.decode_margin);
  out.image = std::move(done.image);
  out.region = done.region;
  return out;
}

}  // namespace infill
