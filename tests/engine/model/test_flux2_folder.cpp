#include "support/catch.h"
#include "support/shared_data.h"
#include "support/temp_dir.h"

#include <filesystem>
#include <fstream>
#include <string>

#include <ATen/ATen.h>

#include "model/flux2_checkpoint.h"
#include "model/flux2_folder.h"
#include "model/flux2_model.h"
#include "model/flux2_transformer.h"
#include "model/safetensors.h"
#include "model/safetensors_torch.h"

namespace fs = std::filesystem;
using infill::Flux2Folder;

namespace {

void write_text(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

infill::Flux2Config tiny() {
  infill::Flux2Config c;
  c.in_channels = 8;
  c.context_dim = 16;
  c.hidden_size = 32;
  c.num_heads = 2;
  c.double_blocks = 1;
  c.single_blocks = 1;
  c.mlp_hidden = 64;
  c.axes_dim = {4, 4, 4, 4};
  return c;
}

// A diffusers-layout folder as the klein repositories have it (weights are placeholders
// except where a test loads them).
fs::path make_diffusers_folder(const fs::path& root, const std::string& index_json) {
  write_text(root / "model_index.json", index_json);
  write_text(root / "transformer" / "config.json", "{}");
  write_text(root / "transformer" / "diffusion_pytorch_model.safetensors", "x");
  write_text(root / "vae" / "diffusion_pytorch_model.safetensors", "x");
  write_text(root / "text_encoder" / "config.json", "{}");
  write_text(root / "text_encoder" / "model.safetensors.index.json",
             R"({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})");
  write_text(root / "text_encoder" / "model-00001-of-00002.safetensors", "x");
  write_text(root / "text_encoder" / "model-00002-of-00002.safetensors", "x");
  write_text(root / "tokenizer" / "tokenizer.json", "{}");
  return root;
}

const char* kKleinIndex =
    R"({"_class_name": "Flux2KleinPipeline", "is_distilled": true, "transformer": ["diffusers", "Flux2Transformer2DModel"],
        "vae": ["diffusers", "AutoencoderKLFlux2"], "text_encoder": ["transformers", "Qwen3ForCausalLM"],
        "tokenizer": ["transformers", "Qwen2TokenizerFast"], "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"]})";

std::string message(const infill::Result<Flux2Folder>& r) { return r.ok() ? "(found)" : r.status().message(); }

}  // namespace

TEST_CASE("FLUX.2 folders of the bundled model: the infill codec and settings in model_index.json", "[flux2][folder]") {
  infill::test::TempDir dir;
  const auto index_with = [](const std::string& settings) {
    return R"({"_class_name": "Flux2KleinPipeline", "is_distilled": false,
               "transformer": ["diffusers", "Flux2Transformer2DModel"], "vae": ["infill", "LearnedDecoderCodec"],
               "text_encoder": ["transformers", "Qwen3Model"], "tokenizer": ["transformers", "Qwen2TokenizerFast"],
               "infill": {)" + settings + "}}";
  };
  const std::string index =
      index_with(R"("max_sequence_length": 32, "default_steps": 16, "default_guidance": 3.0, "description": "tiny")");
  const fs::path root = make_diffusers_folder(fs::path(dir.path()) / "infill-tiny-2", index);
  fs::remove(root / "vae" / "diffusion_pytorch_model.safetensors");

  // The codec file is named by the index, and checked.
  auto missing = infill::find_flux2_folder(root.string());
  REQUIRE_FALSE(missing.ok());
  CHECK_THAT(message(missing), Catch::Matchers::Contains("vae/codec.safetensors is missing"));

  write_text(root / "vae" / "codec.safetensors", "x");
  auto folder = infill::find_flux2_folder(root.string());
  REQUIRE(folder.ok());
  CHECK(folder->codec_class == "LearnedDecoderCodec");
  CHECK(folder->autoencoder_file == (root / "vae" / "codec.safetensors").string());
  CHECK_FALSE(folder->autoencoder_diffusers_names);
  CHECK(folder->max_sequence_length == 32);
  CHECK(folder->default_steps == 16);
  CHECK(folder->default_guidance == 3.0);
  CHECK(folder->description == "tiny");

  // Bad settings name the field and what was expected.
  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"("max_sequence_length": 0)", R"("infill".max_sequence_length is 0, expected an integer in 1..4096)"},
      {R"("default_steps": "many")", R"("infill".default_steps is "many", expected an integer in 1..1000)"},
      {R"("default_guidance": -1)", R"("infill".default_guidance is -1, expected a number in [0, 20])"}};
  for (const auto& [field, expected] : bad) {
    write_text(root / "model_index.json", index_with(field));
    auto refused = infill::find_flux2_folder(root.string());
    REQUIRE_FALSE(refused.ok());
    CHECK_THAT(message(refused), Catch::Matchers::Contains(expected));
  }
  std::string unknown = index;
  unknown.replace(unknown.find("LearnedDecoderCodec"), std::string("LearnedDecoderCodec").size(), "MagicCodec");
  write_text(root / "model_index.json", unknown);
  CHECK_THAT(message(infill::find_flux2_folder(root.string())), Catch::Matchers::Contains(R"(names codec "MagicCodec")"));
}

TEST_CASE("FLUX.2 diffusers folders are recognised and every file they need is checked", "[flux2][folder]") {
  infill::test::TempDir dir;
  const fs::path root = make_diffusers_folder(fs::path(dir.path()) / "FLUX.2-klein-4B", kKleinIndex);
  auto folder = infill::find_flux2_folder(root.string());
  REQUIRE(folder.ok());
  CHECK(folder->layout == Flux2Folder::Layout::kDiffusers);
  CHECK(folder->pipeline_class == "Flux2KleinPipeline");
  CHECK(folder->distilled);
  CHECK(folder->default_steps == 4);
  CHECK(folder->transformer_files == std::vector<std::string>{(root / "transformer" / "diffusion_pytorch_model.safetensors").string()});
  CHECK(folder->autoencoder_diffusers_names);
  CHECK(folder->text_encoder_dir == (root / "text_encoder").string());
  CHECK(folder->tokenizer_dir == (root / "tokenizer").string());

  SECTION("a base checkpoint (no is_distilled) runs 50 guided steps") {
    std::string base = kKleinIndex;
    base.replace(base.find("\"is_distilled\": true, "), 22, "");
    write_text(root / "model_index.json", base);
    auto b = infill::find_flux2_folder(root.string());
    REQUIRE(b.ok());
    CHECK_FALSE(b->distilled);
    CHECK(b->default_steps == 50);
    CHECK(b->default_guidance == 4.0);
  }
  SECTION("a missing tokenizer.json is named") {
    fs::remove(root / "tokenizer" / "tokenizer.json");
    auto r = infill::find_flux2_folder(root.string());
    CHECK_FALSE(r.ok());
    CHECK_THAT(message(r), Catch::Contains("tokenizer.json"));
  }
  SECTION("a shard listed in the text encoder's index but absent is named") {
    fs::remove(root / "text_encoder" / "model-00002-of-00002.safetensors");
    auto r = infill::find_flux2_folder(root.string());
    CHECK_FALSE(r.ok());
    CHECK_THAT(message(r), Catch::Contains("model-00002-of-00002.safetensors"));
  }
  SECTION("a missing transformer is named") {
    fs::remove(root / "transformer" / "diffusion_pytorch_model.safetensors");
    auto r = infill::find_flux2_folder(root.string());
    CHECK_FALSE(r.ok());
    CHECK_THAT(message(r), Catch::Contains("transformer/diffusion_pytorch_model.safetensors"));
  }
  SECTION("another pipeline is refused") {
    std::string other = kKleinIndex;
    other.replace(other.find("Flux2KleinPipeline"), 18, "StableDiffusionPipeline");
    write_text(root / "model_index.json", other);
    auto r = infill::find_flux2_folder(root.string());
    CHECK_FALSE(r.ok());
    CHECK_THAT(message(r), Catch::Contains("StableDiffusionPipeline"));
  }
  SECTION("malformed model_index.json is named") {
    write_text(root / "model_index.json", "{\"_class_name\": ");
    auto r = infill::find_flux2_folder(root.string());
    CHECK_FALSE(r.ok());
    CHECK_THAT(message(r), Catch::Contains("model_index.json"));
  }
}

TEST_CASE("FLUX.2 single-file folders: the transformer file and ae.safetensors", "[flux2][folder]") {
  infill::test::TempDir dir;
  const fs::path root = fs::path(dir.path()) / "comfy";
  fs::create_directories(root);
  const fs::path transformer = root / "flux-2-klein-4b.safetensors";
  REQUIRE(infill::Flux2Transformer::random(tiny(), 1, at::kBFloat16).save(transformer.string()).ok());
  write_text(root / "notes.txt", "not a model");

  auto missing_ae = infill::find_flux2_folder(root.string());
  CHECK_FALSE(missing_ae.ok());
  CHECK_THAT(message(missing_ae), Catch::Contains("ae.safetensors"));

  write_text(root / "ae.safetensors", "x");
  for (const fs::path& given : {root, transformer}) {
    auto folder = infill::find_flux2_folder(given.string());
    REQUIRE(folder.ok());
    CHECK(folder->layout == Flux2Folder::Layout::kSingleFile);
    CHECK(folder->transformer_files == std::vector<std::string>{transformer.string()});
    CHECK(folder->autoencoder_file == (root / "ae.safetensors").string());
    CHECK_FALSE(folder->autoencoder_diffusers_names);
    CHECK(folder->distilled);  // "klein" in the name, no "base"
    CHECK(folder->text_encoder_dir.empty());
    // The transformer it found loads.
    auto checkpoint = infill::Flux2Checkpoint::open(folder->transformer_files);
    REQUIRE(checkpoint.ok());
    auto cfg = infill::infer_flux2_config(*checkpoint);
    REQUIRE(cfg.ok());
    CHECK(cfg->hidden_size == 32);
  }

  const fs::path base = root / "flux-2-klein-base-4b.safetensors";
  fs::copy_file(transformer, base);
  auto two = infill::find_flux2_folder(root.string());
  CHECK_FALSE(two.ok());
  CHECK_THAT(message(two), Catch::Contains("give the one to load"));
  auto chosen = infill::find_flux2_folder(base.string());
  REQUIRE(chosen.ok());
  CHECK_FALSE(chosen->distilled);

  auto not_model = infill::find_flux2_folder((root / "notes.txt").string());
  CHECK_FALSE(not_model.ok());
  auto nothing = infill::find_flux2_folder((root / "absent").string());
  CHECK_FALSE(nothing.ok());
  CHECK_THAT(message(nothing), Catch::Contains("does not exist"));
}

TEST_CASE("A complete FLUX.2 single-file folder loads: transformer and autoencoder agree", "[flux2][folder][shared]") {
  // The reference autoencoder's weights, saved under their plain upstream names as in ae.safetensors.
  const std::string ae_reference = infill::test::shared_path("testdata/flux2/flux2_ae.safetensors");
  infill::test::require_shared_or_skip({ae_reference});
  auto reference = infill::SafetensorsFile::open(ae_reference);
  REQUIRE(reference.ok());
  std::vector<std::pair<std::string, at::Tensor>> ae_weights;
  for (const auto& t : reference->tensors()) {
    if (t.name.rfind("weights.", 0) == 0) ae_weights.emplace_back(t.name.substr(8), *infill::load_float_tensor(*reference, t.name));
  }
  infill::test::TempDir dir;
  const fs::path root = fs::path(dir.path()) / "FLUX.2-klein-custom";
  fs::create_directories(root);
  REQUIRE(infill::write_safetensors((root / "ae.safetensors").string(), ae_weights).ok());

  infill::Flux2Config cfg = tiny();
  cfg.in_channels = 128;  // the autoencoder's 4 x 32 latent channels
  REQUIRE(infill::Flux2Transformer::random(cfg, 2, at::kBFloat16).save((root / "transformer.safetensors").string()).ok());
  auto model = infill::load_flux2_model(root.string());
  REQUIRE(model.ok());
  CHECK((*model)->folder.layout == Flux2Folder::Layout::kSingleFile);
  CHECK((*model)->folder.distilled);  // "klein" in the folder's name
  CHECK((*model)->transformer.config().in_channels == 128);
  CHECK((*model)->autoencoder->latent_channels() == 128);
  CHECK((*model)->transformer_stored_dtypes == std::vector<std::string>{"BF16"});

  // A transformer whose input does not match the autoencoder's latent is refused, naming both.
  cfg.in_channels = 64;
  REQUIRE(infill::Flux2Transformer::random(cfg, 2, at::kBFloat16).save((root / "transformer.safetensors").string()).ok());
  auto mismatched = infill::load_flux2_model(root.string());
  CHECK_FALSE(mismatched.ok());
  CHECK_THAT(mismatched.status().message(), Catch::Contains("ae.safetensors") && Catch::Contains("transformer.safetensors"));
}
