#include "support/catch.h"
#include "support/shared_data.h"
#include "support/temp_dir.h"
#include "support/flux2_requests.h"
#include "support/flux2_to_diffusers.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "model/flux2_checkpoint.h"
#include "model/flux2_transformer.h"
#include "model/reference_check.h"
#include "model/safetensors.h"
#include "model/safetensors_torch.h"

namespace fs = std::filesystem;
using infill::Flux2Config;
using infill::Flux2Segment;
using infill::Flux2Transformer;

using namespace infill::test;

namespace {

const std::string kFlux2Dir = infill::test::shared_path("testdata/flux2");

void require_or_skip(const std::string& path) { infill::test::require_shared_or_skip({path}); }

/// The inputs recorded in a reference file (text, image and reference tokens with their ids).
Request reference_request(const infill::SafetensorsFile& file) {
  Request r;
  r.txt = *infill::load_float_tensor(file, "input.ctx");
  r.txt_ids = *infill::load_float_tensor(file, "input.ctx_ids");
  r.img = *infill::load_float_tensor(file, "input.x");
  r.img_ids = *infill::load_float_tensor(file, "input.x_ids");
  return r;
}

}  // namespace

TEST_CASE("FLUX.2 transformer reproduces the upstream reference tensors block by block", "[flux2][shared]") {
  for (const std::string name : {"flux2_dit_klein", "flux2_dit_dev"}) {
    const std::string path = kFlux2Dir + "/" + name + ".safetensors";
    require_or_skip(path);
    auto check = infill::run_reference_check(path);
    REQUIRE(check.ok());
    CHECK(check->model == "flux2-transformer");
    // output + per double block img/txt + per single block: 1 + 2*1 + 2 (klein), 1 + 2*2 + 3 (dev)
    CHECK(check->comparisons.size() == (name == "flux2_dit_klein" ? 5u : 8u));
    for (const auto& c : check->comparisons) {
      INFO(name << " " << c.name << ": max_abs_err " << c.max_abs_err << ", max_rel_err " << c.max_rel_err);
      CHECK(c.max_rel_err <= infill::kReferenceTolerance);
    }
    CHECK(check->ok);
    WARN(name << ": max_rel_err " << check->max_rel_err << " (tolerance " << infill::kReferenceTolerance << ")");
  }
}

TEST_CASE("FLUX.2 configuration is inferred from the weight shapes", "[flux2][shared]") {
  const std::string dev = kFlux2Dir + "/flux2_dit_dev.safetensors";
  require_or_skip(dev);
  auto file = infill::SafetensorsFile::open(dev);
  REQUIRE(file.ok());
  auto prefix = infill::find_flux2_transformer_prefix(*file);
  REQUIRE(prefix.ok());
  CHECK(*prefix == "weights.");
  auto cfg = infill::infer_flux2_config(*file, *prefix);
  REQUIRE(cfg.ok());
  CHECK(cfg->hidden_size == 128);
  CHECK(cfg->num_heads == 4);
  CHECK(cfg->double_blocks == 2);
  CHECK(cfg->single_blocks == 3);
  CHECK(cfg->context_dim == 96);
  CHECK(cfg->mlp_hidden == 384);
  CHECK(cfg->guidance_embed);
  CHECK(cfg->axes_dim == std::vector<int>{8, 8, 8, 8});
  CHECK(cfg->family_size() == "custom");

  auto klein = infill::SafetensorsFile::open(kFlux2Dir + "/flux2_dit_klein.safetensors");
  REQUIRE(klein.ok());
  auto klein_cfg = infill::infer_flux2_config(*klein, "weights.");
  REQUIRE(klein_cfg.ok());
  CHECK_FALSE(klein_cfg->guidance_embed);
  CHECK(klein_cfg->double_blocks == 1);
  CHECK(klein_cfg->single_blocks == 2);
  CHECK(klein_cfg->context_dim == 72);
}

TEST_CASE("FLUX.2 mask-aware forward on the reference weights: cached rows give the full forward's rows",
          "[flux2][shared]") {
  const std::string path = kFlux2Dir + "/flux2_dit_dev.safetensors";
  require_or_skip(path);
  auto file = infill::SafetensorsFile::open(path);
  REQUIRE(file.ok());
  auto model = Flux2Transformer::load(*file, "weights.");
  REQUIRE(model.ok());
  c10::InferenceMode guard;
  const Request r = reference_request(*file);
  const double t = 0.73, g = 4.0;

  MemoryKv kv(/*slabs=*/true);
  Flux2Segment prepare = full_segment(r, t, g);
  prepare.sink = &kv;
  const at::Tensor full = forward_one(*model, prepare);
  CHECK(kv.blocks() == 5u);
  // Prompt-keyed: image rows 3, 4, 10, 11 only (text and reference from the cache).
  const at::Tensor rows = at::tensor(std::vector<int64_t>{3, 4, 10, 11});
  const at::Tensor masked = forward_one(*model, masked_segment(r, at::empty({0}, at::kLong), rows, t, &kv, g));
  const double err = rel_err(masked, full.index_select(0, rows));
  INFO("prompt-keyed rows vs full forward: max rel err " << err);
  // The cache holds fp16: each cached K/V value is rounded to 2^-11 relative.
  CHECK(err <= 2e-3);
}

TEST_CASE("FLUX.2 mask-aware forward equals the full forward (random weights)", "[flux2]") {
  const Flux2Config cfg = small_config();
  const Flux2Transformer model = Flux2Transformer::random(cfg, 7, at::kFloat);
  c10::InferenceMode guard;
  const Request r = make_request(cfg, 6, 4, 5, /*reference=*/true, 3);
  const double t = 0.6;
  const at::Tensor all_txt = at::arange(6, at::kLong), all_img = at::arange(40, at::kLong);

  for (const bool slabs : {true, false}) {
    MemoryKv kv(slabs);
    Flux2Segment prepare = full_segment(r, t);
    prepare.sink = &kv;
    const at::Tensor full = forward_one(model, prepare);
    REQUIRE(full.sizes() == at::IntArrayRef({40, cfg.in_channels}));
    CHECK(kv.blocks() == static_cast<size_t>(cfg.depth()));

    SECTION(std::string("every token computed, with a cache present, is the full forward; slabs ") +
            (slabs ? "on" : "off")) {
      const at::Tensor out = forward_one(model, masked_segment(r, all_txt, all_img, t, &kv));
      CHECK(at::equal(out, full));
    }
    SECTION(std::string("prompt-keyed: masked image rows only; slabs ") + (slabs ? "on" : "off")) {
      const at::Tensor rows = at::tensor(std::vector<int64_t>{0, 1, 6, 7, 19});
      const at::Tensor out = forward_one(model, masked_segment(r, at::empty({0}, at::kLong), rows, t, &kv));
      const double err = rel_err(out, full.index_select(0, rows));
      INFO("max rel err " << err);
      CHECK(err <= 2e-3);
      // A different image input in those rows changes the output: the rows are really computed.
      Request changed = r;
      changed.img = r.img.clone();
      changed.img.index_fill_(0, rows, 0.5);
      const at::Tensor other = forward_one(model, masked_segment(changed, at::empty({0}, at::kLong), rows, t, &kv));
      CHECK(rel_err(other, full.index_select(0, rows)) > 1e-2);
    }
    SECTION(std::string("template-keyed: text and masked image rows; slabs ") + (slabs ? "on" : "off")) {
      const at::Tensor rows = at::tensor(std::vector<int64_t>{5, 12, 13});
      const at::Tensor out = forward_one(model, masked_segment(r, all_txt, rows, t, &kv));
      const double err = rel_err(out, full.index_select(0, rows));
      INFO("max rel err " << err);
      CHECK(err <= 2e-3);
    }
  }
}

namespace {

// Passes reads through to `inner`, noting which blocks were asked for.
class BlockLog final : public infill::KvSource {
 public:
  explicit BlockLog(infill::KvSource* inner) : inner_(inner) {}
  void fetch(int block, at::Tensor& k, at::Tensor& v) override {
    note(block);
    inner_->fetch(block, k, v);
  }
  bool fp16_slabs(int block, const uint16_t** k, const uint16_t** v) override {
    note(block);
    return inner_->fp16_slabs(block, k, v);
  }
  std::vector<int> blocks;

 private:
  void note(int block) {
    if (blocks.empty() || blocks.back() != block) blocks.push_back(block);
  }
  infill::KvSource* inner_;
};

// A segment with the whole sequence through the first `full_blocks`, then text rows `txt_rows`
// and image rows `img_rows` (indices as in masked_segment) reading the rest from `kv`.
Flux2Segment prefix_segment(const Request& r, int full_blocks, const at::Tensor& txt_rows, const at::Tensor& img_rows,
                            double t, infill::KvSource* kv) {
  Flux2Segment s = full_segment(r, t);
  s.kv = kv;
  s.full_blocks = full_blocks;
  s.keep_positions = at::cat({txt_rows, img_rows + r.txt.size(0)});
  return s;
}

}  // namespace

TEST_CASE("FLUX.2 recomputed prefix: every token through the first blocks and the kept rows after them", "[flux2]") {
  const Flux2Config cfg = small_config();  // 2 double + 2 single blocks
  const Flux2Transformer model = Flux2Transformer::random(cfg, 13, at::kFloat);
  c10::InferenceMode guard;
  const Request r = make_request(cfg, 6, 4, 5, /*reference=*/true, 4);
  const double t = 0.55;
  MemoryKv kv(/*slabs=*/true);
  Flux2Segment prepare = full_segment(r, t);
  prepare.sink = &kv;
  const at::Tensor full = forward_one(model, prepare);
  const at::Tensor all_txt = at::arange(6, at::kLong), none = at::empty({0}, at::kLong);
  const at::Tensor rows = at::tensor(std::vector<int64_t>{2, 9, 10, 23});

  for (int k = 1; k <= cfg.depth(); ++k) {
    for (const bool text : {true, false}) {
      INFO("recomputed blocks " << k << (text ? ", text kept" : ", image rows only"));
      BlockLog log(&kv);
      const at::Tensor out = forward_one(model, prefix_segment(r, k, text ? all_txt : none, rows, t, &log));
      REQUIRE(out.sizes() == at::IntArrayRef({rows.size(0), cfg.in_channels}));
      // Same inputs as the recorded forward: the kept rows are the full forward's, up to the
      // fp16 rounding of the K/V read after the prefix (none read when every block recomputes).
      const double err = rel_err(out, full.index_select(0, rows));
      CHECK(err <= (k == cfg.depth() ? 1e-5 : 2e-3));
      // The prefix never reads the cache; every block after it does, once per block.
      std::vector<int> expected;
      for (int b = k; b < cfg.depth(); ++b) expected.push_back(b);
      CHECK(log.blocks == expected);
    }
  }

  SECTION("the prefix computes the unmasked tokens afresh: a changed unmasked input changes the kept rows") {
    Request changed = r;
    changed.img = r.img.clone();
    changed.img.narrow(0, 24, 16).mul_(-4.0);  // reference rows, none of them kept
    const at::Tensor cached_only = forward_one(model, masked_segment(changed, all_txt, rows, t, &kv));
    const at::Tensor prefixed = forward_one(model, prefix_segment(changed, 2, all_txt, rows, t, &kv));
    // Read from the cache, the changed rows count for nothing; recomputed through two blocks they do.
    const double cached_err = rel_err(cached_only, full.index_select(0, rows));
    const double prefixed_err = rel_err(prefixed, full.index_select(0, rows));
    INFO("cached only " << cached_err << ", two blocks recomputed " << prefixed_err);
    CHECK(cached_err <= 2e-3);
    CHECK(prefixed_err > 5 * cached_err);
  }
  SECTION("packed with other segments, each gets what it gets alone") {
    const Request other = make_request(cfg, 3, 3, 3, true, 8);
    std::vector<Flux2Segment> segs{prefix_segment(r, 1, all_txt, rows, t, &kv), full_segment(other, 0.2),
                                   prefix_segment(r, 3, none, rows, t, &kv), masked_segment(r, all_txt, rows, t, &kv)};
    const at::Tensor packed = model.forward(segs);
    const at::Tensor a = forward_one(model, prefix_segment(r, 1, all_txt, rows, t, &kv));
    const at::Tensor b = forward_one(model, full_segment(other, 0.2));
    const at::Tensor c = forward_one(model, prefix_segment(r, 3, none, rows, t, &kv));
    const at::Tensor d = forward_one(model, masked_segment(r, all_txt, rows, t, &kv));
    REQUIRE(packed.size(0) == 4 + 18 + 4 + 4);
    CHECK(at::allclose(packed.narrow(0, 0, 4), a, 1e-5, 1e-5));
    CHECK(at::allclose(packed.narrow(0, 4, 18), b, 1e-5, 1e-5));
    CHECK(at::allclose(packed.narrow(0, 22, 4), c, 1e-5, 1e-5));
    CHECK(at::allclose(packed.narrow(0, 26, 4), d, 1e-5, 1e-5));
  }
  SECTION("bad prefixes are refused, naming what is wrong") {
    auto refused = [&](Flux2Segment s) {
      try {
        forward_one(model, s);
      } catch (const c10::Error& e) {
        return std::string(e.what_without_backtrace());
      }
      return std::string();
    };
    CHECK_THAT(refused(prefix_segment(r, cfg.depth() + 1, all_txt, rows, t, &kv)), Catch::Contains("full_blocks is 5"));
    Flux2Segment no_source = prefix_segment(r, 2, all_txt, rows, t, nullptr);
    CHECK_THAT(refused(no_source), Catch::Contains("needs a KvSource"));
    Flux2Segment unordered = prefix_segment(r, 2, all_txt, rows, t, &kv);
    unordered.keep_positions = at::tensor(std::vector<int64_t>{9, 8});
    CHECK_THAT(refused(unordered), Catch::Contains("must ascend"));
    Flux2Segment text_only = prefix_segment(r, 2, all_txt, none, t, &kv);
    CHECK_THAT(refused(text_only), Catch::Contains("keeps no image row"));
    Flux2Segment partial = masked_segment(r, all_txt, rows, t, &kv);
    partial.full_blocks = 1;
    partial.keep_positions = at::arange(6, 8, at::kLong);
    CHECK_THAT(refused(partial), Catch::Contains("whole sequence"));
  }
}

TEST_CASE("FLUX.2 packed segments give each request the output it gets alone", "[flux2]") {
  Flux2Config cfg = small_config();
  cfg.guidance_embed = true;
  const Flux2Transformer model = Flux2Transformer::random(cfg, 11, at::kFloat);
  c10::InferenceMode guard;
  const Request a = make_request(cfg, 5, 3, 4, true, 1);
  const Request b = make_request(cfg, 0, 4, 4, false, 2);
  const Request c = make_request(cfg, 7, 2, 3, true, 3);
  MemoryKv kv_c(true);
  Flux2Segment prep_c = full_segment(c, 0.3, 2.0);
  prep_c.sink = &kv_c;
  forward_one(model, prep_c);

  const at::Tensor rows_c = at::tensor(std::vector<int64_t>{1, 2, 8});
  std::vector<Flux2Segment> segs{full_segment(a, 0.9, 4.0), full_segment(b, 0.1, 1.0),
                                 masked_segment(c, at::empty({0}, at::kLong), rows_c, 0.3, &kv_c, 2.0)};
  const at::Tensor packed = model.forward(segs);
  const at::Tensor alone_a = forward_one(model, full_segment(a, 0.9, 4.0));
  const at::Tensor alone_b = forward_one(model, full_segment(b, 0.1, 1.0));
  const at::Tensor alone_c = forward_one(model, masked_segment(c, at::empty({0}, at::kLong), rows_c, 0.3, &kv_c, 2.0));
  REQUIRE(packed.size(0) == alone_a.size(0) + alone_b.size(0) + alone_c.size(0));
  // Batched GEMMs may sum in another order than single ones: equal to float rounding.
  CHECK(at::allclose(packed.narrow(0, 0, 24), alone_a, 1e-5, 1e-5));
  CHECK(at::allclose(packed.narrow(0, 24, 16), alone_b, 1e-5, 1e-5));
  CHECK(at::allclose(packed.narrow(0, 40, 3), alone_c, 1e-5, 1e-5));
  // Timestep and guidance matter: another guidance gives another output.
  CHECK_FALSE(at::allclose(forward_one(model, full_segment(b, 0.1, 3.0)), alone_b, 1e-3, 1e-3));
}

TEST_CASE("FLUX.2 weights keep their stored dtype and round-trip through a file", "[flux2]") {
  infill::test::TempDir dir;
  const Flux2Config cfg = small_config();
  const Flux2Transformer model = Flux2Transformer::random(cfg, 5, at::kBFloat16);
  CHECK(model.weight_bytes() > 0);
  const std::string path = dir.path() + "/flux2.safetensors";
  REQUIRE(model.save(path, "model.diffusion_model.").ok());
  auto file = infill::SafetensorsFile::open(path);
  REQUIRE(file.ok());
  for (const auto& t : file->tensors()) CHECK(t.dtype == infill::DType::kBF16);
  auto prefix = infill::find_flux2_transformer_prefix(*file);
  REQUIRE(prefix.ok());
  CHECK(*prefix == "model.diffusion_model.");
  auto loaded = Flux2Transformer::load(*file, *prefix);
  REQUIRE(loaded.ok());
  CHECK(loaded->weight_bytes() == model.weight_bytes());
  // bf16 weights hold half the bytes of float32 ones.
  CHECK(Flux2Transformer::random(cfg, 5, at::kFloat).weight_bytes() == 2 * model.weight_bytes());
  c10::InferenceMode guard;
  const Request r = make_request(cfg, 4, 3, 3, false, 9);
  CHECK(at::equal(forward_one(model, full_segment(r, 0.5)), forward_one(*loaded, full_segment(r, 0.5))));
}

TEST_CASE("FLUX.2 mask-conditioned transformers: mask channels inferred from img_in and final_layer", "[flux2]") {
  infill::test::TempDir dir;
  Flux2Config cfg = small_config();
  cfg.mask_channels = 4;
  const std::string path = dir.path() + "/masked.safetensors";
  REQUIRE(Flux2Transformer::random(cfg, 5, at::kFloat).save(path).ok());
  auto file = infill::SafetensorsFile::open(path);
  REQUIRE(file.ok());
  auto inferred = infill::infer_flux2_config(*file, "");
  REQUIRE(inferred.ok());
  CHECK(inferred->in_channels == cfg.in_channels);
  CHECK(inferred->mask_channels == 4);
  CHECK(inferred->input_channels() == cfg.in_channels + 4);
  CHECK(inferred->family_size() == "custom");
  // Not a square number of cells: refused, naming the widths.
  cfg.mask_channels = 3;
  const infill::Status bad = cfg.validate();
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.message(), Catch::Matchers::Contains("mask_channels is 3"));
  CHECK_THAT(bad.message(), Catch::Matchers::Contains("final_layer.linear"));
}

TEST_CASE("FLUX.2 bad checkpoints are refused naming the tensor", "[flux2]") {
  infill::test::TempDir dir;
  const Flux2Config cfg = small_config();
  const std::string good = dir.path() + "/good.safetensors";
  REQUIRE(Flux2Transformer::random(cfg, 5, at::kFloat).save(good).ok());
  auto good_file = infill::SafetensorsFile::open(good);
  REQUIRE(good_file.ok());
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& t : good_file->tensors()) tensors.emplace_back(t.name, *infill::load_float_tensor(*good_file, t.name));

  auto write_variant = [&](const std::string& name, auto edit) {
    auto copy = tensors;
    edit(copy);
    const std::string path = dir.path() + "/" + name + ".safetensors";
    REQUIRE(infill::write_safetensors(path, copy).ok());
    auto file = infill::SafetensorsFile::open(path);
    REQUIRE(file.ok());
    return Flux2Transformer::load(*file, "");
  };
  auto message = [](const auto& result) { return result.ok() ? std::string("(loaded)") : result.status().message(); };

  auto missing = write_variant("missing", [](auto& t) {
    std::erase_if(t, [](const auto& p) { return p.first == "single_blocks.1.norm.key_norm.scale"; });
  });
  CHECK_FALSE(missing.ok());
  CHECK_THAT(message(missing), Catch::Contains("single_blocks.1.norm.key_norm.scale"));

  auto wrong_shape = write_variant("shape", [](auto& t) {
    for (auto& p : t) {
      if (p.first == "double_blocks.1.txt_mlp.2.weight") p.second = at::zeros({64, 191});
    }
  });
  CHECK_FALSE(wrong_shape.ok());
  CHECK_THAT(message(wrong_shape), Catch::Contains("double_blocks.1.txt_mlp.2.weight"));

  auto nan = write_variant("nan", [](auto& t) {
    for (auto& p : t) {
      if (p.first != "double_blocks.0.img_attn.proj.weight") continue;
      p.second = p.second.clone();  // the variants share the good file's tensors
      p.second[3][5] = std::nan("");
    }
  });
  CHECK_FALSE(nan.ok());
  CHECK_THAT(message(nan), Catch::Contains("double_blocks.0.img_attn.proj.weight"));

  auto extra = write_variant("extra", [](auto& t) { t.emplace_back("double_blocks.0.img_attn.bias", at::zeros({3})); });
  CHECK_FALSE(extra.ok());
  CHECK_THAT(message(extra), Catch::Contains("double_blocks.0.img_attn.bias"));

  auto unknown = write_variant("unknown", [](auto& t) {
    std::erase_if(t, [](const auto& p) { return p.first.rfind("img_in", 0) == 0; });
  });
  CHECK_FALSE(unknown.ok());
  {
    auto file = infill::SafetensorsFile::open(dir.path() + "/unknown.safetensors");
    REQUIRE(file.ok());
    auto prefix = infill::find_flux2_transformer_prefix(*file);
    CHECK_FALSE(prefix.ok());
    CHECK_THAT(prefix.status().message(), Catch::Contains("not a FLUX.2 transformer"));
  }

  // Truncated: the reader refuses the file before any tensor is used.
  const std::string truncated = dir.path() + "/truncated.safetensors";
  fs::copy_file(good, truncated);
  fs::resize_file(truncated, fs::file_size(good) - 100);
  auto file = infill::SafetensorsFile::open(truncated);
  CHECK_FALSE(file.ok());
}

TEST_CASE("FLUX.2 RoPE and timestep embedding follow the upstream formulas", "[flux2]") {
  // rope(): angle of axis a, pair i = pos_a * theta^(-2i/d_a); cos and sin of it.
  const at::Tensor ids = at::tensor(std::vector<float>{10, 2, 3, 0, 0, 0, 0, 5}).reshape({2, 4});
  auto [cos, sin] = infill::flux2_rope_angles(ids, {4, 4, 4, 4}, 2000.0);
  REQUIRE(cos.sizes() == at::IntArrayRef({2, 8}));
  CHECK(cos[0][0].item<double>() == Approx(std::cos(10.0)));
  CHECK(sin[0][1].item<double>() == Approx(std::sin(10.0 / std::sqrt(2000.0))));
  CHECK(sin[0][3].item<double>() == Approx(std::sin(2.0 / std::sqrt(2000.0))));
  CHECK(cos[1][6].item<double>() == Approx(std::cos(5.0)));
  CHECK(cos[1][0].item<double>() == 1.0);
  // timestep_embedding(t): t * 1000 against frequencies exp(-ln(10000) i / half), cos then sin.
  const at::Tensor e = infill::flux2_timestep_embedding(0.25, 8);
  REQUIRE(e.size(0) == 8);
  CHECK(e[0].item<double>() == Approx(std::cos(250.0)).margin(1e-4));
  CHECK(e[5].item<double>() == Approx(std::sin(250.0 * std::exp(-std::log(10000.0) / 4))).margin(1e-4));
}

TEST_CASE("FLUX.2 transformer loads diffusers' layout, sharded, to the same numbers", "[flux2][shared]") {
  const std::string path = kFlux2Dir + "/flux2_dit_dev.safetensors";
  require_or_skip(path);
  auto file = infill::SafetensorsFile::open(path);
  REQUIRE(file.ok());
  std::vector<std::pair<std::string, at::Tensor>> upstream;
  for (const auto& t : file->tensors()) {
    if (t.name.rfind("weights.", 0) == 0) upstream.emplace_back(t.name.substr(8), *infill::load_float_tensor(*file, t.name));
  }
  const auto diffusers = to_diffusers(upstream);
  REQUIRE(diffusers.size() == upstream.size() + 2 * 2 * 2);  // 2 double blocks x 2 streams: qkv -> 3
  infill::test::TempDir dir;
  const size_t half = diffusers.size() / 2;
  const std::vector<std::string> shards = {dir.path() + "/diffusion_pytorch_model-00001-of-00002.safetensors",
                                           dir.path() + "/diffusion_pytorch_model-00002-of-00002.safetensors"};
  REQUIRE(infill::write_safetensors(shards[0], {diffusers.begin(), diffusers.begin() + half}).ok());
  REQUIRE(infill::write_safetensors(shards[1], {diffusers.begin() + half, diffusers.end()}).ok());

  auto checkpoint = infill::Flux2Checkpoint::open(shards);
  REQUIRE(checkpoint.ok());
  CHECK(checkpoint->naming() == infill::Flux2Checkpoint::Naming::kDiffusers);
  auto model = Flux2Transformer::load(*checkpoint);
  REQUIRE(model.ok());
  CHECK(model->config().guidance_embed);
  c10::InferenceMode guard;
  const Request r = reference_request(*file);
  const at::Tensor out = forward_one(*model, full_segment(r, 0.73, 4.0));
  const double err = rel_err(out, *infill::load_float_tensor(*file, "output.prediction"));
  INFO("diffusers layout: max rel err " << err);
  CHECK(err <= infill::kReferenceTolerance);

  // A shard lost: the error names the missing projection.
  auto partial = infill::Flux2Checkpoint::open({shards[0]});
  CHECK_FALSE((partial.ok() && Flux2Transformer::load(*partial).ok()));
  // A key diffusers' model does not have.
  auto extra = diffusers;
  extra.emplace_back("transformer_blocks.0.attn.to_q.bias", at::zeros({128}));
  REQUIRE(infill::write_safetensors(dir.path() + "/extra.safetensors", extra).ok());
  auto extra_ckpt = infill::Flux2Checkpoint::open({dir.path() + "/extra.safetensors"});
  CHECK_FALSE(extra_ckpt.ok());
  CHECK_THAT(extra_ckpt.status().message(), Catch::Contains("transformer_blocks.0.attn.to_q.bias"));
}
