#include "pipeline/flux2_edit_session.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "pipeline/flux2_prepare_run.h"
#include "pipeline/flux2_sequence.h"
#include "pipeline/region_composite.h"

namespace infill {

const char* flux2_cache_mode_name(Flux2CacheMode mode) {
  switch (mode) {
    case Flux2CacheMode::kOff:
      return "off";
    case Flux2CacheMode::kTemplateKeyed:
      return "template_keyed";
    case Flux2CacheMode::kPromptKeyed:
      return "prompt_keyed";
  }
  return "off";
}

bool flux2_runs_cfg(const Flux2Config& cfg, double guidance) { return !cfg.guidance_embed && guidance > 1.0; }

int flux2_prompt_keyed_blocks(const Flux2Config& cfg, double guidance) {
  return flux2_runs_cfg(cfg, guidance) ? 2 * cfg.depth() : cfg.depth();
}

namespace {

// `halves`: the entry may hold two sequences' blocks (a guided prompt-keyed entry).
Status check_layout(const ActivationLayout* layout, const char* which, int steps, const Flux2Config& cfg,
                    int64_t tokens, bool halves = false) {
  if (layout == nullptr) return {};
  const ActivationLayout& l = *layout;
  const bool blocks_ok = l.blocks == cfg.depth() || (halves && l.blocks == 2 * cfg.depth());
  if (l.steps != steps || !blocks_ok || l.tokens != tokens || l.hidden != cfg.hidden_size) {
    return invalid_argument(std::string("the ") + which + " cache entry (steps " + std::to_string(l.steps) + ", blocks " +
                            std::to_string(l.blocks) + ", tokens " + std::to_string(l.tokens) + ", hidden " +
                            std::to_string(l.hidden) + ") does not match this edit (steps " + std::to_string(steps) +
                            ", blocks " + std::to_string(cfg.depth()) + ", tokens " + std::to_string(tokens) + ", hidden " +
                            std::to_string(cfg.hidden_size) + ")");
  }
  return {};
}

Status check_text(const at::Tensor& text, const char* which, const Flux2Config& cfg) {
  if (!text.defined() || text.dim() != 2 || text.size(0) < 1 || text.size(1) != cfg.context_dim) {
    return invalid_argument(std::string(which) + " must be text rows [L >= 1, " + std::to_string(cfg.context_dim) +
                            "] (the model's text width)");
  }
  return {};
}

}  // namespace

Result<std::unique_ptr<Flux2EditSession>> Flux2EditSession::create(std::shared_ptr<const Flux2Transformer> model,
                                                                   std::shared_ptr<const LatentCodec> codec,
                                                                   std::shared_ptr<const TemplateImage> tmpl,
                                                                   const Flux2EditParams& params, Flux2Cache cache,
                                                                   EntryKvSink* record, EntryKvSink* record_null) {
  c10::InferenceMode guard;
  const Flux2Config& cfg = model->config();
  INFILL_ASSIGN_OR_RETURN(at::Tensor mask, checked_edit_mask(params.mask, *tmpl));
  INFILL_RETURN_IF_ERROR(check_edit_ranges(params.strength, params.halo_tokens, params.feather_px));
  if (params.adapters_from_step < 0 || params.adapters_from_step > params.steps) {
    return invalid_argument("adapters_from_step is " + std::to_string(params.adapters_from_step) + ", expected 0 .. " +
                            std::to_string(params.steps) + " (the schedule's steps)");
  }
  INFILL_RETURN_IF_ERROR(check_text(params.prompt, "prompt", cfg));
  if (cfg.mask_channels > 0 && codec->factor() % cfg.mask_cells() != 0) {
    return invalid_argument("the model's " + std::to_string(cfg.mask_cells()) + "x" + std::to_string(cfg.mask_cells()) +
                            " mask cells do not divide its tokens of " + std::to_string(codec->factor()) + " pixels");
  }
  if (tmpl->latent.size(0) != cfg.in_channels || codec->factor() * tmpl->latent.size(1) != tmpl->model_height) {
    return invalid_argument("the template was not encoded for this model (latent " + std::to_string(tmpl->latent.size(0)) +
                            " channels, the model reads " + std::to_string(cfg.in_channels) + ")");
  }
  if (!(params.guidance >= 0.0 && params.guidance <= 20.0)) {
    return invalid_argument("guidance is " + std::to_string(params.guidance) + ", expected a value in [0, 20]");
  }
  INFILL_ASSIGN_OR_RETURN(Sampler sampler, flux2_sampler(*tmpl, params.steps));

  std::unique_ptr<Flux2EditSession> s(new Flux2EditSession());
  s->guided_ = flux2_runs_cfg(cfg, params.guidance);
  if (s->guided_) INFILL_RETURN_IF_ERROR(check_text(params.null_prompt, "null_prompt (classifier-free guidance)", cfg));
  if (s->guided_ && params.null_prompt.size(0) != params.prompt.size(0)) {
    return invalid_argument("prompt and null_prompt have different lengths (" + std::to_string(params.prompt.size(0)) +
                            " and " + std::to_string(params.null_prompt.size(0)) + " rows)");
  }
  s->model_ = std::move(model);
  s->codec_ = std::move(codec);
  s->tmpl_ = tmpl;
  s->params_ = params;
  s->params_.mask = mask;
  s->params_.prompt = params.prompt.to(at::kFloat).contiguous();
  if (s->guided_) s->params_.null_prompt = params.null_prompt.to(at::kFloat).contiguous();
  s->sampler_.emplace(std::move(sampler));

  s->grid_h_ = tmpl->latent.size(1);
  s->grid_w_ = tmpl->latent.size(2);
  s->text_rows_ = params.prompt.size(0);
  if (params.references.size() > static_cast<size_t>(kMaxReferenceImages)) {
    return invalid_argument(std::to_string(params.references.size()) + " reference images, expected at most " +
                            std::to_string(kMaxReferenceImages));
  }
  for (size_t i = 0; i < params.references.size(); ++i) {
    const at::Tensor& r = params.references[i];
    if (!r.defined() || r.dim() != 3 || r.size(0) != cfg.in_channels || r.size(1) < 1 || r.size(2) < 1) {
      return invalid_argument("reference image " + std::to_string(i) + " is not a latent of this model (expected [" +
                              std::to_string(cfg.in_channels) + ", h, w])");
    }
  }
  const int64_t n = s->grid_h_ * s->grid_w_;
  // The padding added to reach the model grid is never edited.
  at::Tensor padded = at::zeros({tmpl->model_height, tmpl->model_width}, at::kFloat);
  padded.narrow(0, 0, tmpl->height).narrow(1, 0, tmpl->width).copy_(mask);
  s->tokens_ = masked_tokens(latent_mask(padded, s->codec_->factor()), 1, params.halo_tokens);

  s->clean_ = latent_to_tokens(tmpl->latent);
  s->mask_rows_ = flux2_mask_rows(padded, s->codec_->factor(), cfg.mask_cells());
  Flux2ReferenceRows references = flux2_reference_rows(tmpl->latent, params.references, cfg.mask_channels);
  s->reference_rows_ = std::move(references.rows);
  s->sequence_ = s->text_rows_ + n + s->reference_rows_.size(0);
  const int64_t sequence = s->sequence_;
  const at::Tensor template_noise_rows = latent_to_tokens(template_noise(*tmpl, params.template_seed));
  const at::Tensor edit_noise_rows = latent_to_tokens(template_noise(*tmpl, params.seed));
  const at::Tensor masked = s->tokens_.token_mask().unsqueeze(1);
  s->noise_ = at::where(masked, edit_noise_rows, template_noise_rows);
  s->first_step_ = s->sampler_->start_step(params.strength);
  s->step_ = s->first_step_;
  s->x_ = s->sampler_->add_noise(s->clean_, s->noise_, s->step_).contiguous();

  s->text_ids_ = flux2_text_ids(s->text_rows_);
  s->image_ids_ = at::cat({flux2_grid_ids(s->grid_h_, s->grid_w_, 0), references.ids});
  const at::Tensor& idx = s->tokens_.indices;
  s->masked_ids_ = s->image_ids_.index_select(0, idx);
  s->masked_positions_ = idx + s->text_rows_;
  s->masked_positions_text_ = at::cat({at::arange(s->text_rows_, at::kLong), s->masked_positions_});

  // The step's state moves to the transformer's device once; from here every step's inputs are
  // gathered there and its update applied there.
  const at::Device device = s->model_->device();
  const at::ScalarType compute = s->model_->compute_dtype();
  s->params_.prompt = s->params_.prompt.to(device, compute).contiguous();
  if (s->guided_) s->params_.null_prompt = s->params_.null_prompt.to(device, compute).contiguous();
  for (at::Tensor* t : {&s->clean_, &s->mask_rows_, &s->reference_rows_, &s->noise_, &s->x_}) *t = t->to(device);
  s->masked_index_ = idx.to(device);
  s->masked_mask_rows_ = s->mask_rows_.index_select(0, s->masked_index_);
  s->masked_positions_device_ = s->masked_positions_.to(device);
  s->masked_positions_text_device_ = s->masked_positions_text_.to(device);
  std::vector<at::Tensor> levels;
  for (int i = 0; i < s->sampler_->steps(); ++i) {
    // The value build_segment gives the forward, embedded as the forward would embed it.
    levels.push_back(flux2_timestep_embedding(s->sampler_->model_timestep(i) / 1000.0, cfg.time_embed_dim));
  }
  s->time_embeddings_ = at::stack(levels).to(device);
  if (cfg.guidance_embed) s->guidance_embedding_ = flux2_timestep_embedding(params.guidance, cfg.time_embed_dim).to(device);

  if (cache.template_keyed_streamed && (cache.template_keyed || cache.prompt_keyed || record != nullptr)) {
    return invalid_argument("a streamed template-keyed entry is read alone (no resident entry, no recording)");
  }
  const auto layout_of = [](const ActivationEntry* e) { return e ? &e->layout() : nullptr; };
  INFILL_RETURN_IF_ERROR(
      check_layout(layout_of(cache.prompt_keyed.get()), "prompt-keyed", s->sampler_->steps(), cfg, sequence, true));
  if (record != nullptr && s->guided_ && record_null == nullptr) {
    return invalid_argument("a guided recording records both halves: the null-prompt segment has no sink");
  }
  INFILL_RETURN_IF_ERROR(check_layout(layout_of(cache.template_keyed.get()), "template-keyed", s->sampler_->steps(), cfg, sequence));
  INFILL_RETURN_IF_ERROR(check_layout(cache.template_keyed_streamed ? &cache.template_keyed_streamed->layout() : nullptr,
                                      "streamed template-keyed", s->sampler_->steps(), cfg, sequence));
  if (cache.recompute_blocks < 0 || cache.recompute_blocks > cfg.depth()) {
    return invalid_argument("recompute_blocks is " + std::to_string(cache.recompute_blocks) + ", expected 0 .. " +
                            std::to_string(cfg.depth()) + " (the transformer's blocks)");
  }
  if (cache.recompute_blocks > 0 &&
      (record != nullptr || cache.prompt_keyed || !(cache.template_keyed || cache.template_keyed_streamed))) {
    return invalid_argument("a recomputed prefix reads a template-keyed entry (no prompt-keyed entry, no recording)");
  }
  s->cache_ = std::move(cache);
  s->record_ = record;
  s->record_null_ = s->guided_ ? record_null : nullptr;
  if (record != nullptr) {  // recording one: every segment is computed whole
    s->cache_.prompt_keyed.reset();
    s->cache_.template_keyed.reset();
  }
  s->mode_ = record != nullptr              ? Flux2CacheMode::kOff
             : s->cache_.prompt_keyed     ? Flux2CacheMode::kPromptKeyed
             : s->cache_.template_keyed || s->cache_.template_keyed_streamed ? Flux2CacheMode::kTemplateKeyed
                                                                               : Flux2CacheMode::kOff;
  // Each source reads one sequence's blocks (a guided prompt-keyed entry holds two).
  const int depth = cfg.depth();
  if (s->mode_ == Flux2CacheMode::kPromptKeyed) {
    s->kv_ = std::make_unique<EntryKvSource>(s->cache_.prompt_keyed, s->step_, s->cache_.prompt_keyed_resident, 0, depth);
  }
  if (s->mode_ == Flux2CacheMode::kTemplateKeyed && s->cache_.template_keyed) {
    s->kv_ = std::make_unique<EntryKvSource>(s->cache_.template_keyed, s->step_, s->cache_.template_keyed_resident);
  }
  // The null-prompt half of guidance reads the null half of a guided prompt-keyed entry, else
  // the template-keyed entry as its own prompt-keyed one: through the prompted half's source
  // when that reads the same entry (one copy per block to a GPU, not two), and a streamed
  // entry serves both halves (each block's slabs stay until the next step's reads).
  const bool null_half_recorded =
      s->mode_ == Flux2CacheMode::kPromptKeyed && s->cache_.prompt_keyed->layout().blocks == 2 * depth;
  if (s->guided_ && null_half_recorded) {
    s->null_kv_ = std::make_unique<EntryKvSource>(s->cache_.prompt_keyed, s->step_, s->cache_.prompt_keyed_resident,
                                                  depth, depth);
  } else if (s->guided_ && s->mode_ == Flux2CacheMode::kPromptKeyed && s->cache_.template_keyed) {
    s->null_kv_ = std::make_unique<EntryKvSource>(s->cache_.template_keyed, s->step_, s->cache_.template_keyed_resident);
  }
  return s;
}

const Flux2EditSession::RopeTables& Flux2EditSession::rope_tables(RopeTables& slot,
                                                                  std::initializer_list<at::Tensor> ids) {
  if (!slot.cos.defined()) {
    const Flux2Config& cfg = model_->config();
    auto [cos, sin] = flux2_rope_angles(at::cat(ids), cfg.axes_dim, cfg.theta);
    const auto on_device = at::TensorOptions().device(model_->device()).dtype(model_->rope_table_dtype());
    slot.cos = cos.to(on_device);
    slot.sin = sin.to(on_device);
  }
  return slot;
}

void Flux2EditSession::build_segment(Flux2Segment& s, const at::Tensor& text, KvSource* kv, bool compute_text) {
  s = Flux2Segment{};
  if (adapters_apply_at(step_, params_.adapters_from_step)) s.adapters = params_.adapters;
  s.timestep = sampler_->model_timestep(step_) / 1000.0;
  s.guidance = params_.guidance;
  s.time_embedding = time_embeddings_[step_];
  s.guidance_embedding = guidance_embedding_;
  // The whole sequence's rows in order: text, image, reference.
  auto every_row = [&](RopeTables& tables) {
    s.txt = text;
    s.txt_ids = text_ids_;
    s.img = at::cat({flux2_with_mask(x_, mask_rows_), reference_rows_});
    s.img_ids = image_ids_;
    const RopeTables& rope = rope_tables(tables, {text_ids_, image_ids_});
    s.rope_cos = rope.cos;
    s.rope_sin = rope.sin;
  };
  if (kv == nullptr) {  // every token: text, image, reference
    every_row(rope_full_);
    return;
  }
  s.kv = kv;
  if (cache_.recompute_blocks > 0) {
    // The prefix runs on the whole sequence, as a full forward; the masked rows (and the text
    // when computed) go on after it.
    every_row(rope_full_);
    s.full_blocks = cache_.recompute_blocks;
    s.keep_positions = compute_text ? masked_positions_text_ : masked_positions_;
    return;
  }
  s.sequence_length = sequence_;
  s.img = flux2_with_mask(x_.index_select(0, masked_index_), masked_mask_rows_);
  s.img_ids = masked_ids_;
  if (compute_text) {
    s.txt = text;
    s.txt_ids = text_ids_;
    s.positions = masked_positions_text_;
    s.positions_on_device = masked_positions_text_device_;
  } else {
    s.txt = text.new_empty({0, text.size(1)});
    s.txt_ids = at::empty({0, 4}, at::kFloat);
    s.positions = masked_positions_;
    s.positions_on_device = masked_positions_device_;
  }
  const RopeTables& rope = compute_text ? rope_tables(rope_masked_text_, {text_ids_, masked_ids_})
                                        : rope_tables(rope_masked_, {masked_ids_});
  s.rope_cos = rope.cos;
  s.rope_sin = rope.sin;
}

bool Flux2EditSession::waiting_for_adapters() const {
  return params_.adapter_load && params_.adapters.empty() && !done() &&
         adapters_apply_at(step_, params_.adapters_from_step) && !params_.adapter_load->ready();
}

std::span<Flux2Segment> Flux2EditSession::segments() {
  if (params_.adapter_load && params_.adapters.empty() && adapters_apply_at(step_, params_.adapters_from_step)) {
    Result<AdapterSet> set = params_.adapter_load->result();  // the worker steps it only once read
    TORCH_CHECK(set.ok(), "flux2 edit: ", set.status().message());
    params_.adapters = std::move(*set);
  }
  StreamedKvSource* streamed = cache_.template_keyed_streamed.get();
  // The reads overlap this step's blocks; a recomputed prefix is never read.
  if (streamed != nullptr) streamed->start_step(step_, cache_.recompute_blocks);
  if (kv_) kv_->set_step(step_);
  if (null_kv_) null_kv_->set_step(step_);
  KvSource* source = mode_ == Flux2CacheMode::kOff ? nullptr : streamed ? static_cast<KvSource*>(streamed) : kv_.get();
  build_segment(segments_[0], params_.prompt, source, mode_ == Flux2CacheMode::kTemplateKeyed);
  if (record_ != nullptr) {
    record_->set_step(step_);
    segments_[0].sink = record_;
  }
  if (!guided_) return {segments_, 1};
  // Without a source of its own the null half reads the prompted half's template-keyed
  // entry, or (prompt-keyed, no null half recorded, no template-keyed entry) runs whole.
  KvSource* null_source = null_kv_                                ? static_cast<KvSource*>(null_kv_.get())
                          : mode_ == Flux2CacheMode::kTemplateKeyed ? source
                                                                    : nullptr;
  build_segment(segments_[1], params_.null_prompt, null_source, false);
  if (record_null_ != nullptr) {
    record_null_->set_step(step_);
    segments_[1].sink = record_null_;
  }
  return {segments_, 2};
}

bool Flux2EditSession::halves_split() const {
  return guided_ && !cache_.template_keyed_streamed && cache_.recompute_blocks == 0;
}

std::span<Flux2Segment> Flux2EditSession::split_segments() {
  TORCH_CHECK(halves_split(), "flux2 edit: the halves of this step share a source and cannot run apart");
  std::span<Flux2Segment> both = segments();
  if (both[1].kv != nullptr && both[1].kv == both[0].kv) {
    if (!split_null_kv_) {
      split_null_kv_ = std::make_unique<EntryKvSource>(cache_.template_keyed, step_, cache_.template_keyed_resident);
    }
    split_null_kv_->set_step(step_);
    both[1].kv = split_null_kv_.get();
  }
  return both;
}

bool Flux2EditSession::sequence_splits() const {
  return mode_ == Flux2CacheMode::kOff || (!cache_.template_keyed_streamed && cache_.recompute_blocks == 0);
}

std::vector<std::shared_ptr<const EntryKvSource>> Flux2EditSession::segment_readers() const {
  TORCH_CHECK(sequence_splits(), "flux2 edit: this step reads a source only one thread may read");
  std::vector<std::shared_ptr<const EntryKvSource>> readers;
  for (int i = 0; i < (guided_ ? 2 : 1); ++i) {
    const KvSource* kv = segments_[i].kv;
    const EntryKvSource* entry = kv == nullptr            ? nullptr
                                 : kv == kv_.get()          ? kv_.get()
                                 : kv == null_kv_.get()     ? null_kv_.get()
                                 : kv == split_null_kv_.get() ? split_null_kv_.get()
                                                              : nullptr;
    TORCH_CHECK(kv == nullptr || entry != nullptr, "flux2 edit: segment ", i, " reads a source of no entry");
    readers.push_back(entry != nullptr ? std::shared_ptr<const EntryKvSource>(entry->another_reader()) : nullptr);
  }
  return readers;
}

int64_t Flux2EditSession::rows_of(const Flux2Segment& s) const {
  return s.full_blocks > 0 ? tokens_.count() : s.img.size(0);  // a prefix keeps the masked image rows
}

int64_t Flux2EditSession::prediction_rows() const {
  int64_t rows = rows_of(segments_[0]);
  if (guided_) rows += rows_of(segments_[1]);
  return rows;
}

Status Flux2EditSession::apply(const at::Tensor& prediction) { return apply(prediction, step_ + 1); }

Status Flux2EditSession::apply(const at::Tensor& prediction, int next_step) {
  c10::InferenceMode guard;
  if (done()) return invalid_argument("edit is finished");
  if (next_step <= step_ || next_step > sampler_->steps()) {
    return invalid_argument("next step " + std::to_string(next_step) + " is not in (" + std::to_string(step_) + ", " +
                            std::to_string(sampler_->steps()) + "]");
  }
  if (prediction.dim() != 2 || prediction.size(0) != prediction_rows()) {
    return invalid_argument("prediction has " + std::to_string(prediction.size(0)) + " rows, expected " +
                            std::to_string(prediction_rows()));
  }
  // A slab that could not be read gave zeros to the forward: the step is void.
  if (cache_.template_keyed_streamed) INFILL_RETURN_IF_ERROR(cache_.template_keyed_streamed->status());
  const at::Tensor& idx = masked_index_;
  const int64_t m = idx.size(0);
  // Where the state is (a no-op for a forward on this session's device).
  const at::Tensor here = prediction.to(x_.device(), at::kFloat);
  // The masked rows of one segment's prediction: its first rows when cached, else the image
  // tokens' rows picked out of the full sequence's.
  const auto masked_rows = [&](const Flux2Segment& s, int64_t offset) {
    const at::Tensor rows = here.narrow(0, offset, rows_of(s));
    return s.kv != nullptr ? rows : rows.index_select(0, idx);
  };
  at::Tensor velocity = masked_rows(segments_[0], 0);
  if (guided_) {
    const at::Tensor null_velocity = masked_rows(segments_[1], rows_of(segments_[0]));
    velocity = null_velocity + params_.guidance * (velocity - null_velocity);
  }
  TORCH_CHECK(velocity.size(0) == m, "flux2 edit: velocity rows do not match the masked tokens");
  const at::Tensor stepped = sampler_->step_to(x_.index_select(0, idx), velocity, step_, next_step);
  step_ = next_step;
  // Unmasked tokens: the template at the new level, exactly as the prepare run saw them.
  x_ = sampler_->add_noise(clean_, noise_, step_).contiguous();
  x_.index_copy_(0, idx, stepped);
  last_velocity_ = velocity;
  return {};
}

at::Tensor Flux2EditSession::predicted_latent() const {
  c10::InferenceMode guard;
  at::Tensor rows = clean_.clone();
  if (last_velocity_.defined() && step_ > first_step_) {
    const at::Tensor& idx = masked_index_;
    // x0 = x_t - t v for the rectified flow; the step that made x_ ran at level step_ - 1.
    const at::Tensor before = x_.index_select(0, idx);
    const double t = sampler_->noise_scale(step_);
    rows.index_copy_(0, idx, before - t * last_velocity_);
  }
  return tokens_to_latent(rows, grid_h_, grid_w_).to(at::kCPU);  // a preview: the host waits here
}

Result<EditOutput> Flux2EditSession::finish() const {
  c10::InferenceMode guard;
  EditOutput out;
  out.steps_run = step_ - first_step_;
  out.masked_tokens = tokens_.count();
  out.total_tokens = grid_h_ * grid_w_;
  out.used_cache = mode_ != Flux2CacheMode::kOff && tokens_.count() > 0;
  out.cache_mode = flux2_cache_mode_name(mode_);
  out.streamed_cache = cache_.template_keyed_streamed != nullptr;
  if (!params_.adapters.empty() || params_.adapter_load) out.adapters_from_step = params_.adapters_from_step;
  out.recomputed_blocks = mode_ == Flux2CacheMode::kTemplateKeyed ? cache_.recompute_blocks : 0;
  out.copied_to_device = mode_ == Flux2CacheMode::kTemplateKeyed && cache_.template_keyed &&
                         !cache_.template_keyed_resident && !model_->device().is_cpu();
  if (tokens_.count() == 0) {
    out.steps_run = 0;
    out.image = tmpl_->pixels;
    return out;
  }
  if (!done()) {
    return invalid_argument("edit is not finished: step " + std::to_string(step_) + " of " +
                            std::to_string(sampler_->steps()));
  }
  // At the last level the unmasked rows are the template's latent itself.
  const at::Tensor latent = tokens_to_latent(x_.to(at::kCPU), grid_h_, grid_w_);
  RegionComposite done =
      decode_region_and_composite(*codec_, *tmpl_, latent, params_.mask, params_.feather_px, params_.decode_margin);
  out.image = std::move(done.image);
  out.region = done.region;
  return out;
}

}  // namespace infill
