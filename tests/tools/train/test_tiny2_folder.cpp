// A model folder in the bundled infill-tiny 2 format, built from its parts as infill-train
// writes them (trained tokenizer, Qwen3 encoder, mask-conditioned FLUX.2 transformer, learned
// decoder codec; small random weights), loads through the engine's one loader and edits with
// free text in every cache mode, keeping the pixels outside the mask.
#include "support/catch.h"
#include "support/edit_model_runs.h"
#include "support/random_image.h"
#include "support/temp_dir.h"

#include <filesystem>
#include <fstream>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "model/flux2_transformer.h"
#include "model/learned_decoder_codec.h"
#include "model/qwen3_encoder.h"
#include "pipeline/edit_model.h"
#include "pipeline/flux2_edit_model.h"
#include "pipeline/image_io.h"
#include "pipeline/load_edit_model.h"
#include "text/chat_template.h"
#include "text/prompt_tokenizer.h"
#include "tools/train/bpe_trainer.h"
#include "tools/train/captions.h"

using namespace infill;
namespace fs = std::filesystem;

namespace {

void write_tiny2_folder(const fs::path& root) {
  auto chat = recognise_chat_template(train::kCompactChatTemplate, "compact template");
  REQUIRE(chat.ok());
  std::vector<std::string> corpus;
  for (const std::string& caption : train::training_caption_corpus()) corpus.push_back(render_user_prompt(*chat, caption));
  REQUIRE(train::write_tokenizer_folder((root / "tokenizer").string(), corpus, 600).ok());
  auto tokenizer = PromptTokenizer::load((root / "tokenizer").string());
  REQUIRE(tokenizer.ok());

  Qwen3Config text;
  text.vocab_size = tokenizer->tokenizer().id_count();
  text.hidden_size = 32;
  text.num_layers = 3;
  text.num_heads = 2;
  text.num_kv_heads = 1;
  text.head_dim = 16;
  text.intermediate_size = 48;
  REQUIRE(Qwen3Encoder::random(text, 3, at::kBFloat16)->save((root / "text_encoder").string()).ok());

  Flux2Config cfg;
  cfg.in_channels = 32;  // 2x2 patches of the 8-channel PCA latent
  cfg.mask_channels = 4;
  cfg.context_dim = 3 * text.hidden_size;
  cfg.hidden_size = 64;
  cfg.num_heads = 2;
  cfg.double_blocks = 1;
  cfg.single_blocks = 1;
  cfg.mlp_hidden = 192;
  cfg.axes_dim = {8, 8, 8, 8};
  fs::create_directories(root / "transformer");
  REQUIRE(Flux2Transformer::random(cfg, 4, at::kHalf).save((root / "transformer" / "diffusion_pytorch_model.safetensors").string()).ok());

  fs::create_directories(root / "vae");
  REQUIRE(LearnedDecoderCodec::random(LearnedDecoderConfig{}, 5).save((root / "vae" / "codec.safetensors").string()).ok());
  std::ofstream(root / "model_index.json") << R"({"_class_name": "Flux2KleinPipeline", "is_distilled": false,
    "transformer": ["diffusers", "Flux2Transformer2DModel"], "vae": ["infill", "LearnedDecoderCodec"],
    "text_encoder": ["transformers", "Qwen3Model"], "tokenizer": ["transformers", "Qwen2TokenizerFast"],
    "infill": {"max_sequence_length": 24, "default_steps": 3, "default_guidance": 2.0, "description": "tiny 2 test"}})";
}

}  // namespace

TEST_CASE("an infill-tiny 2 folder loads through the engine's loader and edits with free text", "[train][tiny2]") {
  test::TempDir dir("infill-tiny2-folder");
  const fs::path root = fs::path(dir.path()) / "infill-tiny-2";
  write_tiny2_folder(root);

  auto loaded = load_edit_model(root.string());
  REQUIRE(loaded.ok());
  const EditModel& model = *loaded->model;
  CHECK(model.info().family == "flux2");
  CHECK(model.info().free_text);
  CHECK(model.info().default_steps == 3);
  CHECK(model.info().default_guidance == 2.0);
  CHECK(model.info().description == "tiny 2 test");
  // The id names the weights: the activation cache's disk tier must not serve K/V of
  // other weights retrained into the same folder.
  CHECK(model.info().id.rfind("infill-tiny-2-", 0) == 0);
  CHECK(model.token_pixels() == 16);
  const auto& flux2 = static_cast<const Flux2EditModel&>(model);
  CHECK(flux2.parts().transformer->config().mask_channels == 4);
  auto rows = flux2.parts().text->encode("make it dark blue");
  REQUIRE(rows.ok());
  CHECK((*rows)->rows.sizes() == at::IntArrayRef({24, 96}));  // max_sequence_length rows

  const PixelImage image = test::random_image(64, 48, 3, PixelFormat::kU8, 8);
  auto png = encode_png(image);
  REQUIRE(png.ok());
  auto tmpl = model.make_template(*png, "template.png");
  REQUIRE(tmpl.ok());
  EditParams params;
  params.mask = at::zeros({48, 64}, at::kFloat);
  params.mask.narrow(0, 10, 20).narrow(1, 20, 30).fill_(1.0f);
  REQUIRE(model.set_prompt(params, "make it dark blue").ok());
  params.guidance_scale = 2.0;  // a base model: classifier-free guidance with the empty prompt
  params.seed = 9;

  c10::InferenceMode guard;
  auto entry = model.create_prepare(*tmpl, params);
  REQUIRE(entry.ok());
  const auto template_keyed = test::prepare_to_end(std::move(*entry));
  auto prompt_entry = model.create_prompt_prepare(*tmpl, params);  // recorded from this stroke
  REQUIRE(prompt_entry.ok());
  const auto prompt_keyed = test::prepare_to_end(std::move(*prompt_entry));
  const std::vector<std::pair<std::string, std::pair<std::shared_ptr<const ActivationEntry>, std::shared_ptr<const ActivationEntry>>>>
      modes = {{"off", {nullptr, nullptr}}, {"template_keyed", {template_keyed, nullptr}}, {"prompt_keyed", {template_keyed, prompt_keyed}}};
  for (const auto& [mode, entries] : modes) {
    auto out = test::edit_to_end(model, *tmpl, params, entries.first, entries.second);
    REQUIRE(out.ok());
    CHECK(out->cache_mode == mode);
    CHECK(out->steps_run == 3);
    // Every pixel outside the mask keeps its bytes.
    const at::Tensor before = to_rgb_tensor(image), after = to_rgb_tensor(out->image);
    const at::Tensor outside = (params.mask == 0).unsqueeze(0).expand_as(before);
    CHECK(at::equal(before.masked_select(outside), after.masked_select(outside)));
    CHECK((before - after).abs().max().item<double>() > 0.0);
  }

  const auto& cfg = flux2.parts().transformer->config();
  REQUIRE(Flux2Transformer::random(cfg, 99, at::kHalf).save((root / "transformer" / "diffusion_pytorch_model.safetensors").string()).ok());
  auto retrained = load_edit_model(root.string());
  REQUIRE(retrained.ok());
  CHECK(retrained->model->info().id != model.info().id);
  CHECK(retrained->model->info().name == model.info().name);
}
