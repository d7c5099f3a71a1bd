#include "support/catch.h"
#include "support/shared_data.h"
#include "support/temp_dir.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "model/flux2_autoencoder.h"
#include "model/safetensors.h"
#include "model/safetensors_torch.h"

using infill::Flux2Autoencoder;
using infill::test::TempDir;

namespace fs = std::filesystem;

namespace {

const std::string kReferencePath = infill::test::shared_path("testdata/flux2/flux2_ae.safetensors");

using TensorList = std::vector<std::pair<std::string, at::Tensor>>;

/// Random weights under the upstream module names of `src/flux2/autoencoder.py`, written out
/// here from the upstream constructors rather than from the loader's own list, so that a
/// naming slip in either shows up.
class UpstreamWeights {
 public:
  UpstreamWeights(std::string prefix, uint64_t seed)
      : prefix_(std::move(prefix)), gen_(at::make_generator<at::CPUGeneratorImpl>(seed)) {}

  TensorList build(int ch, const std::vector<int>& ch_mult, int num_res_blocks, int z) {
    const int levels = static_cast<int>(ch_mult.size());
    // Encoder: in_ch_mult = (1,) + ch_mult.
    conv("encoder.conv_in", ch, 3, 3);
    int block_in = ch;
    for (int i = 0; i < levels; ++i) {
      block_in = ch * (i == 0 ? 1 : ch_mult[i - 1]);
      const int block_out = ch * ch_mult[i];
      const std::string down = "encoder.down." + std::to_string(i);
      for (int j = 0; j < num_res_blocks; ++j) {
        res_block(down + ".block." + std::to_string(j), block_in, block_out);
        block_in = block_out;
      }
      if (i != levels - 1) conv(down + ".downsample.conv", block_in, block_in, 3);
    }
    mid("encoder.mid", block_in);
    norm("encoder.norm_out", block_in);
    conv("encoder.conv_out", 2 * z, block_in, 3);
    conv("encoder.quant_conv", 2 * z, 2 * z, 1);
    // Decoder.
    conv("decoder.post_quant_conv", z, z, 1);
    block_in = ch * ch_mult[levels - 1];
    conv("decoder.conv_in", block_in, z, 3);
    mid("decoder.mid", block_in);
    for (int i = levels - 1; i >= 0; --i) {
      const int block_out = ch * ch_mult[i];
      const std::string up = "decoder.up." + std::to_string(i);
      for (int j = 0; j < num_res_blocks + 1; ++j) {
        res_block(up + ".block." + std::to_string(j), block_in, block_out);
        block_in = block_out;
      }
      if (i != 0) conv(up + ".upsample.conv", block_in, block_in, 3);
    }
    norm("decoder.norm_out", block_in);
    conv("decoder.conv_out", 3, block_in, 3);
    // BatchNorm2d(4z, affine=False): running statistics only.
    add("bn.running_mean", at::randn({4 * z}, gen_) * 0.5);
    add("bn.running_var", at::rand({4 * z}, gen_) + 0.5);
    return std::move(tensors_);
  }

 private:
  void add(const std::string& name, at::Tensor t) { tensors_.emplace_back(prefix_ + name, t); }
  void conv(const std::string& name, int out, int in, int k) {
    // PyTorch's default init: uniform in +-1/sqrt(fan_in).
    const double bound = 1.0 / std::sqrt(static_cast<double>(in * k * k));
    add(name + ".weight", (at::rand({out, in, k, k}, gen_) * 2 - 1) * bound);
    add(name + ".bias", (at::rand({out}, gen_) * 2 - 1) * bound);
  }
  void norm(const std::string& name, int c) {
    add(name + ".weight", 1 + at::randn({c}, gen_) * 0.1);
    add(name + ".bias", at::randn({c}, gen_) * 0.1);
  }
  void res_block(const std::string& name, int in, int out) {
    norm(name + ".norm1", in);
    conv(name + ".conv1", out, in, 3);
    norm(name + ".norm2", out);
    conv(name + ".conv2", out, out, 3);
    if (in != out) conv(name + ".nin_shortcut", out, in, 1);
  }
  void attn_block(const std::string& name, int c) {
    norm(name + ".norm", c);
    for (const char* p : {".q", ".k", ".v", ".proj_out"}) conv(name + p, c, c, 1);
  }
  void mid(const std::string& name, int c) {
    res_block(name + ".block_1", c, c);
    attn_block(name + ".attn_1", c);
    res_block(name + ".block_2", c, c);
  }

  std::string prefix_;
  at::Generator gen_;
  TensorList tensors_;
};

/// The tiny model of these tests: ch 32, ch_mult [1, 2], one res block, z 4 (factor 4,
/// 16 latent channels).
TensorList tiny_weights(const std::string& prefix, uint64_t seed = 5) {
  return UpstreamWeights(prefix, seed).build(32, {1, 2}, 1, 4);
}

Flux2Autoencoder load_or_fail(const std::string& path, const std::string& prefix) {
  auto file = infill::SafetensorsFile::open(path);
  REQUIRE(file.ok());
  auto ae = Flux2Autoencoder::load(*file, prefix);
  if (!ae.ok()) FAIL(ae.status().to_string());
  return std::move(ae).value();
}

infill::Status load_status(const std::string& path, const std::string& prefix) {
  auto file = infill::SafetensorsFile::open(path);
  if (!file.ok()) return file.status();
  auto ae = Flux2Autoencoder::load(*file, prefix);
  return ae.ok() ? infill::Status() : ae.status();
}

double relative_max_diff(const at::Tensor& got, const at::Tensor& ref) {
  return (got - ref).abs().max().item<double>() / ref.abs().max().item<double>();
}

/// Python's str.replace: every occurrence.
std::string py_replace(std::string s, const std::string& old, const std::string& with) {
  for (size_t at = s.find(old); at != std::string::npos; at = s.find(old, at + with.size())) {
    s.replace(at, old.size(), with);
  }
  return s;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

/// diffusers' convert_flux2_vae_checkpoint_to_diffusers (scripts/convert_flux2_to_diffusers.py,
/// huggingface/diffusers 207bae7), transcribed step by step in its own terms (substring filters
/// and str.replace) rather than from the loader's inverse: upstream names without a prefix ->
/// AutoencoderKLFlux2 names. `levels` is len(down_block_types) == len(up_block_types).
TensorList to_diffusers(const TensorList& upstream, int levels) {
  std::vector<std::string> keys;  // vae_state_dict in its order
  std::map<std::string, at::Tensor> vae_state_dict;
  for (const auto& [name, t] : upstream) {
    keys.push_back(name);
    vae_state_dict[name] = t;
  }
  std::map<std::string, at::Tensor> new_checkpoint;
  const auto keys_with = [&](const std::string& part) {
    std::vector<std::string> out;
    for (const std::string& k : keys) {
      if (contains(k, part)) out.push_back(k);
    }
    return out;
  };
  // update_vae_resnet_ldm_to_diffusers
  const auto resnets = [&](const std::vector<std::string>& ldm_keys, const std::string& old,
                           const std::string& with) {
    for (const std::string& k : ldm_keys) {
      new_checkpoint[py_replace(py_replace(k, old, with), "nin_shortcut", "conv_shortcut")] =
          vae_state_dict.at(k);
    }
  };
  // update_vae_attentions_ldm_to_diffusers
  const std::vector<std::pair<std::string, std::string>> attention_replaces = {
      {"norm.weight", "group_norm.weight"},
      {"norm.bias", "group_norm.bias"},
      {"q.weight", "to_q.weight"},
      {"q.bias", "to_q.bias"},
      {"k.weight", "to_k.weight"},
      {"k.bias", "to_k.bias"},
      {"v.weight", "to_v.weight"},
      {"v.bias", "to_v.bias"},
      {"proj_out.weight", "to_out.0.weight"},
      {"proj_out.bias", "to_out.0.bias"}};
  const auto attentions = [&](const std::vector<std::string>& ldm_keys) {
    for (const std::string& k : ldm_keys) {
      std::string d = py_replace(k, "mid.attn_1", "mid_block.attentions.0");
      for (const auto& [from, to] : attention_replaces) d = py_replace(d, from, to);
      at::Tensor t = vae_state_dict.at(k);
      if (t.dim() == 3) t = t.select(2, 0);               // [:, :, 0]
      if (t.dim() == 4) t = t.select(3, 0).select(2, 0);  // [:, :, 0, 0]
      new_checkpoint[d] = t.contiguous();
    }
  };

  // DIFFUSERS_VAE_TO_FLUX2_MAPPING
  const std::vector<std::pair<std::string, std::string>> mapping = {
      {"encoder.conv_in.weight", "encoder.conv_in.weight"},
      {"encoder.conv_in.bias", "encoder.conv_in.bias"},
      {"encoder.conv_out.weight", "encoder.conv_out.weight"},
      {"encoder.conv_out.bias", "encoder.conv_out.bias"},
      {"encoder.conv_norm_out.weight", "encoder.norm_out.weight"},
      {"encoder.conv_norm_out.bias", "encoder.norm_out.bias"},
      {"decoder.conv_in.weight", "decoder.conv_in.weight"},
      {"decoder.conv_in.bias", "decoder.conv_in.bias"},
      {"decoder.conv_out.weight", "decoder.conv_out.weight"},
      {"decoder.conv_out.bias", "decoder.conv_out.bias"},
      {"decoder.conv_norm_out.weight", "decoder.norm_out.weight"},
      {"decoder.conv_norm_out.bias", "decoder.norm_out.bias"},
      {"quant_conv.weight", "encoder.quant_conv.weight"},
      {"quant_conv.bias", "encoder.quant_conv.bias"},
      {"post_quant_conv.weight", "decoder.post_quant_conv.weight"},
      {"post_quant_conv.bias", "decoder.post_quant_conv.bias"},
      {"bn.running_mean", "bn.running_mean"},
      {"bn.running_var", "bn.running_var"},
  };
  for (const auto& [diffusers_key, ldm_key] : mapping) {
    if (vae_state_dict.count(ldm_key)) new_checkpoint[diffusers_key] = vae_state_dict[ldm_key];
  }

  for (int i = 0; i < levels; ++i) {
    const std::string down = "down." + std::to_string(i);
    std::vector<std::string> block_keys;
    for (const std::string& k : keys_with(down)) {
      if (!contains(k, down + ".downsample")) block_keys.push_back(k);
    }
    resnets(block_keys, down + ".block", "down_blocks." + std::to_string(i) + ".resnets");
    const std::string conv = "encoder." + down + ".downsample.conv";
    if (vae_state_dict.count(conv + ".weight")) {
      const std::string to = "encoder.down_blocks." + std::to_string(i) + ".downsamplers.0.conv";
      new_checkpoint[to + ".weight"] = vae_state_dict.at(conv + ".weight");
      new_checkpoint[to + ".bias"] = vae_state_dict.at(conv + ".bias");
    }
  }
  for (int i = 1; i <= 2; ++i) {
    resnets(keys_with("encoder.mid.block_" + std::to_string(i)), "mid.block_" + std::to_string(i),
            "mid_block.resnets." + std::to_string(i - 1));
  }
  attentions(keys_with("encoder.mid.attn"));

  for (int i = 0; i < levels; ++i) {
    const int block_id = levels - 1 - i;
    const std::string up = "up." + std::to_string(block_id);
    std::vector<std::string> block_keys;
    for (const std::string& k : keys_with(up)) {
      if (!contains(k, up + ".upsample")) block_keys.push_back(k);
    }
    resnets(block_keys, up + ".block", "up_blocks." + std::to_string(i) + ".resnets");
    const std::string conv = "decoder." + up + ".upsample.conv";
    if (vae_state_dict.count(conv + ".weight")) {
      const std::string to = "decoder.up_blocks." + std::to_string(i) + ".upsamplers.0.conv";
      new_checkpoint[to + ".weight"] = vae_state_dict.at(conv + ".weight");
      new_checkpoint[to + ".bias"] = vae_state_dict.at(conv + ".bias");
    }
  }
  for (int i = 1; i <= 2; ++i) {
    resnets(keys_with("decoder.mid.block_" + std::to_string(i)), "mid.block_" + std::to_string(i),
            "mid_block.resnets." + std::to_string(i - 1));
  }
  attentions(keys_with("decoder.mid.attn"));
  // conv_attn_to_linear touches only query/key/value/proj_attn names: none here.
  return TensorList(new_checkpoint.begin(), new_checkpoint.end());
}

TensorList with_prefix(const TensorList& tensors, const std::string& prefix) {
  TensorList out;
  for (const auto& [name, t] : tensors) out.emplace_back(prefix + name, t);
  return out;
}

void require_reference_or_skip() { infill::test::require_shared_or_skip({kReferencePath}); }

}  // namespace

TEST_CASE("FLUX.2 autoencoder: a tiny random model loads, infers its config, runs", "[flux2_ae]") {
  TempDir dir;
  const std::string path = dir.file("tiny.safetensors");
  TensorList tensors = tiny_weights("weights.");
  // Around the prefix as in the reference files: inputs and outputs, which are not weights,
  // and the BatchNorm's training counter, which is ignored.
  tensors.emplace_back("weights.bn.num_batches_tracked", at::zeros({1}));
  tensors.emplace_back("input.image", at::zeros({3, 8, 8}));
  REQUIRE(infill::write_safetensors(path, tensors).ok());

  const Flux2Autoencoder ae = load_or_fail(path, "weights.");
  CHECK(ae.config().ch == 32);
  CHECK(ae.config().ch_mult == std::vector<int>{1, 2});
  CHECK(ae.config().num_res_blocks == 1);
  CHECK(ae.config().z_channels == 4);
  CHECK(ae.config().in_channels == 3);
  CHECK(ae.config().out_channels == 3);
  CHECK(ae.factor() == 4);
  CHECK(ae.latent_channels() == 16);
  CHECK(ae.config().latent_channels() == 16);
  CHECK(infill::Flux2AutoencoderConfig{}.factor() == 16);  // the published ae
  CHECK(infill::Flux2AutoencoderConfig{}.latent_channels() == 128);

  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(17);
  const at::Tensor image = at::rand({2, 3, 16, 24}, gen) * 2 - 1;
  const at::Tensor latent = ae.encode_normalized(image);
  REQUIRE(latent.sizes() == at::IntArrayRef({2, 16, 4, 6}));
  CHECK(latent.is_contiguous());
  CHECK(at::isfinite(latent).all().item<bool>());
  const at::Tensor decoded = ae.decode_normalized(latent);
  REQUIRE(decoded.sizes() == at::IntArrayRef({2, 3, 16, 24}));
  CHECK(at::isfinite(decoded).all().item<bool>());
  // Outputs are ordinary tensors: in-place updates outside InferenceMode are allowed.
  at::Tensor copy = ae.decode_normalized(latent);
  copy.mul_(0.5);
  // Batch items are independent (GroupNorm and attention work per item).
  CHECK(
      at::allclose(ae.encode_normalized(image.slice(0, 1, 2)), latent.slice(0, 1, 2), 1e-5, 1e-5));

  // The LatentCodec face: [0, 1] pixels on both sides.
  const at::Tensor rgb = (image + 1) / 2;
  CHECK(at::allclose(ae.encode(rgb), latent, 1e-5, 1e-5));
  const at::Tensor pixels = ae.decode(latent);
  REQUIRE(pixels.sizes() == at::IntArrayRef({2, 3, 16, 24}));
  CHECK(pixels.min().item<float>() >= 0.0f);
  CHECK(pixels.max().item<float>() <= 1.0f);
  CHECK(at::allclose(pixels, ((decoded + 1) / 2).clamp(0, 1), 1e-6, 1e-6));

  // decode_crop: a margin reaching the whole latent is the full decode; otherwise the box's
  // pixels, approximately.
  const at::Tensor whole = ae.decode_crop(latent, 1, 2, 3, 2, 6);
  REQUIRE(whole.sizes() == at::IntArrayRef({2, 3, 8, 12}));
  CHECK(at::allclose(whole, pixels.slice(2, 8, 16).slice(3, 4, 16), 1e-5, 1e-5));
  CHECK(at::allclose(ae.decode_crop(latent, 0, 0, 6, 4, 0), pixels, 1e-6, 1e-6));
  const at::Tensor corner = ae.decode_crop(latent, 4, 2, 2, 2, 1);
  REQUIRE(corner.sizes() == at::IntArrayRef({2, 3, 8, 8}));
  CHECK(corner.min().item<float>() >= 0.0f);
  CHECK(corner.max().item<float>() <= 1.0f);

  CHECK_THROWS(ae.encode_normalized(at::rand({1, 3, 18, 24})));  // 18 is not a multiple of 4
  CHECK_THROWS(ae.encode_normalized(at::rand({1, 4, 16, 24})));
  CHECK_THROWS(ae.decode_normalized(at::rand({1, 4, 4, 6})));
  CHECK_THROWS(ae.decode_crop(latent, 5, 0, 2, 2, 1));

  // Large enough that the mid attention (8464 positions) is computed in chunks of queries,
  // split differently for one image and for two: the same result either way.
  const at::Tensor large = at::rand({1, 3, 184, 184}, gen) * 2 - 1;
  const at::Tensor large_latent = ae.encode_normalized(large);
  const at::Tensor pair_latent = ae.encode_normalized(at::cat({large, large.flip(3)}));
  CHECK(at::allclose(pair_latent.slice(0, 0, 1), large_latent, 1e-5, 1e-5));
  CHECK(at::allclose(ae.decode_normalized(at::cat({large_latent, large_latent})).slice(0, 1, 2),
                     ae.decode_normalized(large_latent), 1e-5, 1e-5));

  // Copies share the weights and behave the same.
  const Flux2Autoencoder copy_ae = ae;
  CHECK(copy_ae.encode_normalized(image).equal(latent));

  // Without the prefix the same file holds no autoencoder at the top level.
  const infill::Status no_prefix = load_status(path, "");
  REQUIRE_FALSE(no_prefix.ok());
  CHECK_THAT(no_prefix.message(), Catch::Matchers::Contains("encoder.conv_in.weight"));

  // load(path) reads an unprefixed file, as ae.safetensors is.
  const std::string plain = dir.file("ae.safetensors");
  REQUIRE(infill::write_safetensors(plain, tiny_weights("")).ok());
  auto from_path = Flux2Autoencoder::load(plain);
  REQUIRE(from_path.ok());
  CHECK(from_path->encode_normalized(image).equal(latent));  // same seed, same weights
}

TEST_CASE("FLUX.2 autoencoder: damaged files are refused, naming the tensor", "[flux2_ae]") {
  TempDir dir;
  const std::string prefix = "weights.";
  const TensorList good = tiny_weights(prefix);
  const auto write_variant = [&](const std::string& file_name, auto&& edit) {
    TensorList tensors;
    for (const auto& [name, t] : good) tensors.emplace_back(name, t.clone());
    edit(tensors);
    const std::string path = dir.file(file_name);
    REQUIRE(infill::write_safetensors(path, tensors).ok());
    return path;
  };
  const auto find = [](TensorList& tensors, const std::string& name) -> at::Tensor& {
    auto it = std::find_if(tensors.begin(), tensors.end(),
                           [&](const auto& entry) { return entry.first == name; });
    REQUIRE(it != tensors.end());
    return it->second;
  };

  SECTION("a missing tensor") {
    const std::string name = prefix + "decoder.mid.attn_1.q.bias";
    const std::string path = write_variant("missing.st", [&](TensorList& tensors) {
      std::erase_if(tensors, [&](const auto& entry) { return entry.first == name; });
    });
    const infill::Status status = load_status(path, prefix);
    REQUIRE_FALSE(status.ok());
    CHECK(status.code() == infill::ErrorCode::kNotFound);
    CHECK_THAT(status.message(),
               Catch::Matchers::Contains("'" + name + "'") && Catch::Matchers::Contains(path));
  }

  SECTION("a wrong shape") {
    const std::string name = prefix + "encoder.down.1.block.0.nin_shortcut.weight";
    const std::string path = write_variant("shape.st", [&](TensorList& tensors) {
      find(tensors, name) = at::zeros({64, 16, 1, 1});
    });
    const infill::Status status = load_status(path, prefix);
    REQUIRE_FALSE(status.ok());
    CHECK(status.code() == infill::ErrorCode::kInvalidArgument);
    CHECK_THAT(status.message(), Catch::Matchers::Contains(name) &&
                                     Catch::Matchers::Contains("expected [64, 32, 1, 1]") &&
                                     Catch::Matchers::Contains(path));
  }

  SECTION("a NaN") {
    const std::string name = prefix + "decoder.up.0.block.1.conv2.weight";
    const std::string path = write_variant("nan.st", [&](TensorList& tensors) {
      find(tensors, name).view(-1)[7].fill_(std::numeric_limits<float>::quiet_NaN());
    });
    const infill::Status status = load_status(path, prefix);
    REQUIRE_FALSE(status.ok());
    CHECK(status.code() == infill::ErrorCode::kCorruptData);
    CHECK_THAT(status.message(), Catch::Matchers::Contains(name));
  }

  SECTION("an unexpected tensor under the prefix") {
    // A second res block per level in the decoder only: not the layout the encoder implies.
    const std::string name = prefix + "decoder.up.0.block.2.conv1.weight";
    const std::string path = write_variant("extra.st", [&](TensorList& tensors) {
      tensors.emplace_back(name, at::zeros({32, 32, 3, 3}));
    });
    const infill::Status status = load_status(path, prefix);
    REQUIRE_FALSE(status.ok());
    CHECK(status.code() == infill::ErrorCode::kInvalidArgument);
    CHECK_THAT(status.message(), Catch::Matchers::Contains("unexpected tensor '" + name + "'"));
  }

  SECTION("a channel count GroupNorm cannot split into 32 groups") {
    const std::string path = write_variant("narrow.st", [&](TensorList& tensors) {
      tensors = UpstreamWeights(prefix, 3).build(16, {1, 2}, 1, 4);
    });
    const infill::Status status = load_status(path, prefix);
    REQUIRE_FALSE(status.ok());
    CHECK_THAT(status.message(), Catch::Matchers::Contains("encoder.conv_in.weight") &&
                                     Catch::Matchers::Contains("ch=16"));
  }

  SECTION("a missing file") {
    auto ae = Flux2Autoencoder::load(dir.file("absent.safetensors"));
    REQUIRE_FALSE(ae.ok());
    CHECK(ae.status().code() == infill::ErrorCode::kNotFound);
  }
}

TEST_CASE("FLUX.2 autoencoder: diffusers names load as the same model", "[flux2_ae]") {
  TempDir dir;
  const TensorList upstream = tiny_weights("");
  const TensorList diffusers = to_diffusers(upstream, 2);
  REQUIRE(diffusers.size() == upstream.size());
  // The conversion as the script does it: the attention's 1x1 convs become linear weights, and
  // up_blocks.0 is the decoder's lowest-resolution level (upstream's up.1, 64 channels).
  const std::map<std::string, at::Tensor> by_name(diffusers.begin(), diffusers.end());
  REQUIRE(by_name.count("encoder.mid_block.attentions.0.to_q.weight"));
  CHECK(by_name.at("encoder.mid_block.attentions.0.to_q.weight").sizes() ==
        at::IntArrayRef({64, 64}));
  REQUIRE(by_name.count("decoder.up_blocks.0.upsamplers.0.conv.weight"));
  CHECK(by_name.at("decoder.up_blocks.0.upsamplers.0.conv.weight").sizes() ==
        at::IntArrayRef({64, 64, 3, 3}));
  CHECK(by_name.count("decoder.up_blocks.1.resnets.0.conv_shortcut.weight"));
  CHECK(by_name.count("encoder.down_blocks.1.resnets.0.conv_shortcut.weight"));

  const std::string upstream_path = dir.file("ae.safetensors");
  REQUIRE(infill::write_safetensors(upstream_path, upstream).ok());
  const Flux2Autoencoder reference = load_or_fail(upstream_path, "");

  const std::string prefix = "vae.";
  const auto write_variant = [&](const std::string& file_name, auto&& edit) {
    TensorList tensors;
    for (const auto& [name, t] : diffusers) tensors.emplace_back(name, t.clone());
    // diffusers' save_pretrained also writes the BatchNorm's counter.
    tensors.emplace_back("bn.num_batches_tracked", at::zeros({}));
    edit(tensors);
    const std::string path = dir.file(file_name);
    REQUIRE(infill::write_safetensors(path, with_prefix(tensors, prefix)).ok());
    return path;
  };
  const auto find = [](TensorList& tensors, const std::string& name) -> at::Tensor& {
    auto it = std::find_if(tensors.begin(), tensors.end(),
                           [&](const auto& entry) { return entry.first == name; });
    REQUIRE(it != tensors.end());
    return it->second;
  };

  SECTION("the same outputs as the upstream names") {
    const Flux2Autoencoder ae = load_or_fail(write_variant("vae.st", [](TensorList&) {}), prefix);
    CHECK(ae.config().to_string() == reference.config().to_string());
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(23);
    const at::Tensor image = at::rand({2, 3, 16, 24}, gen) * 2 - 1;
    const at::Tensor latent = reference.encode_normalized(image);
    CHECK(ae.encode_normalized(image).equal(latent));
    CHECK(ae.decode_normalized(latent).equal(reference.decode_normalized(latent)));
  }

  SECTION("a diffusers name without an upstream counterpart") {
    for (const std::string name :
         {"encoder.mid_block.attentions.0.to_q.lora_A.weight", "encoder.norm_out.weight",
          "decoder.up_blocks.2.resnets.0.conv1.weight",
          "decoder.up_blocks.01.resnets.0.conv1.weight"}) {
      const std::string path = write_variant("extra.st", [&](TensorList& tensors) {
        tensors.emplace_back(name, at::zeros({4, 64}));
      });
      const infill::Status status = load_status(path, prefix);
      REQUIRE_FALSE(status.ok());
      CHECK(status.code() == infill::ErrorCode::kInvalidArgument);
      CHECK_THAT(status.message(),
                 Catch::Matchers::Contains("unexpected tensor '" + prefix + name + "'") &&
                     Catch::Matchers::Contains("diffusers names"));
    }
  }

  SECTION("a wrong shape names the stored tensor and its stored shape") {
    const std::string name = "decoder.mid_block.attentions.0.to_q.weight";
    const std::string path = write_variant("shape.st", [&](TensorList& tensors) {
      find(tensors, name) = at::zeros({64, 64, 1, 1});  // upstream's conv shape
    });
    const infill::Status status = load_status(path, prefix);
    REQUIRE_FALSE(status.ok());
    CHECK(status.code() == infill::ErrorCode::kInvalidArgument);
    CHECK_THAT(status.message(), Catch::Matchers::Contains(prefix + name) &&
                                     Catch::Matchers::Contains("expected [64, 64]"));
  }

  SECTION("a missing tensor is named by its upstream name") {
    const std::string name = "decoder.up_blocks.1.resnets.0.conv_shortcut.bias";
    const std::string path = write_variant("missing.st", [&](TensorList& tensors) {
      std::erase_if(tensors, [&](const auto& entry) { return entry.first == name; });
    });
    const infill::Status status = load_status(path, prefix);
    REQUIRE_FALSE(status.ok());
    CHECK(status.code() == infill::ErrorCode::kNotFound);
    CHECK_THAT(status.message(),
               Catch::Matchers::Contains("'decoder.up.0.block.0.nin_shortcut.bias'"));
  }

  SECTION("a NaN names the stored tensor") {
    const std::string name = "decoder.up_blocks.1.resnets.1.conv2.weight";
    const std::string path = write_variant("nan.st", [&](TensorList& tensors) {
      find(tensors, name).view(-1)[3].fill_(std::numeric_limits<float>::quiet_NaN());
    });
    const infill::Status status = load_status(path, prefix);
    REQUIRE_FALSE(status.ok());
    CHECK(status.code() == infill::ErrorCode::kCorruptData);
    CHECK_THAT(status.message(), Catch::Matchers::Contains(prefix + name));
  }
}

// Last in the file: it ends the process with the skip code when ../shared is absent.
TEST_CASE("FLUX.2 autoencoder matches the upstream reference tensors", "[flux2_ae][shared]") {
  require_reference_or_skip();
  auto ref = infill::SafetensorsFile::open(kReferencePath);
  REQUIRE(ref.ok());
  auto ae = Flux2Autoencoder::load(*ref, "weights.");
  if (!ae.ok()) FAIL(ae.status().to_string());
  // The file's __metadata__ "config": ch 32, ch_mult [1, 1, 2, 2], one res block, z 32.
  CHECK(ae->config().ch == 32);
  CHECK(ae->config().ch_mult == std::vector<int>{1, 1, 2, 2});
  CHECK(ae->config().num_res_blocks == 1);
  CHECK(ae->config().z_channels == 32);
  CHECK(ae->config().in_channels == 3);
  CHECK(ae->config().out_channels == 3);
  CHECK(ae->factor() == 16);
  CHECK(ae->latent_channels() == 128);

  auto image = infill::load_float_tensor(*ref, "input.image", {3, 48, 32});
  auto latent_ref = infill::load_float_tensor(*ref, "output.latent", {128, 3, 2});
  auto decoded_ref = infill::load_float_tensor(*ref, "output.decoded", {3, 48, 32});
  REQUIRE(image.ok());
  REQUIRE(latent_ref.ok());
  REQUIRE(decoded_ref.ok());

  const at::Tensor latent = ae->encode_normalized(image->unsqueeze(0));
  REQUIRE(latent.sizes() == at::IntArrayRef({1, 128, 3, 2}));
  const double latent_ratio = relative_max_diff(latent[0], *latent_ref);

  const at::Tensor decoded = ae->decode_normalized(latent_ref->unsqueeze(0));
  REQUIRE(decoded.sizes() == at::IntArrayRef({1, 3, 48, 32}));
  const double decoded_ratio = relative_max_diff(decoded[0], *decoded_ref);

  INFO("max|diff| / max|ref|: latent " << latent_ratio << ", decoded " << decoded_ratio);
  WARN("FLUX.2 autoencoder vs upstream reference, max|diff| / max|ref|: latent "
       << latent_ratio << ", decoded " << decoded_ratio);
  CHECK(latent_ratio <= 1e-4);
  CHECK(decoded_ratio <= 1e-4);

  // The LatentCodec face is the same network on [0, 1] pixels.
  const at::Tensor via_codec = ae->encode((image->unsqueeze(0) + 1) / 2);
  CHECK(relative_max_diff(via_codec[0], *latent_ref) <= 1e-4);
}

TEST_CASE("FLUX.2 autoencoder under diffusers names matches the upstream reference tensors",
          "[flux2_ae][shared]") {
  require_reference_or_skip();
  auto ref = infill::SafetensorsFile::open(kReferencePath);
  REQUIRE(ref.ok());
  const std::string prefix = "weights.";
  TensorList upstream;
  for (const infill::TensorInfo& info : ref->tensors()) {
    if (!info.name.starts_with(prefix)) continue;
    auto t = infill::load_float_tensor(*ref, info.name);
    REQUIRE(t.ok());
    upstream.emplace_back(info.name.substr(prefix.size()), *t);
  }
  // The file's config has ch_mult [1, 1, 2, 2]: four down and four up blocks.
  const TensorList diffusers = to_diffusers(upstream, 4);
  REQUIRE(diffusers.size() == upstream.size());
  TempDir dir;
  const std::string path = dir.file("diffusion_pytorch_model.safetensors");
  REQUIRE(infill::write_safetensors(path, diffusers).ok());
  auto ae = Flux2Autoencoder::load(path);
  if (!ae.ok()) FAIL(ae.status().to_string());
  CHECK(ae->config().ch_mult == std::vector<int>{1, 1, 2, 2});
  CHECK(ae->config().z_channels == 32);

  auto image = infill::load_float_tensor(*ref, "input.image", {3, 48, 32});
  auto latent_ref = infill::load_float_tensor(*ref, "output.latent", {128, 3, 2});
  auto decoded_ref = infill::load_float_tensor(*ref, "output.decoded", {3, 48, 32});
  REQUIRE(image.ok());
  REQUIRE(latent_ref.ok());
  REQUIRE(decoded_ref.ok());
  const at::Tensor latent = ae->encode_normalized(image->unsqueeze(0));
  REQUIRE(latent.sizes() == at::IntArrayRef({1, 128, 3, 2}));
  const double latent_ratio = relative_max_diff(latent[0], *latent_ref);
  const at::Tensor decoded = ae->decode_normalized(latent_ref->unsqueeze(0));
  REQUIRE(decoded.sizes() == at::IntArrayRef({1, 3, 48, 32}));
  const double decoded_ratio = relative_max_diff(decoded[0], *decoded_ref);
  WARN("FLUX.2 autoencoder (diffusers names) vs upstream reference, max|diff| / max|ref|: latent "
       << latent_ratio << ", decoded " << decoded_ratio);
  CHECK(latent_ratio <= 1e-4);
  CHECK(decoded_ratio <= 1e-4);
}

namespace {

// A small random VAE of the FLUX.2 layout and an image for it.
Flux2Autoencoder small_random_autoencoder() {
  infill::Flux2AutoencoderConfig config;
  config.ch = 32;
  config.ch_mult = {1, 2};
  config.num_res_blocks = 1;
  config.z_channels = 4;
  return Flux2Autoencoder::random(config, 9);
}

}  // namespace

TEST_CASE("FLUX.2 autoencoder: a copy made for a device holds every weight by name and computes the same",
          "[flux2_ae]") {
  const Flux2Autoencoder ae = small_random_autoencoder();
  auto copy = ae.on_device(infill::ComputeDevice{});  // the CPU: the same weights, moved by name
  REQUIRE(copy.ok());
  CHECK(copy->device().is_cpu());
  const at::Tensor rgb = at::rand({1, 3, 16, 24});
  const at::Tensor latent = ae.encode(rgb);
  CHECK(at::equal(copy->encode(rgb), latent));
  CHECK(at::equal(copy->decode(latent), ae.decode(latent)));
  CHECK(at::equal(copy->decode_crop(latent, 1, 0, 1, 1, 1), ae.decode_crop(latent, 1, 0, 1, 1, 1)));
  TempDir dir;
  REQUIRE(copy->save(dir.file("copy.safetensors")).ok());
  auto reloaded = Flux2Autoencoder::load(dir.file("copy.safetensors"));
  REQUIRE(reloaded.ok());
  CHECK(at::equal(reloaded->decode(latent), ae.decode(latent)));
}

TEST_CASE("FLUX.2 autoencoder on CUDA encodes and decodes as on the CPU, inputs and results on the CPU",
          "[flux2_ae][cuda]") {
  const infill::ComputeDevice cuda{true, 0};
  if (const infill::Status usable = infill::check_compute_device(cuda); !usable.ok()) {
    WARN("SKIPPED: no CUDA device: " + usable.message());
    std::exit(4);
  }
  const Flux2Autoencoder ae = small_random_autoencoder();
  auto gpu = ae.on_device(cuda);
  REQUIRE(gpu.ok());
  CHECK(gpu->device().is_cuda());
  const at::Tensor rgb = at::rand({1, 3, 16, 24});
  const at::Tensor latent = ae.encode(rgb), on_gpu = gpu->encode(rgb);
  CHECK(on_gpu.device().is_cpu());
  // float32 on both, but cuDNN's convolutions may run in TF32 (libtorch allows it for them by
  // default): the tolerance is TF32's 10-bit mantissa over a few layers.
  CHECK((on_gpu - latent).abs().max().item<double>() <= 2e-2 * (1 + latent.abs().max().item<double>()));
  const at::Tensor pixels = gpu->decode_crop(latent, 1, 0, 1, 1, 1);
  CHECK(pixels.device().is_cpu());
  CHECK((pixels - ae.decode_crop(latent, 1, 0, 1, 1, 1)).abs().max().item<double>() <= 2e-2);
  // Inputs already on the device stay there.
  CHECK(gpu->decode(latent.to(gpu->device())).device().is_cuda());
}
