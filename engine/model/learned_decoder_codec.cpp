#include "model/learned_decoder_codec.h"

#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/InferenceMode.h>

#include "common/shape_text.h"
#include "model/safetensors.h"
#include "model/safetensors_torch.h"

namespace infill {
namespace {

constexpr const char* kDecoderPrefix = "decoder.";

/// What a conv does in the forward pass.
enum class Role { kIn, kUp, kBlock0, kBlock1, kOut };

struct ConvSpec {
  std::string name;  // weight key without "decoder." and without ".weight" / ".bias"
  Role role;
  int64_t in = 0, out = 0;
};

int levels_for(int pca_factor) {
  int levels = 1;
  for (int f = pca_factor; f > 1; f /= 2) ++levels;
  return levels;
}

/// The decoder's convs in file and forward order. The one place that knows the key names.
std::vector<ConvSpec> decoder_layout(const LearnedDecoderConfig& c) {
  std::vector<ConvSpec> convs = {{"conv_in", Role::kIn, c.pca_channels, c.widths[0]}};
  for (size_t k = 0; k < c.widths.size(); ++k) {
    const std::string level = "levels." + std::to_string(k) + ".";
    const int64_t w = c.widths[k];
    if (k > 0) convs.push_back({level + "up", Role::kUp, c.widths[k - 1], w});
    for (int j = 0; j < c.blocks[k]; ++j) {
      const std::string block = level + "blocks." + std::to_string(j) + ".";
      convs.push_back({block + "conv0", Role::kBlock0, w, w});
      convs.push_back({block + "conv1", Role::kBlock1, w, w});
    }
  }
  convs.push_back({"conv_out", Role::kOut, c.widths.back(), 3});
  return convs;
}

std::string describe(const LearnedDecoderConfig& c) {
  std::ostringstream s;
  s << "a learned decoder with pca_factor=" << c.pca_factor << ", pca_channels=" << c.pca_channels
    << ", widths=[";
  for (size_t k = 0; k < c.widths.size(); ++k) s << (k ? ", " : "") << c.widths[k];
  s << "], blocks=[";
  for (size_t k = 0; k < c.blocks.size(); ++k) s << (k ? ", " : "") << c.blocks[k];
  s << "]";
  return s.str();
}

// Channels-last activations and weights take oneDNN's fast convolution path on CPU (see
// autoencoder.cpp; measured again for these widths by bench_codec).
at::Tensor compute_layout(const at::Tensor& t) {
  return t.dim() == 4 ? t.contiguous(at::MemoryFormat::ChannelsLast) : t;
}

at::Tensor conv3x3(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  return at::conv2d(x, weight, bias, {1, 1}, {1, 1});
}

void check_latent(const at::Tensor& x, int64_t channels) {
  TORCH_CHECK(x.defined() && x.dim() == 4 && x.size(1) == channels,
              "learned decoder codec: latent is ", x.defined() ? x.sizes() : at::IntArrayRef{},
              ", expected [B, ", channels, ", h, w]");
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.device().is_cpu(),
              "learned decoder codec: latent is ", x.scalar_type(), " on ", x.device(),
              ", expected float32 on CPU");
}

Result<double> metadata_number(const SafetensorsFile& file, const std::string& key,
                               std::optional<double> fallback) {
  const auto it = file.metadata().find(key);
  if (it == file.metadata().end()) {
    if (fallback) return *fallback;
    return invalid_argument(file.path() + ": metadata \"" + key + "\" is missing");
  }
  try {
    size_t used = 0;
    const double v = std::stod(it->second, &used);
    if (used != it->second.size() || !std::isfinite(v)) throw std::invalid_argument(key);
    return v;
  } catch (const std::exception&) {
    return invalid_argument(file.path() + ": metadata " + key + " \"" + it->second +
                            "\" is not a finite number");
  }
}

std::string number_text(double v) {
  std::ostringstream s;
  s.precision(17);
  s << v;
  return s.str();
}

}  // namespace

at::Tensor patchify_2x2(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 4 && x.size(2) % 2 == 0 && x.size(3) % 2 == 0, "patchify_2x2: input is ",
              x.sizes(), ", expected [B, C, H, W] with H and W even");
  const int64_t b = x.size(0), c = x.size(1), h = x.size(2) / 2, w = x.size(3) / 2;
  // [B, C, h, 2, w, 2] -> [B, C, 2, 2, h, w]: channel c*4 + dy*2 + dx.
  return x.reshape({b, c, h, 2, w, 2}).permute({0, 1, 3, 5, 2, 4}).reshape({b, c * 4, h, w});
}

at::Tensor unpatchify_2x2(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 4 && x.size(1) % 4 == 0, "unpatchify_2x2: input is ", x.sizes(),
              ", expected [B, 4C, h, w]");
  const int64_t b = x.size(0), c = x.size(1) / 4, h = x.size(2), w = x.size(3);
  return x.reshape({b, c, 2, 2, h, w}).permute({0, 1, 4, 2, 5, 3}).reshape({b, c, h * 2, w * 2});
}

Status LearnedDecoderConfig::validate() const {
  const auto fail = [&](const std::string& why) {
    return invalid_argument("learned decoder config (" + describe(*this) + "): " + why);
  };
  if (pca_factor != 2 && pca_factor != 4 && pca_factor != 8 && pca_factor != 16) {
    return fail("pca_factor must be 2, 4, 8 or 16");
  }
  if (pca_channels < 1 || pca_channels > 3 * pca_factor * pca_factor) {
    return fail("pca_channels must be in [1, 3 * pca_factor^2]");
  }
  const size_t levels = static_cast<size_t>(levels_for(pca_factor));
  if (widths.size() != levels || blocks.size() != levels) {
    return fail("widths and blocks need " + std::to_string(levels) +
                " entries (log2(pca_factor) + 1)");
  }
  for (size_t k = 0; k < levels; ++k) {
    if (widths[k] < 1) return fail("widths[" + std::to_string(k) + "] must be positive");
    if (blocks[k] < 0) return fail("blocks[" + std::to_string(k) + "] must not be negative");
  }
  return {};
}

int LearnedDecoderConfig::context_margin() const {
  // Walks back from one output pixel: r is the radius (in pixels of the current level) of the
  // inputs it depends on. A 3x3 conv adds 1; a nearest x2 upsample (and the unpatchify, which
  // acts like one) maps radius r to ceil(r / 2) at the coarser level.
  int r = 1;  // conv_out
  for (size_t k = widths.size(); k-- > 0;) {
    r += 2 * blocks[k];
    if (k > 0) r = (r + 1 + 1) / 2;  // the up conv, then the upsample
  }
  r += 1;              // conv_in
  return (r + 1) / 2;  // unpatchify: PCA latent pixels -> codec latent pixels
}

Result<LearnedDecoderCodec> LearnedDecoderCodec::build(
    const PatchPcaCodec& pca, double scale, double shift,
    const std::vector<std::pair<std::string, at::Tensor>>& decoder, const std::string& what) {
  if (!(scale > 0.0) || !std::isfinite(scale) || !std::isfinite(shift)) {
    return invalid_argument(what + ": latent scale " + number_text(scale) + " and shift " +
                            number_text(shift) + " must be finite with scale > 0");
  }
  std::map<std::string, at::Tensor> named(decoder.begin(), decoder.end());
  const auto shape_of = [&](const std::string& key) -> std::vector<int64_t> {
    const auto it = named.find(key);
    return it == named.end() ? std::vector<int64_t>{} : it->second.sizes().vec();
  };
  // The config is read off the shapes that fix it; every other shape is then checked.
  LearnedDecoderConfig config;
  config.pca_factor = pca.factor();
  config.pca_channels = pca.latent_channels();
  const int levels = levels_for(config.pca_factor);
  config.widths.assign(static_cast<size_t>(levels), 0);
  config.blocks.assign(static_cast<size_t>(levels), 0);
  for (int k = 0; k < levels; ++k) {
    const std::string key =
        k == 0 ? "conv_in.weight" : "levels." + std::to_string(k) + ".up.weight";
    const std::vector<int64_t> shape = shape_of(key);
    if (shape.empty()) {
      return not_found(what + ": no tensor '" + kDecoderPrefix + key + "' (a PCA with factor " +
                       std::to_string(config.pca_factor) + " needs " + std::to_string(levels) +
                       " decoder levels)");
    }
    if (shape.size() != 4) {
      return invalid_argument(what + ": " + kDecoderPrefix + key + " is " + shape_text(shape) +
                              ", expected [width, in, 3, 3]");
    }
    config.widths[static_cast<size_t>(k)] = static_cast<int>(shape[0]);
    const std::string block_prefix = "levels." + std::to_string(k) + ".blocks.";
    while (named.count(block_prefix + std::to_string(config.blocks[static_cast<size_t>(k)]) +
                       ".conv0.weight")) {
      ++config.blocks[static_cast<size_t>(k)];
    }
  }
  INFILL_RETURN_IF_ERROR(config.validate());

  LearnedDecoderCodec codec(pca);
  codec.config_ = config;
  codec.scale_ = scale;
  codec.shift_ = shift;
  c10::InferenceMode guard;
  std::set<std::string> expected;
  for (const ConvSpec& spec : decoder_layout(config)) {
    Conv conv;
    for (const bool is_bias : {false, true}) {
      const std::string key = spec.name + (is_bias ? ".bias" : ".weight");
      const std::vector<int64_t> want =
          is_bias ? std::vector<int64_t>{spec.out} : std::vector<int64_t>{spec.out, spec.in, 3, 3};
      expected.insert(key);
      const auto it = named.find(key);
      if (it == named.end())
        return not_found(what + ": no tensor '" + kDecoderPrefix + key + "' (" + describe(config) +
                         ")");
      if (it->second.sizes().vec() != want) {
        return invalid_argument(what + ": " + kDecoderPrefix + key + " is " +
                                shape_text(it->second.sizes().vec()) + ", expected " +
                                shape_text(want) + " (" + describe(config) + ")");
      }
      at::Tensor t = it->second.detach().to(at::kFloat).cpu();
      if (!at::isfinite(t).all().item<bool>()) {
        return corrupt_data(what + ": " + kDecoderPrefix + key + " holds NaN or infinite values");
      }
      (is_bias ? conv.bias : conv.weight) = compute_layout(t.clone());
    }
    codec.convs_.push_back(std::move(conv));
  }
  for (const auto& [key, tensor] : named) {
    if (expected.count(key) == 0) {
      return invalid_argument(what + ": unexpected tensor '" + kDecoderPrefix + key + "' for " +
                              describe(config));
    }
  }
  return codec;
}

Result<LearnedDecoderCodec> LearnedDecoderCodec::from_parts(
    const PatchPcaCodec& pca, double scale, double shift,
    const std::vector<std::pair<std::string, at::Tensor>>& decoder, const std::string& what) {
  return build(pca, scale, shift, decoder, what);
}

Result<LearnedDecoderCodec> LearnedDecoderCodec::load(const std::string& path) {
  INFILL_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(path));
  INFILL_ASSIGN_OR_RETURN(const double scale, metadata_number(file, "scale", std::nullopt));
  INFILL_ASSIGN_OR_RETURN(const double shift, metadata_number(file, "shift", 0.0));
  c10::InferenceMode guard;
  const TensorInfo* mean_info = file.find("pca.mean");
  if (mean_info == nullptr) return not_found(path + ": no tensor 'pca.mean'");
  if (mean_info->shape.size() != 1) {
    return invalid_argument(path + ": pca.mean is " + shape_text(mean_info->shape) +
                            ", expected [3 f f]");
  }
  int factor = 0;
  for (int f : {2, 4, 8, 16}) {
    if (mean_info->shape[0] == 3LL * f * f) factor = f;
  }
  if (factor == 0) {
    return invalid_argument(path + ": pca.mean is " + shape_text(mean_info->shape) +
                            ", expected [3 f f] with f in {2, 4, 8, 16}");
  }
  INFILL_ASSIGN_OR_RETURN(at::Tensor mean, load_float_tensor(file, "pca.mean"));
  INFILL_ASSIGN_OR_RETURN(at::Tensor basis, load_float_tensor(file, "pca.basis"));
  auto pca = PatchPcaCodec::from_tensors(factor, mean, basis);
  if (!pca.ok()) {
    return Status(pca.status().code(), path + ": pca.basis " + shape_text(basis.sizes().vec()) +
                                           ": " + pca.status().message());
  }
  std::vector<std::pair<std::string, at::Tensor>> decoder;
  for (const TensorInfo& info : file.tensors()) {
    if (info.name == "pca.mean" || info.name == "pca.basis") continue;
    if (!info.name.starts_with(kDecoderPrefix)) {
      return invalid_argument(path + ": unexpected tensor '" + info.name +
                              "' (expected pca.mean, pca.basis and decoder.* tensors)");
    }
    INFILL_ASSIGN_OR_RETURN(at::Tensor t, load_float_tensor(file, info.name));
    decoder.emplace_back(info.name.substr(std::string(kDecoderPrefix).size()), std::move(t));
  }
  return build(*pca, scale, shift, decoder, path);
}

LearnedDecoderCodec LearnedDecoderCodec::random(const LearnedDecoderConfig& config, uint64_t seed) {
  const Status valid = config.validate();
  TORCH_CHECK(valid.ok(), valid.message());
  c10::InferenceMode guard;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const int64_t dim = 3LL * config.pca_factor * config.pca_factor;
  // Orthonormal rows from the QR decomposition of a Gaussian matrix.
  const at::Tensor q = std::get<0>(at::linalg_qr(at::randn({dim, config.pca_channels}, gen)));
  const at::Tensor mean = at::rand({dim}, gen) * 0.5 + 0.25;
  auto pca = PatchPcaCodec::from_tensors(config.pca_factor, mean, q.t().contiguous());
  TORCH_CHECK(pca.ok(), pca.status().message());
  std::vector<std::pair<std::string, at::Tensor>> decoder;
  for (const ConvSpec& spec : decoder_layout(config)) {
    // PyTorch's default conv init: weight and bias uniform in +-1/sqrt(fan_in).
    const double bound = 1.0 / std::sqrt(static_cast<double>(spec.in * 9));
    const auto draw = [&](at::IntArrayRef shape) {
      return ((at::rand(shape, gen) * 2 - 1) * bound).to(at::kHalf);
    };
    decoder.emplace_back(spec.name + ".weight", draw({spec.out, spec.in, 3, 3}));
    decoder.emplace_back(spec.name + ".bias", draw({spec.out}));
  }
  auto codec = build(*pca, 1.0, 0.0, decoder, "random learned decoder codec");
  TORCH_CHECK(codec.ok(), codec.status().message());
  return std::move(codec).value();
}

std::vector<std::pair<std::string, at::Tensor>> LearnedDecoderCodec::decoder_weights() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  const std::vector<ConvSpec> specs = decoder_layout(config_);
  for (size_t i = 0; i < specs.size(); ++i) {
    out.emplace_back(specs[i].name + ".weight", convs_[i].weight.contiguous());
    out.emplace_back(specs[i].name + ".bias", convs_[i].bias);
  }
  return out;
}

Status LearnedDecoderCodec::save(const std::string& path) const {
  c10::InferenceMode guard;
  std::vector<std::pair<std::string, at::Tensor>> tensors = {{"pca.mean", pca_.mean()},
                                                             {"pca.basis", pca_.basis()}};
  for (const auto& [key, t] : decoder_weights()) {
    if (t.abs().max().item<float>() > 65504.0f) {
      return invalid_argument(path + ": weight '" + kDecoderPrefix + key +
                              "' exceeds the fp16 range");
    }
    tensors.emplace_back(kDecoderPrefix + key, t.to(at::kHalf));
  }
  return write_safetensors(path, tensors,
                           {{"scale", number_text(scale_)},
                            {"shift", number_text(shift_)},
                            {"arch", describe(config_)}});
}

at::Tensor LearnedDecoderCodec::run_decoder(const at::Tensor& z) const {
  at::Tensor x = compute_layout(z), skip;
  const std::vector<ConvSpec> specs = decoder_layout(config_);
  for (size_t i = 0; i < specs.size(); ++i) {
    const Conv& c = convs_[i];
    switch (specs[i].role) {
      case Role::kIn:
        x = conv3x3(x, c.weight, c.bias).relu_();
        break;
      case Role::kUp:
        x = at::upsample_nearest2d(x, {2 * x.size(2), 2 * x.size(3)});
        x = conv3x3(x, c.weight, c.bias).relu_();
        break;
      case Role::kBlock0:
        skip = x;
        x = conv3x3(x, c.weight, c.bias).relu_();
        break;
      case Role::kBlock1:
        x = conv3x3(x, c.weight, c.bias).add_(skip).relu_();
        break;
      case Role::kOut:
        x = conv3x3(x, c.weight, c.bias);
        break;
    }
  }
  return x;
}

at::Tensor LearnedDecoderCodec::encode(const at::Tensor& rgb) const {
  const int f = factor();
  TORCH_CHECK(rgb.defined() && rgb.dim() == 4 && rgb.size(1) == 3 && rgb.size(2) % f == 0 &&
                  rgb.size(3) % f == 0,
              "learned decoder codec: image is ", rgb.defined() ? rgb.sizes() : at::IntArrayRef{},
              ", expected [B, 3, H, W] with H and W multiples of ", f);
  at::Tensor out;
  {
    c10::InferenceMode guard;
    out = patchify_2x2((pca_.encode(rgb) - shift_) * scale_);
  }
  // A clone made outside InferenceMode is an ordinary tensor, which callers may modify in place.
  return out.clone(at::MemoryFormat::Contiguous);
}

at::Tensor LearnedDecoderCodec::decode(const at::Tensor& latent) const {
  check_latent(latent, latent_channels());
  at::Tensor out;
  {
    c10::InferenceMode guard;
    out = run_decoder(unpatchify_2x2(latent)).clamp_(0, 1);
  }
  return out.clone(at::MemoryFormat::Contiguous);
}

at::Tensor LearnedDecoderCodec::decode_pca(const at::Tensor& latent) const {
  check_latent(latent, latent_channels());
  at::Tensor out;
  {
    c10::InferenceMode guard;
    out = pca_.decode(unpatchify_2x2(latent) / scale_ + shift_);
  }
  return out.clone(at::MemoryFormat::Contiguous);
}

at::Tensor LearnedDecoderCodec::decode_crop(const at::Tensor& latent, int x0, int y0, int w, int h,
                                            int margin) const {
  check_latent(latent, latent_channels());
  const auto [cx0, cy0, cx1, cy1] =
      latent_context_box(latent, x0, y0, w, h, margin, "learned decoder codec");
  const int64_t f = factor();
  at::Tensor out;
  {
    c10::InferenceMode guard;
    const at::Tensor context = latent.slice(2, cy0, cy1).slice(3, cx0, cx1);
    const at::Tensor pixels = run_decoder(unpatchify_2x2(context));
    out = pixels.slice(2, (y0 - cy0) * f, (y0 - cy0 + h) * f)
              .slice(3, (x0 - cx0) * f, (x0 - cx0 + w) * f)
              .clamp(0, 1);
  }
  return out.clone(at::MemoryFormat::Contiguous);
}

}  // namespace infill
