#include "support/catch.h"
#include "support/flux2_requests.h"
#include "support/float8_files.h"
#include "support/flux2_to_diffusers.h"
#include "support/shared_data.h"
#include "support/temp_dir.h"
#include "support/tiny_flux2.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <span>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/Half.h>
#include <nlohmann/json.hpp>

#include "model/float8.h"
#include "model/float8_checkpoint.h"
#include "model/flux2_checkpoint.h"
#include "model/flux2_folder.h"
#include "model/flux2_transformer.h"
#include "model/qwen3_encoder.h"
#include "model/qwen3_prompt_encoder.h"
#include "model/safetensors.h"
#include "model/safetensors_torch.h"

namespace fs = std::filesystem;
using infill::Float8Format;
using infill::Flux2Checkpoint;
using infill::Flux2Transformer;
using infill::test::Companions;
using infill::test::Fp8Checkpoint;
using infill::test::Quantizer;
using infill::test::RawTensor;
using infill::test::TempDir;
using infill::test::expected_value;
using infill::test::float_tensors;
using infill::test::quantize;
using infill::test::raw_of;
using infill::test::write_raw;

namespace {

std::vector<std::pair<std::string, at::Tensor>> prefixed(const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                                         const std::string& prefix) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& [name, t] : tensors) out.emplace_back(prefix + name, t);
  return out;
}

Flux2Transformer load_model(const std::string& path) {
  auto checkpoint = Flux2Checkpoint::open({path});
  INFO(path << ": " << (checkpoint.ok() ? "" : checkpoint.status().to_string()));
  REQUIRE(checkpoint.ok());
  auto model = Flux2Transformer::load(*checkpoint);
  INFO((model.ok() ? "" : model.status().to_string()));
  REQUIRE(model.ok());
  return std::move(*model);
}

infill::Status open_status(const std::string& path) {
  auto checkpoint = Flux2Checkpoint::open({path});
  if (!checkpoint.ok()) return checkpoint.status();
  return Flux2Transformer::load(*checkpoint).status();
}

void require_error(const infill::Status& s, const std::vector<std::string>& parts) {
  INFO(s.to_string());
  REQUIRE_FALSE(s.ok());
  for (const std::string& p : parts) CHECK_THAT(s.message(), Catch::Contains(p));
}

}  // namespace

TEST_CASE("FP8 codes decode as the OCP 8-bit float formats define them", "[float8]") {
  for (const Float8Format format : {Float8Format::kE4M3FN, Float8Format::kE5M2}) {
    INFO(infill::float8_format_name(format));
    int finite = 0;
    for (int c = 0; c < 256; ++c) {
      const float got = infill::float8_to_float(static_cast<uint8_t>(c), format);
      const float want = expected_value(static_cast<uint8_t>(c), format);
      INFO("code " << c);
      if (std::isnan(want)) {
        CHECK(std::isnan(got));
      } else {
        CHECK(std::memcmp(&got, &want, sizeof got) == 0);  // bit for bit, -0 included
        finite += std::isfinite(want) ? 1 : 0;
      }
    }
    // E4M3FN: only S.1111.111 is NaN; E5M2: 2 infinities and 6 NaNs.
    CHECK(finite == (format == Float8Format::kE4M3FN ? 254 : 248));
  }
  // The specification's landmarks.
  CHECK(infill::float8_to_float(0x7E, Float8Format::kE4M3FN) == 448.0f);
  CHECK(infill::float8_to_float(0xFE, Float8Format::kE4M3FN) == -448.0f);
  CHECK(infill::float8_to_float(0x38, Float8Format::kE4M3FN) == 1.0f);
  CHECK(infill::float8_to_float(0x08, Float8Format::kE4M3FN) == std::ldexp(1.0f, -6));
  CHECK(infill::float8_to_float(0x01, Float8Format::kE4M3FN) == std::ldexp(1.0f, -9));
  CHECK(std::signbit(infill::float8_to_float(0x80, Float8Format::kE4M3FN)));
  CHECK(infill::float8_to_float(0x7B, Float8Format::kE5M2) == 57344.0f);
  CHECK(std::isinf(infill::float8_to_float(0x7C, Float8Format::kE5M2)));

  // Scales: one for the tensor, or one per row; products rounded to bf16 as libtorch rounds
  // float32; the first code that is not finite, or not finite once scaled, is reported.
  auto bf16_bits = [](const std::vector<float>& values) {
    const at::Tensor b = at::tensor(values).to(at::kBFloat16);
    const auto* p = static_cast<const uint16_t*>(b.data_ptr());
    return std::vector<uint16_t>(p, p + values.size());
  };
  const std::vector<uint8_t> codes = {0x38, 0x40, 0x30, 0xB8, 0x39, 0x7E};  // 1, 2, 0.5, -1, 1.125, 448
  std::vector<uint16_t> out(6, 0);
  CHECK(infill::decode_float8_to_bf16(codes, Float8Format::kE4M3FN, std::vector<float>{0.5f}, 3, out.data()) == -1);
  CHECK(out == bf16_bits({0.5f, 1.0f, 0.25f, -0.5f, 0.5625f, 224.0f}));
  CHECK(infill::decode_float8_to_bf16(codes, Float8Format::kE4M3FN, std::vector<float>{2.0f, 3.0f}, 3, out.data()) == -1);
  CHECK(out == bf16_bits({2.0f, 4.0f, 1.0f, -3.0f, 3.375f, 1344.0f}));
  // A scale that is not a power of two: float32 products rounded to nearest even.
  const float odd = 0.0123456789f;
  CHECK(infill::decode_float8_to_bf16(codes, Float8Format::kE4M3FN, std::vector<float>{odd}, 3, out.data()) == -1);
  CHECK(out == bf16_bits({odd, 2 * odd, 0.5f * odd, -odd, 1.125f * odd, 448 * odd}));
  const std::vector<uint8_t> with_nan = {0x38, 0x38, 0x7F, 0x38};
  CHECK(infill::decode_float8_to_bf16(with_nan, Float8Format::kE4M3FN, std::vector<float>{1.0f}, 4, out.data()) == 2);
  CHECK(infill::decode_float8_to_bf16(codes, Float8Format::kE4M3FN, std::vector<float>{1e37f}, 3, out.data()) == 5);
}

TEST_CASE("FP8 FLUX.2 checkpoints load as the bf16 model of the same numbers in each published layout",
          "[flux2][float8]") {
  TempDir dir;
  const Flux2Transformer original = Flux2Transformer::random(infill::test::tiny_flux2_config(), 21, at::kFloat);
  REQUIRE(original.save(dir.file("original.safetensors"), "").ok());
  const auto upstream = float_tensors(dir.file("original.safetensors"), "");
  c10::InferenceMode guard;
  const infill::test::Request r = infill::test::make_request(infill::test::tiny_flux2_config(), 5, 3, 4, /*reference=*/true, 3);
  const at::Tensor unquantized = infill::test::forward_one(original, infill::test::full_segment(r, 0.6));

  struct Layout {
    const char* name;
    Float8Format format;
    bool diffusers;
    Companions companions;
    std::string prefix;
    std::string per_row;  // a weight stored with one scale per row
  };
  const Layout layouts[] = {
      {"BFL / ComfyUI, E4M3, upstream names", Float8Format::kE4M3FN, false, Companions::kComfyQuant,
       "model.diffusion_model.", "double_blocks.0.img_mlp.0.weight"},
      {"diffusers names in one file, E5M2, q/k/v scaled apart", Float8Format::kE5M2, true, Companions::kComfyQuant, "",
       "transformer_blocks.0.attn.to_k.weight"},
      {"ComfyUI scaled_fp8, E4M3", Float8Format::kE4M3FN, false, Companions::kScaledFp8, "", ""},
      {"a plain E5M2 cast", Float8Format::kE5M2, false, Companions::kNone, "", ""},
  };
  for (const Layout& layout : layouts) {
    INFO(layout.name);
    const auto named = layout.diffusers ? infill::test::to_diffusers(upstream) : upstream;
    const Fp8Checkpoint q = quantize(named, Quantizer(layout.format), layout.companions, layout.per_row);
    std::vector<RawTensor> fp8;
    for (RawTensor t : q.fp8) {
      t.name = layout.prefix + t.name;
      fp8.push_back(std::move(t));
    }
    write_raw(dir.file("fp8.safetensors"), fp8, q.metadata);
    REQUIRE(infill::write_safetensors(dir.file("bf16.safetensors"), prefixed(q.expected, layout.prefix)).ok());

    const Flux2Transformer from_fp8 = load_model(dir.file("fp8.safetensors"));
    const Flux2Transformer from_bf16 = load_model(dir.file("bf16.safetensors"));
    CHECK(from_fp8.config().hidden_size == 64);
    CHECK(from_fp8.weight_bytes() == from_bf16.weight_bytes());  // bf16, no scale or record kept
    const at::Tensor a = infill::test::forward_one(from_fp8, infill::test::full_segment(r, 0.6));
    const at::Tensor b = infill::test::forward_one(from_bf16, infill::test::full_segment(r, 0.6));
    // The same bf16 weights: the same numbers, bit for bit.
    CHECK(at::equal(a, b));
    // And close to the model before quantization (8-bit weights: a few percent).
    const double err = infill::test::rel_err(a, unquantized);
    INFO("FP8 model vs the float32 one: max rel err " << err);
    CHECK(err > 0);
    CHECK(err < (layout.companions == Companions::kNone ? 0.25 : 0.15));
  }
}

TEST_CASE("An E4M3 code comes back from its bf16 value divided by its scale, for every code and scale",
          "[float8]") {
  // What the FP8 compute path relies on (float8_e4m3_row_scales): the nearest E4M3 value to
  // bf16(value x scale) / scale is the code's own. The nearest value comes from the test's
  // quantizer (the format's definition), not from the engine.
  const Quantizer nearest(Float8Format::kE4M3FN);
  const std::vector<float> scales = {1.0f,      0.5f,        0.0123456789f, 3.7e-5f, 1.9e-3f,
                                     7.123f,    1.0f / 448,  2.2e-7f,       0.3333333f, 1e-30f};
  int checked = 0;
  for (const float scale : scales) {
    for (int c = 0; c < 256; ++c) {
      const auto code = static_cast<uint8_t>(c);
      const float value = expected_value(code, Float8Format::kE4M3FN);
      if (!std::isfinite(value)) continue;
      uint16_t bits = 0;
      REQUIRE(infill::decode_float8_to_bf16(std::span<const uint8_t>(&code, 1), Float8Format::kE4M3FN,
                                            std::vector<float>{scale}, 1, &bits) == -1);
      const uint32_t widened = uint32_t{bits} << 16;
      float stored = 0;
      std::memcpy(&stored, &widened, sizeof stored);
      INFO("code " << c << " scale " << scale << ": bf16 " << stored);
      CHECK(expected_value(nearest.code(stored / scale), Float8Format::kE4M3FN) == value);
      ++checked;
    }
  }
  CHECK(checked == 254 * static_cast<int>(scales.size()));
}

TEST_CASE("An E4M3 FLUX.2 file's row scales give back its own codes in each layout", "[flux2][float8]") {
  TempDir dir;
  const Flux2Transformer original = Flux2Transformer::random(infill::test::tiny_flux2_config(), 23, at::kFloat);
  REQUIRE(original.save(dir.file("original.safetensors"), "").ok());
  const auto upstream = float_tensors(dir.file("original.safetensors"), "");
  const Quantizer e4m3(Float8Format::kE4M3FN);
  auto bytes_of = [](const Fp8Checkpoint& q, const std::string& name) {
    for (const RawTensor& t : q.fp8) {
      if (t.name == name) return t.bytes;
    }
    FAIL("no stored tensor " << name);
    return std::string();
  };
  auto scale_of = [](const Fp8Checkpoint& q, const std::string& name) {
    for (const RawTensor& t : q.fp8) {
      if (t.name == name) return at::from_blob(const_cast<char*>(t.bytes.data()), t.shape, at::kFloat).reshape({-1}).clone();
    }
    FAIL("no stored tensor " << name);
    return at::Tensor();
  };
  // Codes of `weight` (bf16, as read) with `scales`, through the test's own quantizer.
  auto codes_of = [&](const at::Tensor& weight, const at::Tensor& scales) {
    const at::Tensor w = weight.to(at::kFloat).contiguous();
    const int64_t cols = w.size(1);
    std::string codes(static_cast<size_t>(w.numel()), '\0');
    for (int64_t i = 0; i < w.numel(); ++i) {
      codes[i] = static_cast<char>(e4m3.code(w.data_ptr<float>()[i] / scales[i / cols].item<float>()));
    }
    return codes;
  };
  auto open = [&](const Fp8Checkpoint& q) {
    write_raw(dir.file("fp8.safetensors"), q.fp8, q.metadata);
    auto checkpoint = Flux2Checkpoint::open({dir.file("fp8.safetensors")});
    REQUIRE(checkpoint.ok());
    return std::move(*checkpoint);
  };
  // Codes equal as bytes, except that -0 and +0 are one value.
  auto same_codes = [](std::string a, std::string b) {
    for (std::string* s : {&a, &b}) std::replace(s->begin(), s->end(), '\x80', '\0');
    return a == b;
  };

  SECTION("upstream names: one scale per tensor, and per row") {
    for (const Companions companions : {Companions::kComfyQuant, Companions::kScaledFp8, Companions::kNone}) {
      const Fp8Checkpoint q = quantize(upstream, e4m3, companions, "double_blocks.0.img_mlp.0.weight");
      const Flux2Checkpoint checkpoint = open(q);
      int layers = 0;
      for (const auto& [name, shape] : checkpoint.shapes()) {
        if (shape.size() != 2) continue;
        INFO(name);
        auto scales = checkpoint.float8_row_scales(name);
        REQUIRE(scales.ok());
        REQUIRE(scales->defined());
        REQUIRE(scales->sizes() == at::IntArrayRef({shape[0]}));
        auto weight = checkpoint.read(name, shape);
        REQUIRE(weight.ok());
        CHECK(same_codes(codes_of(*weight, *scales), bytes_of(q, name)));
        ++layers;
      }
      const auto linear = std::count_if(upstream.begin(), upstream.end(), [](const auto& t) { return t.second.dim() == 2; });
      CHECK(layers == linear);  // every linear layer
    }
    const Fp8Checkpoint q = quantize(upstream, e4m3, Companions::kComfyQuant, "double_blocks.0.img_mlp.0.weight");
    const Flux2Checkpoint checkpoint = open(q);
    const at::Tensor per_row = *checkpoint.float8_row_scales("double_blocks.0.img_mlp.0.weight");
    CHECK(at::equal(per_row, scale_of(q, "double_blocks.0.img_mlp.0.weight_scale")));
    const at::Tensor per_tensor = *checkpoint.float8_row_scales("double_blocks.0.img_attn.proj.weight");
    CHECK(per_tensor.eq(scale_of(q, "double_blocks.0.img_attn.proj.weight_scale")).all().item<bool>());
  }

  SECTION("diffusers names: q, k and v each with its own scale, fused in q, k, v order") {
    const Fp8Checkpoint q =
        quantize(infill::test::to_diffusers(upstream), e4m3, Companions::kComfyQuant, "transformer_blocks.0.attn.to_k.weight");
    const Flux2Checkpoint checkpoint = open(q);
    const std::string qkv = "double_blocks.0.img_attn.qkv.weight";
    const auto scales = checkpoint.float8_row_scales(qkv);
    REQUIRE(scales.ok());
    REQUIRE(scales->defined());
    const at::Tensor want = at::cat({scale_of(q, "transformer_blocks.0.attn.to_q.weight_scale").expand({64}),
                                     scale_of(q, "transformer_blocks.0.attn.to_k.weight_scale"),
                                     scale_of(q, "transformer_blocks.0.attn.to_v.weight_scale").expand({64})});
    CHECK(at::equal(*scales, want));
    auto weight = checkpoint.read(qkv, {192, 64});
    REQUIRE(weight.ok());
    CHECK(same_codes(codes_of(*weight, *scales), bytes_of(q, "transformer_blocks.0.attn.to_q.weight") +
                                                     bytes_of(q, "transformer_blocks.0.attn.to_k.weight") +
                                                     bytes_of(q, "transformer_blocks.0.attn.to_v.weight")));
  }

  SECTION("weights stored otherwise have none: bf16, and E5M2 (whose codes E4M3 cannot all hold)") {
    const Flux2Checkpoint e5m2 = open(quantize(upstream, Quantizer(Float8Format::kE5M2), Companions::kComfyQuant));
    auto none = e5m2.float8_row_scales("double_blocks.0.img_attn.qkv.weight");
    REQUIRE(none.ok());
    CHECK_FALSE(none->defined());
    auto bf16 = Flux2Checkpoint::open({dir.file("original.safetensors")});
    REQUIRE(bf16.ok());
    auto plain = bf16->float8_row_scales("single_blocks.0.linear1.weight");
    REQUIRE(plain.ok());
    CHECK_FALSE(plain->defined());
    auto missing = bf16->float8_row_scales("single_blocks.9.linear1.weight");
    REQUIRE_FALSE(missing.ok());
    CHECK_THAT(missing.status().message(), Catch::Contains("single_blocks.9.linear1.weight is missing"));
  }
}

TEST_CASE("FP8 checkpoints that are not per-tensor or per-row FP8 are refused naming the tensor", "[flux2][float8]") {
  TempDir dir;
  const Flux2Transformer original = Flux2Transformer::random(infill::test::tiny_flux2_config(), 22, at::kFloat);
  REQUIRE(original.save(dir.file("original.safetensors"), "").ok());
  const auto upstream = float_tensors(dir.file("original.safetensors"), "");
  const Fp8Checkpoint good = quantize(upstream, Quantizer(Float8Format::kE4M3FN), Companions::kComfyQuant);
  const std::string path = dir.file("bad.safetensors");
  auto with = [&](auto edit, std::map<std::string, std::string> metadata) {
    std::vector<RawTensor> tensors = good.fp8;
    edit(tensors);
    write_raw(path, tensors, metadata);
    return open_status(path);
  };
  auto find = [](std::vector<RawTensor>& tensors, const std::string& name) -> RawTensor& {
    for (RawTensor& t : tensors) {
      if (t.name == name) return t;
    }
    FAIL("no tensor " << name);
    return tensors[0];
  };
  const std::string layer = "double_blocks.0.img_attn.proj";

  SECTION("the good file loads") { CHECK(with([](auto&) {}, good.metadata).ok()); }
  SECTION("a comfy_quant record of another format (NVFP4)") {
    require_error(with(
                      [&](auto& t) {
                        const std::string record = R"({"format": "nvfp4"})";
                        find(t, layer + ".comfy_quant") = {layer + ".comfy_quant", "U8", {int64_t(record.size())}, record};
                      },
                      {}),
                  {path, layer, "'nvfp4'", "float8_e4m3fn"});
  }
  SECTION("the header's metadata names another format") {
    require_error(with([](auto&) {}, {{"_quantization_metadata",
                                       R"({"layers": {"single_blocks.0.linear2": {"format": "int8_blockwise"}}})"}}),
                  {path, "single_blocks.0.linear2", "'int8_blockwise'"});
  }
  SECTION("a second-level scale (NVFP4's weight_scale_2)") {
    require_error(with([&](auto& t) { t.push_back(raw_of(layer + ".weight_scale_2", at::ones({}))); }, good.metadata),
                  {path, layer + ".weight_scale_2", "other than FP8"});
  }
  SECTION("a scale of neither one nor one per row") {
    require_error(with([&](auto& t) { find(t, layer + ".weight_scale") = raw_of(layer + ".weight_scale", at::ones({3})); },
                       good.metadata),
                  {path, layer + ".weight_scale", "[3]", "expected [] or [1]", "[64]"});
  }
  SECTION("a scale beside a weight that is not FP8") {
    require_error(with(
                      [&](auto& t) {
                        find(t, layer + ".weight") = raw_of(layer + ".weight", at::ones({64, 64}, at::kBFloat16));
                        find(t, layer + ".comfy_quant").name = "unrelated.comfy_quant";
                      },
                      {}),
                  {path, layer + ".weight_scale", "BF16", "expected F8_E4M3 or F8_E5M2"});
  }
  SECTION("a scale without its weight") {
    require_error(with([&](auto& t) { t.push_back(raw_of("double_blocks.0.lost.weight_scale", at::ones({}))); },
                       good.metadata),
                  {path, "double_blocks.0.lost.weight_scale", "no double_blocks.0.lost.weight"});
  }
  SECTION("a record that names the other FP8 format than the weight's") {
    require_error(with(
                      [&](auto& t) {
                        const std::string record = R"({"format": "float8_e5m2"})";
                        find(t, layer + ".comfy_quant") = {layer + ".comfy_quant", "U8", {int64_t(record.size())}, record};
                      },
                      {}),
                  {path, layer + ".weight is F8_E4M3", "float8_e5m2"});
  }
  SECTION("a NaN code in a weight") {
    require_error(with([&](auto& t) { find(t, layer + ".weight").bytes[70] = static_cast<char>(0x7F); }, good.metadata),
                  {path, layer + ".weight", "non-finite", "flat index 70"});
  }
  SECTION("a NaN scale") {
    require_error(with(
                      [&](auto& t) {
                        find(t, layer + ".weight_scale") =
                            raw_of(layer + ".weight_scale", at::full({}, std::numeric_limits<float>::quiet_NaN()));
                      },
                      good.metadata),
                  {path, layer + ".weight_scale", "non-finite"});
  }
}

TEST_CASE("An FP8 transformer file is found as a single-file model folder in either naming", "[flux2][float8]") {
  TempDir dir;
  const Flux2Transformer original = Flux2Transformer::random(infill::test::tiny_flux2_config(), 23, at::kFloat);
  REQUIRE(original.save(dir.file("original.safetensors"), "").ok());
  const auto upstream = float_tensors(dir.file("original.safetensors"), "");
  fs::remove(dir.file("original.safetensors"));
  for (const bool diffusers : {false, true}) {
    INFO((diffusers ? "diffusers names" : "upstream names"));
    const std::string folder = dir.file(diffusers ? "diffusers" : "upstream");
    fs::create_directories(folder);
    const Fp8Checkpoint q = quantize(diffusers ? infill::test::to_diffusers(upstream) : upstream,
                                     Quantizer(Float8Format::kE4M3FN), Companions::kComfyQuant);
    write_raw(folder + "/flux-2-klein-4b-fp8.safetensors", q.fp8, q.metadata);
    std::ofstream(folder + "/ae.safetensors") << "";  // found, not read, here
    auto found = infill::find_flux2_folder(folder);
    INFO((found.ok() ? "" : found.status().to_string()));
    REQUIRE(found.ok());
    CHECK(found->layout == infill::Flux2Folder::Layout::kSingleFile);
    CHECK(found->distilled);  // "klein" without "base"
    REQUIRE(found->transformer_files.size() == 1);
    CHECK(fs::path(found->transformer_files[0]).filename() == "flux-2-klein-4b-fp8.safetensors");
    CHECK(load_model(found->transformer_files[0]).config().hidden_size == 64);
    auto checkpoint = Flux2Checkpoint::open(found->transformer_files);
    REQUIRE(checkpoint.ok());
    // The linear weights in FP8, the norm scales in bf16.
    CHECK(checkpoint->stored_dtypes() == std::vector<std::string>{"BF16", "F8_E4M3"});
  }
}

TEST_CASE("FP8 reference FLUX.2 weights: the model stays the upstream model within FP8's rounding",
          "[flux2][float8][shared]") {
  const std::string path = infill::test::shared_path("testdata/flux2/flux2_dit_dev.safetensors");
  infill::test::require_shared_or_skip({path});
  auto file = infill::SafetensorsFile::open(path);
  REQUIRE(file.ok());
  TempDir dir;
  const Fp8Checkpoint q =
      quantize(float_tensors(path, "weights."), Quantizer(Float8Format::kE4M3FN), Companions::kComfyQuant);
  write_raw(dir.file("dev-fp8.safetensors"), q.fp8, q.metadata);
  const Flux2Transformer model = load_model(dir.file("dev-fp8.safetensors"));
  c10::InferenceMode guard;
  infill::test::Request r;
  r.txt = *infill::load_float_tensor(*file, "input.ctx");
  r.txt_ids = *infill::load_float_tensor(*file, "input.ctx_ids");
  r.img = *infill::load_float_tensor(*file, "input.x");
  r.img_ids = *infill::load_float_tensor(*file, "input.x_ids");
  const at::Tensor out = infill::test::forward_one(model, infill::test::full_segment(r, 0.73, 4.0));
  const double err = infill::test::rel_err(out, *infill::load_float_tensor(*file, "output.prediction"));
  WARN("E4M3 weights, one scale each, vs upstream's bf16 reference: max rel err " << err);
  CHECK(err > 0);
  CHECK(err < 0.1);
}

TEST_CASE("An FP8 Qwen3 text encoder loads as the bf16 encoder of the same numbers", "[qwen3][float8]") {
  TempDir dir;
  const infill::Qwen3Config cfg = infill::test::tiny_qwen3_config();
  REQUIRE(infill::Qwen3Encoder::random(cfg, 31, at::kBFloat16)->save(dir.file("original")).ok());
  const Fp8Checkpoint q = quantize(float_tensors(dir.file("original/model.safetensors"), ""),
                                   Quantizer(Float8Format::kE4M3FN), Companions::kComfyQuant);
  for (const char* folder : {"fp8", "bf16"}) {
    fs::create_directories(dir.file(folder));
    fs::copy_file(dir.file("original/config.json"), dir.file(std::string(folder) + "/config.json"));
  }
  write_raw(dir.file("fp8/model.safetensors"), q.fp8, q.metadata);
  REQUIRE(infill::write_safetensors(dir.file("bf16/model.safetensors"), q.expected).ok());
  auto fp8 = infill::Qwen3Encoder::load(dir.file("fp8"));
  INFO((fp8.ok() ? "" : fp8.status().to_string()));
  REQUIRE(fp8.ok());
  auto bf16 = infill::Qwen3Encoder::load(dir.file("bf16"));
  REQUIRE(bf16.ok());
  auto original = infill::Qwen3Encoder::load(dir.file("original"));
  REQUIRE(original.ok());
  const std::vector<int32_t> ids = {9707, 11, 1879, 0, 151643, 42};
  const std::vector<uint8_t> mask = {1, 1, 1, 1, 1, 0};
  const auto a = (*fp8)->encode(ids, mask, {1, 3});
  const auto b = (*bf16)->encode(ids, mask, {1, 3});
  const auto c = (*original)->encode(ids, mask, {1, 3});
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  REQUIRE(c.ok());
  CHECK(at::equal(*a, *b));
  // The memory it takes once loaded, from the headers (the engine's text-encoder residency):
  // as the bf16 twin's, plus the scales and records.
  const int64_t fp8_bytes = infill::qwen3_folder_weight_bytes(dir.file("fp8"));
  const int64_t bf16_bytes = infill::qwen3_folder_weight_bytes(dir.file("bf16"));
  CHECK(fp8_bytes >= bf16_bytes);
  CHECK(fp8_bytes < bf16_bytes + bf16_bytes / 100);
  const double err = infill::test::rel_err(*a, *c);
  INFO("FP8 encoder vs the bf16 one: max rel err " << err);
  CHECK(err > 0);
  CHECK(err < 0.15);
}
