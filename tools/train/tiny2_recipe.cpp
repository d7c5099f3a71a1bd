#include "tiny2_recipe.h"

#include <filesystem>
#include <fstream>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "bpe_trainer.h"
#include "captions.h"
#include "colour_words.h"
#include "common/blas_kernel.h"
#include "flux2_trainer.h"
#include "loss_plot.h"
#include "model/compute_threads.h"
#include "model/learned_decoder_codec.h"
#include "model/qwen3_encoder.h"
#include "model/qwen3_prompt_encoder.h"
#include "model/safetensors.h"
#include "model/safetensors_torch.h"
#include "patch_pca_fit.h"
#include "text/chat_template.h"
#include "train_codec.h"
#include "wallpaper_dataset.h"

namespace infill::train {

namespace fs = std::filesystem;

namespace {

constexpr const char* kModelName = "infill-tiny-2";
constexpr double kTextEmbeddingScale = 50.0;  // std 0.02 -> 1

Status write_json(const fs::path& path, const nlohmann::ordered_json& j) {
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  if (!out) return io_error("cannot write " + path.string());
  return {};
}

nlohmann::json curve_json(const std::vector<LossPoint>& curve) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& p : curve) a.push_back({p.step, p.loss});
  return a;
}

// Multiplies the token embedding of the encoder saved in `dir` by `factor`, in place.
Status scale_text_embedding(const std::string& dir, double factor) {
  const std::string path = dir + "/model.safetensors";
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  {
    INFILL_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(path));
    for (const TensorInfo& t : file.tensors()) {
      INFILL_ASSIGN_OR_RETURN(at::Tensor v, load_stored_tensor(file, t.name));
      if (t.name == "model.embed_tokens.weight") v = (v.to(at::kFloat) * factor).to(v.scalar_type());
      tensors.emplace_back(t.name, v.clone());
    }
  }
  return write_safetensors(path, tensors, {{"format", "pt"}});
}

Flux2Config transformer_config(const Tiny2Options& o, int latent_channels, int context_dim) {
  Flux2Config c;
  c.in_channels = latent_channels;
  c.mask_channels = 4;  // 2x2 cells per token: one per 8x8 PCA patch
  c.context_dim = context_dim;
  c.hidden_size = o.hidden;
  c.num_heads = o.heads;
  c.double_blocks = o.double_blocks;
  c.single_blocks = o.single_blocks;
  c.mlp_hidden = 3 * o.hidden;  // FLUX.2's mlp_ratio
  const int quarter = o.hidden / o.heads / 4;
  c.axes_dim = {quarter, quarter, quarter, quarter};
  return c;
}

Qwen3Config text_config(const Tiny2Options& o, int vocab_size) {
  Qwen3Config c;
  c.vocab_size = vocab_size;
  c.hidden_size = o.text_hidden;
  c.num_layers = o.text_layers;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = o.text_hidden / 4;
  c.intermediate_size = 3 * o.text_hidden;
  return c;
}

}  // namespace

Status make_infill_tiny2(const Tiny2Options& o, const std::function<void(const std::string&)>& progress) {
  set_compute_threads(o.threads);
  const fs::path out(o.out), work(o.work_dir);
  std::error_code ec;
  for (const char* sub : {"vae", "tokenizer", "text_encoder", "transformer"}) fs::create_directories(out / sub, ec);
  if (ec) return io_error("cannot create " + o.out + ": " + ec.message());
  nlohmann::ordered_json record = {{"seed", o.seed}, {"threads", o.threads}};
  // The GEMM kernels round differently (SkylakeX, Haswell, Prescott): the same seed gives the
  // same weights with the same kernels, so the record names them.
  const std::string blas = describe(blas_kernel_choice());
  progress("blas: " + blas);
  record["blas"] = blas;

  // 1. Data.
  INFILL_ASSIGN_OR_RETURN(Dataset data, load_dataset(DatasetOptions{}));
  progress("data: " + std::to_string(data.train.size()) + " training images, " + std::to_string(data.held_out.size()) +
           " held-out images");
  record["train_images"] = data.train.size();
  record["held_out_images"] = data.held_out.size();

  // 2. Text: tokenizer trained on the training captions as the encoder sees them (inside the
  // chat wrapper, so its words and line breaks become single tokens too); encoder weights
  // fixed by the seed.
  INFILL_ASSIGN_OR_RETURN(const ChatTemplate chat, recognise_chat_template(kCompactChatTemplate, "the compact chat template"));
  std::vector<std::string> corpus;
  for (const std::string& caption : training_caption_corpus()) corpus.push_back(render_user_prompt(chat, caption));
  INFILL_RETURN_IF_ERROR(write_tokenizer_folder((out / "tokenizer").string(), corpus, o.vocab_size));
  INFILL_ASSIGN_OR_RETURN(PromptTokenizer tokenizer, PromptTokenizer::load((out / "tokenizer").string()));
  const Qwen3Config text = text_config(o, tokenizer.tokenizer().id_count());
  INFILL_RETURN_IF_ERROR(Qwen3Encoder::random(text, o.seed + 101, at::kBFloat16)->save((out / "text_encoder").string()));
  // Qwen3's initialisation (std 0.02 everywhere) lets each layer's attention, nearly uniform
  // over the preceding tokens, outweigh the token's own embedding: the hidden states are
  // mostly the context's average, and the first transformer trained on them followed the
  // colour word in 25% of edits (chance: 8%). An embedding of std 1 keeps every row's token
  // identity dominant, with the context as a smaller perturbation.
  INFILL_RETURN_IF_ERROR(scale_text_embedding((out / "text_encoder").string(), kTextEmbeddingScale));
  const int context_dim = o.text_layers * o.text_hidden;  // every layer's hidden state, stacked
  Qwen3PromptEncoder::Options text_options;
  text_options.max_length = o.max_sequence_length;
  INFILL_ASSIGN_OR_RETURN(text_options.layers, flux2_text_layers(text, context_dim, (out / "text_encoder").string()));
  INFILL_ASSIGN_OR_RETURN(
      std::unique_ptr<Qwen3PromptEncoder> encoder,
      Qwen3PromptEncoder::load((out / "tokenizer").string(), (out / "text_encoder").string(),
                               std::make_shared<PromptEmbeddingCache>(int64_t{512} << 20), text_options));
  progress("text: " + std::to_string(corpus.size()) + " training captions, vocabulary " +
           std::to_string(tokenizer.tokenizer().id_count()) + " tokens, encoder hidden " + std::to_string(o.text_hidden) +
           " x " + std::to_string(o.text_layers) + " layers");
  record["text"] = {{"captions", corpus.size()}, {"vocab_size", tokenizer.tokenizer().id_count()},
                    {"hidden", o.text_hidden}, {"layers", o.text_layers}, {"max_sequence_length", o.max_sequence_length},
                    {"encoder", "fixed seeded weights (seed + 101), embedding scaled by 50 (std 1)"}};
  // Every caption, held-out phrasings included, must fit the text rows untruncated.
  size_t longest = 0;
  std::string longest_caption;
  for (const auto& label : every_label()) {
    for (CaptionSplit split : {CaptionSplit::kTraining, CaptionSplit::kHeldOut}) {
      for (const std::string& caption : every_caption(label, split)) {
        const PromptTokens tokens = tokenizer.encode(caption, o.max_sequence_length);
        if (static_cast<size_t>(tokens.full_length) > longest) {
          longest = static_cast<size_t>(tokens.full_length);
          longest_caption = caption;
        }
      }
    }
  }
  progress("text: the longest caption (\"" + longest_caption + "\") takes " + std::to_string(longest) + " of " +
           std::to_string(o.max_sequence_length) + " text rows");
  if (longest > static_cast<size_t>(o.max_sequence_length)) {
    return invalid_argument("--max-length " + std::to_string(o.max_sequence_length) + " truncates the caption \"" +
                            longest_caption + "\" (" + std::to_string(longest) + " tokens)");
  }
  record["text"]["longest_caption_tokens"] = longest;
  if (o.stop_after == "text") return {};

  // 3. Codec: the PCA in closed form, then the decoder.
  at::Generator pca_gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  CropOptions crop_options;
  crop_options.size = 256;
  const at::Tensor pca_crops = random_crops(data.train, 1024, crop_options, pca_gen);
  INFILL_ASSIGN_OR_RETURN(PatchPcaCodec pca, fit_patch_pca(pca_crops, 8, o.pca_channels));
  CodecTrainOptions codec_options;
  codec_options.seed = o.seed;
  codec_options.steps = o.decoder_steps;
  codec_options.work_dir = (work / "decoder").string();
  const std::string codec_path = (out / "vae" / "codec.safetensors").string();
  INFILL_ASSIGN_OR_RETURN(CodecTrainResult c, train_codec(pca, data, codec_options, codec_path, progress));
  INFILL_ASSIGN_OR_RETURN(LearnedDecoderCodec codec, LearnedDecoderCodec::load(codec_path));
  progress("codec: patch PCA 8x8 -> " + std::to_string(o.pca_channels) + " channels + learned decoder, held-out PSNR " +
           std::to_string(c.held_out_psnr) + " dB (PCA decode " + std::to_string(c.held_out_pca_psnr) +
           " dB), blockiness of noisy latents 8/16 px " + std::to_string(c.blockiness8) + "/" +
           std::to_string(c.blockiness16) + " (PCA decode " + std::to_string(c.pca_blockiness8) + "/" +
           std::to_string(c.pca_blockiness16) + ")");
  record["codec"] = {{"pca_channels", o.pca_channels},
                     {"latent_scale", c.latent_scale},
                     {"decoder_steps", o.decoder_steps},
                     {"held_out_psnr_db", c.held_out_psnr},
                     {"pca_held_out_psnr_db", c.held_out_pca_psnr},
                     {"noisy_latent_blockiness", {{"8", c.blockiness8}, {"16", c.blockiness16}}},
                     {"pca_noisy_latent_blockiness", {{"8", c.pca_blockiness8}, {"16", c.pca_blockiness16}}},
                     {"crop_blockiness", {{"8", c.crop_blockiness8}, {"16", c.crop_blockiness16}}},
                     {"seconds", c.run.seconds},
                     {"loss", curve_json(c.run.curve)},
                     {"held_out_loss", curve_json(c.run.held_out_curve)}};
  if (o.stop_after == "codec") return {};

  // 4. Transformer.
  const Flux2Config config = transformer_config(o, codec.latent_channels(), context_dim);
  INFILL_RETURN_IF_ERROR(config.validate());
  Flux2TrainText train_text;
  train_text.encode = [&](const std::string& prompt) -> Result<at::Tensor> {
    INFILL_ASSIGN_OR_RETURN(std::shared_ptr<const PromptEmbedding> e, encoder->encode(prompt));
    return e->rows;
  };
  train_text.caption = [](const std::vector<int>& words, uint64_t draw) {
    return make_caption(words, CaptionSplit::kTraining, draw);
  };
  Flux2TrainOptions t;
  t.seed = o.seed;
  t.steps = o.transformer_steps;
  t.small_steps = o.small_steps;
  t.lr = o.lr;
  t.recolour_share = o.recolour_share;
  t.work_dir = (work / "transformer").string();
  const std::string transformer_path = (out / "transformer" / "diffusion_pytorch_model.safetensors").string();
  INFILL_ASSIGN_OR_RETURN(TrainResult result, train_flux2(config, data, codec, train_text, t, transformer_path, progress));
  record["transformer"] = {{"hidden", config.hidden_size},  {"heads", config.num_heads},
                           {"double_blocks", config.double_blocks}, {"single_blocks", config.single_blocks},
                           {"mask_channels", config.mask_channels}, {"steps", t.steps},
                           {"small_steps", t.small_steps}, {"batch", t.batch}, {"small_batch", t.small_batch},
                           {"crop", t.crop}, {"small_crop", t.small_crop}, {"lr", t.lr},
                           {"recolour_share", t.recolour_share}, {"prompt_dropout", t.prompt_dropout},
                           {"seconds", result.seconds}, {"loss", curve_json(result.curve)},
                           {"held_out_loss", curve_json(result.held_out_curve)}};
  // Later stages' loss points follow the earlier ones', in steps and in time: one plot.
  int stage_steps = t.steps;
  auto append_stage = [&](const TrainResult& stage, int steps) {
    auto append = [&](std::vector<LossPoint>& to, const std::vector<LossPoint>& from) {
      for (LossPoint p : from) {
        p.step += stage_steps;
        p.seconds += result.seconds;
        to.push_back(p);
      }
    };
    append(result.curve, stage.curve);
    append(result.held_out_curve, stage.held_out_curve);
    result.seconds += stage.seconds;
    stage_steps += steps;
  };
  // Captions with distractor words. A distracted caption that would not fit the text rows
  // untruncated (the colour word could be cut) is drawn again, and after a few tries left
  // plain. With `keep_capitals`, a caption in capitals gets its distractors in capitals too
  // (stage 2 was trained without: its distractors stay lower case, as they were).
  auto distracting = [&](bool keep_capitals) {
    Flux2TrainText with = train_text;
    with.distract = [&, keep_capitals](const std::string& caption, uint64_t draw) {
      const bool shouted = keep_capitals && caption == in_capitals(caption);
      for (uint64_t attempt = 0; attempt < 8; ++attempt) {
        std::string noisy = add_distractors(caption, draw + attempt);
        if (shouted) noisy = in_capitals(noisy);
        if (tokenizer.encode(noisy, o.max_sequence_length).full_length <= o.max_sequence_length) return noisy;
      }
      return caption;
    };
    return with;
  };
  // Stages 2 and 3: the same network from the last stage's final weights, at `crop` px, with
  // their own warm-up, decay and EMA; each one's record goes to record["transformer"][key].
  std::string last_checkpoint = (work / "transformer" / "checkpoint").string();
  struct LaterStage {
    int steps;
    double lr;
    int warmup_steps;
    double ema_decay;
  };
  auto later_stage = [&](const std::string& key, const std::string& dir, const LaterStage& stage_options,
                         const Flux2TrainText& text, const nlohmann::ordered_json& shares) -> Status {
    Flux2TrainOptions d = t;
    d.steps = stage_options.steps;
    d.lr = stage_options.lr;
    d.warmup_steps = stage_options.warmup_steps;
    d.ema_decay = stage_options.ema_decay;
    d.distractor_share = o.distractor_share;
    d.small_steps = 0;
    d.init_from = last_checkpoint;
    d.work_dir = (work / dir).string();
    INFILL_ASSIGN_OR_RETURN(TrainResult stage, train_flux2(config, data, codec, text, d, transformer_path, progress));
    nlohmann::ordered_json r = {{"steps", d.steps}, {"batch", d.batch},
                                {"crop", d.crop},   {"lr", d.lr},
                                {"warmup_steps", d.warmup_steps}, {"ema_decay", d.ema_decay}};
    for (const auto& share : shares.items()) r[share.key()] = share.value();
    r["seconds"] = stage.seconds;
    r["loss"] = curve_json(stage.curve);
    r["held_out_loss"] = curve_json(stage.held_out_curve);
    record["transformer"][key] = r;
    append_stage(stage, d.steps);
    last_checkpoint = (work / dir / "checkpoint").string();
    return {};
  };
  if (o.distractor_steps > 0) {
    // Stage 2: captions with distractor words. A short stage: an EMA with a half-life of ~140
    // steps, so its weights follow it.
    INFILL_RETURN_IF_ERROR(later_stage("distractor_stage", "transformer-distractors",
                                       {o.distractor_steps, o.distractor_lr, 50, 0.995}, distracting(false),
                                       {{"distractor_share", o.distractor_share}}));
  }
  if (o.capitals_steps > 0) {
    // Stage 3: captions in capitals often. The byte-level BPE gives "PURPLE" other tokens than
    // "purple", and held-out phrasings in capitals were most of stage 2's missed colours.
    Flux2TrainText shouting = distracting(true);
    shouting.caption = [&](const std::vector<int>& words, uint64_t draw) {
      const std::string caption = make_caption(words, CaptionSplit::kTraining, draw);
      return within_share(caption_decision(draw, 0xca5eca5eull), o.capitals_share) ? in_capitals(caption) : caption;
    };
    // Shorter still: an EMA half-life of ~70 steps.
    INFILL_RETURN_IF_ERROR(later_stage("capitals_stage", "transformer-capitals",
                                       {o.capitals_steps, o.capitals_lr, 30, 0.99}, shouting,
                                       {{"capitals_share", o.capitals_share}, {"distractor_share", o.distractor_share}}));
  }

  // 5. The folder's index, the training record and the loss curve.
  nlohmann::ordered_json index = {
      {"_class_name", "Flux2KleinPipeline"},
      {"is_distilled", false},
      {"transformer", {"diffusers", "Flux2Transformer2DModel"}},
      {"vae", {"infill", "LearnedDecoderCodec"}},
      {"text_encoder", {"transformers", "Qwen3Model"}},
      {"tokenizer", {"transformers", "Qwen2TokenizerFast"}},
      {"scheduler", {"diffusers", "FlowMatchEulerDiscreteScheduler"}},
      {"infill",
       {{"description", "Tiny FLUX.2-architecture inpainting model trained by infill-train on Debian wallpapers; "
                        "free-text colour and tone prompts."},
        {"max_sequence_length", o.max_sequence_length},
        {"default_steps", 16},
        {"default_guidance", 3.0}}}};
  INFILL_RETURN_IF_ERROR(write_json(out / "model_index.json", index));
  nlohmann::json sources = nlohmann::json::array();
  for (const auto& s : data.train) sources.push_back({{"group", s.group}, {"path", s.path}, {"split", "train"}});
  for (const auto& s : data.held_out) sources.push_back({{"group", s.group}, {"path", s.path}, {"split", "held_out"}});
  record["sources"] = sources;
  INFILL_RETURN_IF_ERROR(write_json(out / "training.json", record));
  INFILL_RETURN_IF_ERROR(write_loss_plot((out / "loss.png").string(), result.curve, result.held_out_curve));
  progress(std::string("wrote ") + kModelName + " to " + o.out);
  return {};
}

}  // namespace infill::train
