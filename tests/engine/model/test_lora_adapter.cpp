#include "support/catch.h"
#include "support/shared_data.h"
#include "support/temp_dir.h"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <tuple>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>

#include "model/flux2_transformer.h"
#include "model/lora_adapter.h"
#include "model/reference_check.h"
#include "model/safetensors.h"
#include "model/safetensors_torch.h"

using infill::AdapterSet;
using infill::Flux2Config;
using infill::Flux2Segment;
using infill::Flux2Transformer;
using infill::LoraAdapter;
using infill::LoraFormat;

namespace {

const std::string kLoraDir = infill::test::shared_path("testdata/flux2_lora");

// The configuration of the LoRA reference files (hidden 128, 4 heads, 1 double + 2 single
// blocks, context 72), written out so that the bad-file cases run without ../shared.
Flux2Config reference_config() {
  Flux2Config c;
  c.in_channels = 128;
  c.context_dim = 72;
  c.hidden_size = 128;
  c.num_heads = 4;
  c.double_blocks = 1;
  c.single_blocks = 2;
  c.mlp_hidden = 384;
  c.axes_dim = {8, 8, 8, 8};
  return c;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

at::Tensor rnd(std::vector<int64_t> shape, double scale = 0.1) { return at::randn(shape) * scale; }

// The expected error: it names the file and `key`.
void check_refused(const std::string& path, const std::string& key, const std::string& what = "") {
  auto lora = infill::load_lora(path, reference_config(), "the test model");
  REQUIRE_FALSE(lora.ok());
  const std::string& m = lora.status().message();
  INFO(m);
  CHECK(m.find(path) != std::string::npos);
  CHECK(m.find(key) != std::string::npos);
  if (!what.empty()) CHECK(m.find(what) != std::string::npos);
}

std::string write(const infill::test::TempDir& dir, const std::string& name,
                  const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                  const std::map<std::string, std::string>& metadata = {}) {
  const std::string path = dir.file(name);
  REQUIRE(infill::write_safetensors(path, tensors, metadata).ok());
  return path;
}

// The reference file's base weights under their upstream names, float32.
std::map<std::string, at::Tensor> base_weights(const infill::SafetensorsFile& file) {
  std::map<std::string, at::Tensor> w;
  for (const auto& t : file.tensors()) {
    if (t.name.rfind("weights.", 0) == 0) w[t.name.substr(8)] = *infill::load_float_tensor(file, t.name);
  }
  return w;
}

// W += strength * scale * up @ down for every module of a LoRA file with upstream (after
// `prefix`) or kohya names, read with plain libtorch ops: the merged-weight reference.
void merge_into(std::map<std::string, at::Tensor>& w, const std::string& lora_path, double strength) {
  auto file = infill::SafetensorsFile::open(lora_path);
  REQUIRE(file.ok());
  // kohya's names are the module names with '_' for '.'.
  std::map<std::string, std::string> by_kohya;
  for (const auto& [name, _] : w) {
    std::string module = name.substr(0, name.size() - 7), k = module;
    std::replace(k.begin(), k.end(), '.', '_');
    by_kohya["lora_unet_" + k] = name;
  }
  for (const auto& t : file->tensors()) {
    std::string weight;
    at::Tensor down, up;
    double scale = 1.0;
    if (ends_with(t.name, ".lora_A.weight")) {
      const std::string stem = t.name.substr(0, t.name.size() - 14);
      weight = stem.substr(std::string("diffusion_model.").size()) + ".weight";
      down = *infill::load_float_tensor(*file, t.name);
      up = *infill::load_float_tensor(*file, stem + ".lora_B.weight");
    } else if (ends_with(t.name, ".lora_down.weight")) {
      const std::string stem = t.name.substr(0, t.name.size() - 17);
      weight = by_kohya.at(stem);
      down = *infill::load_float_tensor(*file, t.name);
      up = *infill::load_float_tensor(*file, stem + ".lora_up.weight");
      scale = infill::load_float_tensor(*file, stem + ".alpha")->item<double>() / static_cast<double>(down.size(0));
    } else {
      continue;
    }
    REQUIRE(w.count(weight) == 1);
    w[weight] = w[weight] + strength * scale * at::mm(up, down);
  }
}

Flux2Segment reference_segment(const infill::SafetensorsFile& file, double timestep) {
  Flux2Segment s;
  s.txt = *infill::load_float_tensor(file, "input.ctx");
  s.txt_ids = *infill::load_float_tensor(file, "input.ctx_ids");
  s.img = *infill::load_float_tensor(file, "input.x");
  s.img_ids = *infill::load_float_tensor(file, "input.x_ids");
  s.timestep = timestep;
  return s;
}

double rel_err(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / b.abs().max().item<double>();
}

}  // namespace

TEST_CASE("LoRA files of every published format load for the model they were trained for", "[lora][shared]") {
  struct Case {
    std::string file;
    LoraFormat format;
    int64_t rank;
    size_t layers;
  };
  const std::vector<Case> cases = {
      {"flux2_lora_aitoolkit.lora0_aitoolkit.safetensors", LoraFormat::kUpstream, 8, 8},
      {"flux2_lora_kohya.lora0_kohya.safetensors", LoraFormat::kKohya, 4, 12},
      // q, k and v of each stream stored apart are one fused update each: 12 layers, not 16.
      {"flux2_lora_diffusers.lora0_diffusers.safetensors", LoraFormat::kDiffusers, 8, 12},
  };
  for (const Case& c : cases) {
    const std::string path = kLoraDir + "/" + c.file;
    infill::test::require_shared_or_skip({path});
    auto lora = infill::load_lora(path, reference_config(), "the reference model");
    INFO(c.file);
    REQUIRE(lora.ok());
    CHECK((*lora)->format == c.format);
    CHECK((*lora)->layers.size() == c.layers);
    CHECK((*lora)->min_rank() == c.rank);
    CHECK((*lora)->id.size() == 64);
  }
  // The kohya file's scale (alpha 2 / rank 4) is in its update.
  const std::string kohya = kLoraDir + "/flux2_lora_kohya.lora0_kohya.safetensors";
  auto lora = infill::load_lora(kohya, reference_config(), "m");
  REQUIRE(lora.ok());
  auto file = infill::SafetensorsFile::open(kohya);
  REQUIRE(file.ok());
  const at::Tensor expected = 0.5 * at::mm(*infill::load_float_tensor(*file, "lora_unet_single_blocks_1_linear1.lora_up.weight"),
                                           *infill::load_float_tensor(*file, "lora_unet_single_blocks_1_linear1.lora_down.weight"));
  CHECK(rel_err((*lora)->delta("single_blocks.1.linear1.weight"), expected) < 1e-6);
  // A diffusers LoRA of to_k adapts the k rows of the fused qkv only.
  const std::string diffusers = kLoraDir + "/flux2_lora_diffusers.lora0_diffusers.safetensors";
  auto d = infill::load_lora(diffusers, reference_config(), "m");
  REQUIRE(d.ok());
  auto dfile = infill::SafetensorsFile::open(diffusers);
  const at::Tensor k_delta =
      2.0 * at::mm(*infill::load_float_tensor(*dfile, "transformer.transformer_blocks.0.attn.to_k.lora_B.weight"),
                   *infill::load_float_tensor(*dfile, "transformer.transformer_blocks.0.attn.to_k.lora_A.weight"));
  const at::Tensor fused = (*d)->delta("double_blocks.0.img_attn.qkv.weight");
  REQUIRE(fused.sizes() == at::IntArrayRef({384, 128}));
  CHECK(rel_err(fused.narrow(0, 128, 128), k_delta) < 1e-6);
  // The file's id is the hash of its bytes: the same file read twice has the same id.
  CHECK(infill::load_lora(diffusers, reference_config(), "m").value()->id == (*d)->id);
  CHECK((*d)->id != (*lora)->id);
}

TEST_CASE("the transformer with LoRAs reproduces the upstream forward with merged weights", "[lora][shared]") {
  for (const std::string name : {"aitoolkit", "kohya", "diffusers", "stack"}) {
    const std::string path = kLoraDir + "/flux2_lora_" + name + ".safetensors";
    infill::test::require_shared_or_skip({path});
    auto check = infill::run_reference_check(path);
    INFO(name);
    REQUIRE(check.ok());
    CHECK(check->loras == (name == "stack" ? 2u : 1u));
    CHECK(check->comparisons.size() == 5u);
    for (const auto& c : check->comparisons) {
      INFO(c.name << ": max_rel_err " << c.max_rel_err);
      CHECK(c.max_rel_err <= infill::kReferenceTolerance);
    }
    CHECK(check->ok);
  }
}

TEST_CASE("a packed step of segments with different adapter sets equals each segment run alone with merged weights",
          "[lora][shared]") {
  const std::string base_path = kLoraDir + "/flux2_lora_stack.safetensors";
  const std::string a_path = kLoraDir + "/flux2_lora_aitoolkit.lora0_aitoolkit.safetensors";
  const std::string b_path = kLoraDir + "/flux2_lora_stack.lora0_kohya.safetensors";
  infill::test::require_shared_or_skip({base_path, a_path, b_path});
  c10::InferenceMode guard;
  auto file = infill::SafetensorsFile::open(base_path);
  REQUIRE(file.ok());
  auto model = Flux2Transformer::load(*file, "weights.");
  REQUIRE(model.ok());
  auto a = infill::load_lora(a_path, model->config(), "m");
  auto b = infill::load_lora(b_path, model->config(), "m");
  REQUIRE(a.ok());
  REQUIRE(b.ok());

  // Three segments: no adapter; A at 0.9; A at -0.4 then B at 1.7 (each its own timestep).
  const std::vector<AdapterSet> sets = {{}, {{*a, 0.9}}, {{*a, -0.4}, {*b, 1.7}}};
  const std::vector<double> timesteps = {0.3, 0.61, 0.85};
  std::vector<Flux2Segment> packed;
  for (size_t i = 0; i < sets.size(); ++i) {
    packed.push_back(reference_segment(*file, timesteps[i]));
    packed.back().adapters = sets[i];
  }
  const at::Tensor before = model->forward(std::span<Flux2Segment>(packed.data(), 1));
  const at::Tensor out = model->forward(packed);
  const int64_t rows = packed[0].img.size(0);
  REQUIRE(out.size(0) == 3 * rows);

  // Merged weights, by plain libtorch ops on the files' tensors.
  const std::vector<std::vector<std::pair<std::string, double>>> merges = {
      {}, {{a_path, 0.9}}, {{a_path, -0.4}, {b_path, 1.7}}};
  infill::test::TempDir dir("infill-lora");
  for (size_t i = 0; i < merges.size(); ++i) {
    std::map<std::string, at::Tensor> w = base_weights(*file);
    for (const auto& [path, strength] : merges[i]) merge_into(w, path, strength);
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    for (auto& [n, t] : w) tensors.emplace_back("weights." + n, t);
    const std::string merged_path = dir.file("merged" + std::to_string(i) + ".safetensors");
    REQUIRE(infill::write_safetensors(merged_path, tensors).ok());
    auto merged_file = infill::SafetensorsFile::open(merged_path);
    auto merged = Flux2Transformer::load(*merged_file, "weights.");
    REQUIRE(merged.ok());
    Flux2Segment alone = reference_segment(*file, timesteps[i]);
    const at::Tensor expected = merged->forward(std::span<Flux2Segment>(&alone, 1));
    const double err = rel_err(out.narrow(0, i * rows, rows), expected);
    INFO("segment " << i << ": max |diff| / max |merged| = " << err);
    CHECK(err <= 1e-5);
    if (i > 0) CHECK(rel_err(expected, before) > 1e-3);  // the adapters change the output
  }
  // Base weights were never changed: the segment without adapters, alone again, is exact.
  Flux2Segment again = reference_segment(*file, timesteps[0]);
  CHECK(at::equal(model->forward(std::span<Flux2Segment>(&again, 1)), before));
}

TEST_CASE("bad LoRA files are refused naming the file and the key", "[lora]") {
  c10::InferenceMode guard;
  infill::test::TempDir dir("infill-lora");
  const std::string qkv = "diffusion_model.double_blocks.0.img_attn.qkv";
  auto good = [&] {
    return std::vector<std::pair<std::string, at::Tensor>>{{qkv + ".lora_A.weight", rnd({4, 128})},
                                                           {qkv + ".lora_B.weight", rnd({384, 4})}};
  };
  // A well-formed file loads (the cases below each break one thing of it).
  const std::string ok_path = write(dir, "ok.safetensors", good());
  auto ok = infill::load_lora(ok_path, reference_config(), "m");
  REQUIRE(ok.ok());
  CHECK(ok.value()->layers.size() == 1);

  auto with = [&](const std::string& name, std::vector<std::pair<std::string, at::Tensor>> extra) {
    auto t = good();
    t.insert(t.end(), extra.begin(), extra.end());
    return write(dir, name, t);
  };
  SECTION("an unknown key") {
    check_refused(with("unknown.safetensors", {{"diffusion_model.foo.lora_A.weight", rnd({4, 128})},
                                               {"diffusion_model.foo.lora_B.weight", rnd({128, 4})}}),
                  "diffusion_model.foo.lora_A.weight", "no linear layer");
    check_refused(with("stray.safetensors", {{"some_other_tensor", rnd({3})}}), "some_other_tensor");
  }
  SECTION("a layer the model lacks (a LoRA for a deeper model)") {
    check_refused(write(dir, "deep.safetensors", {{"lora_unet_double_blocks_4_img_attn_qkv.lora_down.weight", rnd({4, 128})},
                                                  {"lora_unet_double_blocks_4_img_attn_qkv.lora_up.weight", rnd({384, 4})}}),
                  "lora_unet_double_blocks_4_img_attn_qkv", "does not have");
    check_refused(write(dir, "deep2.safetensors",
                        {{"diffusion_model.single_blocks.7.linear1.lora_A.weight", rnd({4, 128})},
                         {"diffusion_model.single_blocks.7.linear1.lora_B.weight", rnd({1152, 4})}}),
                  "single_blocks.7.linear1", "does not have");
  }
  SECTION("shapes of another model size") {
    check_refused(write(dir, "wide.safetensors", {{qkv + ".lora_A.weight", rnd({4, 256})},
                                                  {qkv + ".lora_B.weight", rnd({768, 4})}}),
                  qkv + ".lora_A.weight", "expected [rank, 128]");
    check_refused(write(dir, "rank.safetensors", {{qkv + ".lora_A.weight", rnd({4, 128})},
                                                  {qkv + ".lora_B.weight", rnd({384, 8})}}),
                  qkv + ".lora_B.weight", "expected [384, 4]");
  }
  SECTION("NaN and infinite values") {
    at::Tensor up = rnd({384, 4});
    up[3][1] = std::numeric_limits<float>::quiet_NaN();
    check_refused(write(dir, "nan.safetensors", {{qkv + ".lora_A.weight", rnd({4, 128})}, {qkv + ".lora_B.weight", up}}),
                  qkv + ".lora_B.weight", "non-finite");
    at::Tensor down = rnd({4, 128});
    down[0][0] = std::numeric_limits<float>::infinity();
    check_refused(write(dir, "inf.safetensors", {{qkv + ".lora_A.weight", down}, {qkv + ".lora_B.weight", rnd({384, 4})}}),
                  qkv + ".lora_A.weight", "non-finite");
  }
  SECTION("LoKr, LoHa and DoRA") {
    check_refused(with("lokr.safetensors", {{"lora_unet_single_blocks_0_linear1.lokr_w1", rnd({4, 4})}}),
                  "lokr_w1", "LoKr");
    check_refused(with("loha.safetensors", {{"lora_unet_single_blocks_0_linear1.hada_w1_a", rnd({4, 4})}}),
                  "hada_w1_a", "LoHa");
    check_refused(with("dora.safetensors", {{qkv + ".dora_scale", rnd({1, 384})}}), "dora_scale", "DoRA");
  }
  SECTION("text-encoder keys are never dropped silently") {
    check_refused(with("te.safetensors", {{"lora_te1_text_model_encoder_layers_0_mlp_fc1.lora_down.weight", rnd({4, 8})}}),
                  "lora_te1_text_model_encoder_layers_0_mlp_fc1", "text encoder");
    check_refused(with("te2.safetensors", {{"text_encoder.layers.0.q_proj.lora_A.weight", rnd({4, 8})}}),
                  "text_encoder.layers.0.q_proj", "text encoder");
  }
  SECTION("a module without its up weight, and a mix of formats") {
    check_refused(write(dir, "half.safetensors", {{qkv + ".lora_A.weight", rnd({4, 128})}}), qkv + ".lora_A.weight",
                  "no up");
    check_refused(with("mixed.safetensors", {{"lora_unet_single_blocks_0_linear2.lora_down.weight", rnd({4, 512})},
                                             {"lora_unet_single_blocks_0_linear2.lora_up.weight", rnd({128, 4})}}),
                  "lora_unet_single_blocks_0_linear2", "one format");
  }
  SECTION("a truncated file") {
    const std::string cut = dir.file("cut.safetensors");
    std::filesystem::copy_file(ok_path, cut);
    std::filesystem::resize_file(cut, std::filesystem::file_size(cut) - 100);
    auto lora = infill::load_lora(cut, reference_config(), "m");
    REQUIRE_FALSE(lora.ok());
    CHECK(lora.status().message().find(cut) != std::string::npos);
  }
  SECTION("an empty file of no LoRA weights") {
    auto lora = infill::load_lora(write(dir, "none.safetensors", {}), reference_config(), "m");
    REQUIRE_FALSE(lora.ok());
    CHECK(lora.status().message().find("no LoRA weights") != std::string::npos);
  }
}

TEST_CASE("PEFT's scale rules: lora_alpha / r, patterns per module, rsLoRA", "[lora]") {
  c10::InferenceMode guard;
  infill::test::TempDir dir("infill-lora");
  const std::string proj = "transformer.transformer_blocks.0.attn.to_out.0";
  const std::string mlp = "transformer.transformer_blocks.0.ff.linear_out";
  const at::Tensor a1 = rnd({4, 128}), b1 = rnd({128, 4}), a2 = rnd({4, 384}), b2 = rnd({128, 4});
  const std::vector<std::pair<std::string, at::Tensor>> tensors = {
      {proj + ".lora_A.weight", a1}, {proj + ".lora_B.weight", b1}, {mlp + ".lora_A.weight", a2}, {mlp + ".lora_B.weight", b2}};
  auto scale_of = [&](const std::string& metadata) {
    const std::string path = write(dir, "peft.safetensors", tensors, {{"lora_adapter_metadata", metadata}});
    auto lora = infill::load_lora(path, reference_config(), "m");
    REQUIRE(lora.ok());
    return std::pair{(*lora)->delta("double_blocks.0.img_attn.proj.weight").sum().item<double>() /
                         at::mm(b1, a1).sum().item<double>(),
                     (*lora)->delta("double_blocks.0.img_mlp.2.weight").sum().item<double>() /
                         at::mm(b2, a2).sum().item<double>()};
  };
  auto [p, m] = scale_of(R"({"r": 4, "lora_alpha": 8})");
  CHECK(p == Approx(2.0));
  CHECK(m == Approx(2.0));
  std::tie(p, m) = scale_of(R"({"r": 4, "lora_alpha": 8, "alpha_pattern": {"ff.linear_out": 2}})");
  CHECK(p == Approx(2.0));
  CHECK(m == Approx(0.5));
  std::tie(p, m) = scale_of(R"({"r": 4, "lora_alpha": 8, "use_rslora": true})");
  CHECK(p == Approx(4.0));
  // Without metadata the scale is 1.
  auto plain = infill::load_lora(write(dir, "plain.safetensors", tensors), reference_config(), "m");
  REQUIRE(plain.ok());
  CHECK(rel_err((*plain)->delta("double_blocks.0.img_attn.proj.weight"), at::mm(b1, a1)) < 1e-6);
}

TEST_CASE("An adapter set's key names each of its adapters and no other", "[lora]") {
  const std::string a(64, 'a'), b = std::string(63, 'a') + "b", ab = a + "b";
  const std::string key = infill::adapter_set_key({{a, 0.5}, {b, 1e9}});
  CHECK(key.find("e+09") != std::string::npos);  // a strength with its own '+'
  CHECK(infill::adapter_set_key_holds(key, a));
  CHECK(infill::adapter_set_key_holds(key, b));
  CHECK_FALSE(infill::adapter_set_key_holds(key, a.substr(1)));  // a suffix of an id
  CHECK_FALSE(infill::adapter_set_key_holds(key, a.substr(0, 63)));  // a prefix
  CHECK_FALSE(infill::adapter_set_key_holds(infill::adapter_set_key({{ab, 1.0}}), a));
  CHECK_FALSE(infill::adapter_set_key_holds("", a));
  CHECK_FALSE(infill::adapter_set_key_holds(key, ""));
}

TEST_CASE("LoRA updates equal what diffusers' own key conversion implies", "[diffusers]") {
  // The deltas written by diffusers' _convert_kohya_flux2_lora_to_diffusers and
  // _convert_non_diffusers_flux2_lora_to_diffusers (run unmodified beside the project; see
  // docs/architecture.md, "Adapters"), mapped back to upstream names: a folder named by
  // INFILL_DIFFUSERS_LORA_DELTAS, else this test is skipped.
  const char* deltas = std::getenv("INFILL_DIFFUSERS_LORA_DELTAS");
  if (deltas == nullptr || !std::filesystem::is_directory(deltas)) {
    std::fprintf(stderr, "SKIPPED: INFILL_DIFFUSERS_LORA_DELTAS names no folder of diffusers' deltas\n");
    std::exit(4);
  }
  c10::InferenceMode guard;
  size_t compared = 0;
  for (const auto& entry : std::filesystem::directory_iterator(deltas)) {
    const std::string stem = entry.path().stem().string();
    const std::string lora_path = entry.path().parent_path().parent_path().string() + "/synthetic/" + stem + ".safetensors";
    const std::string shared_lora = kLoraDir + "/" + stem + ".safetensors";
    const std::string path = std::filesystem::exists(shared_lora) ? shared_lora : lora_path;
    if (!std::filesystem::exists(path)) continue;
    auto lora = infill::load_lora(path, reference_config(), "m");
    INFO(stem);
    REQUIRE(lora.ok());
    auto ref = infill::SafetensorsFile::open(entry.path().string());
    REQUIRE(ref.ok());
    for (const auto& t : ref->tensors()) {
      const at::Tensor expected = *infill::load_float_tensor(*ref, t.name);
      const at::Tensor ours = (*lora)->delta(t.name);
      INFO(t.name);
      REQUIRE(ours.defined());
      const double err = rel_err(ours, expected);
      if (t.name == "final_layer.adaLN_modulation.1.weight" && (*lora)->format != LoraFormat::kDiffusers) {
        // diffusers' FLUX.2 converter renames upstream's (shift, scale) rows to norm_out.linear
        // without swapping them to its (scale, shift) order, as its checkpoint converter does:
        // the engine follows upstream, so its update is diffusers' with the halves swapped.
        const auto halves = expected.chunk(2, 0);
        CHECK(rel_err(ours, at::cat({halves[1], halves[0]})) < 1e-6);
        WARN(stem << ": diffusers swaps the final modulation's halves of an upstream-named LoRA; the engine does not");
      } else {
        CHECK(err < 1e-6);
      }
      ++compared;
    }
  }
  CHECK(compared > 0);
  WARN("compared " << compared << " layer updates with diffusers'");
}
