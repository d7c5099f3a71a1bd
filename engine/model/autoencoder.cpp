#include "model/autoencoder.h"

#include <algorithm>
#include <cmath>
#include <set>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/InferenceMode.h>

#include "model/safetensors.h"
#include "model/safetensors_torch.h"

namespace infill {
namespace {

using Layer = detail::AutoencoderLayer;
using Kind = Layer::Kind;

constexpr int kContextGroups = 4;     // GroupNorm groups in the context branch
constexpr int kContextExpansion = 4;  // hidden channels of the context branch / width
constexpr double kGroupNormEps = 1e-5;

/// What one `nn.Sequential` entry is, before it has weights.
struct LayerSpec {
  Kind kind;
  int in = 0;
  int out = 0;
  int stride = 1;
  bool bias = true;
  bool context = false;
};

LayerSpec conv_spec(int in, int out, int stride, bool bias) {
  return {Kind::kConv, in, out, stride, bias, false};
}
LayerSpec block_spec(bool context) { return {Kind::kBlock, 0, 0, 1, true, context}; }

std::vector<LayerSpec> encoder_layout(const AutoencoderConfig& c) {
  std::vector<LayerSpec> layers = {conv_spec(3, c.width, 1, true), block_spec(false)};
  for (int stage = 0; stage < 3; ++stage) {
    layers.push_back(conv_spec(c.width, c.width, 2, false));
    // Only the last stage runs at latent resolution, where the context branch lives.
    for (int i = 0; i < 3; ++i) layers.push_back(block_spec(stage == 2 && c.context_blocks));
  }
  layers.push_back(conv_spec(c.width, c.latent_channels, 1, true));
  return layers;
}

std::vector<LayerSpec> decoder_layout(const AutoencoderConfig& c) {
  std::vector<LayerSpec> layers = {
      {Kind::kClamp}, conv_spec(c.latent_channels, c.width, 1, true), {Kind::kRelu}};
  for (int i = 0; i < 3; ++i) layers.push_back(block_spec(c.context_blocks));
  for (int blocks : {3, 3, 1}) {
    layers.push_back({Kind::kUpsample});
    layers.push_back(conv_spec(c.width, c.width, 1, false));
    for (int i = 0; i < blocks; ++i) layers.push_back(block_spec(false));
  }
  layers.push_back(conv_spec(c.width, 3, 1, true));
  return layers;
}

/// Calls fn(key, tensor member, expected shape) for every weight of `layer` (index `index`),
/// in the original key order. `L` is Layer or const Layer. The one place that knows key names.
template <class L, class Fn>
void visit_weights(const LayerSpec& spec, L& layer, size_t index, int width, Fn&& fn) {
  const std::string prefix = std::to_string(index) + ".";
  const int64_t w = width;
  if (spec.kind == Kind::kConv) {
    fn(prefix + "weight", layer.weight, std::vector<int64_t>{spec.out, spec.in, 3, 3});
    if (spec.bias) fn(prefix + "bias", layer.bias, std::vector<int64_t>{spec.out});
  } else if (spec.kind == Kind::kBlock) {
    fn(prefix + "conv.0.weight", layer.conv0_weight, std::vector<int64_t>{w, w, 3, 3});
    fn(prefix + "conv.0.bias", layer.conv0_bias, std::vector<int64_t>{w});
    fn(prefix + "conv.2.weight", layer.conv2_weight, std::vector<int64_t>{w, w, 3, 3});
    fn(prefix + "conv.2.bias", layer.conv2_bias, std::vector<int64_t>{w});
    fn(prefix + "conv.4.weight", layer.conv4_weight, std::vector<int64_t>{w, w, 3, 3});
    fn(prefix + "conv.4.bias", layer.conv4_bias, std::vector<int64_t>{w});
    if (spec.context) {
      const int64_t hidden = kContextExpansion * w;
      fn(prefix + "pool.0.weight", layer.pool0_weight, std::vector<int64_t>{hidden, w, 1, 1});
      fn(prefix + "pool.1.weight", layer.pool1_weight, std::vector<int64_t>{hidden});
      fn(prefix + "pool.1.bias", layer.pool1_bias, std::vector<int64_t>{hidden});
      fn(prefix + "pool.3.weight", layer.pool3_weight, std::vector<int64_t>{w, hidden, 1, 1});
    }
  }
}

// Channels-last activations and weights take oneDNN's fast convolution path on CPU (about
// 1.6-2x less CPU time than NCHW for these 64-channel 3x3 convs, measured on 1.13).
at::Tensor compute_layout(at::Tensor t) {
  return t.dim() == 4 ? t.contiguous(at::MemoryFormat::ChannelsLast) : t;
}

std::vector<Layer> make_layers(const std::vector<LayerSpec>& specs) {
  std::vector<Layer> layers(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    layers[i].kind = specs[i].kind;
    layers[i].stride = specs[i].stride;
  }
  return layers;
}

Result<std::vector<Layer>> load_half(const SafetensorsFile& file,
                                     const std::vector<LayerSpec>& specs, int width,
                                     const std::string& what) {
  std::vector<Layer> layers = make_layers(specs);
  std::set<std::string> expected;
  Status status;
  for (size_t i = 0; i < specs.size() && status.ok(); ++i) {
    visit_weights(
        specs[i], layers[i], i, width,
        [&](const std::string& key, at::Tensor& member, const std::vector<int64_t>& shape) {
          expected.insert(key);
          if (!status.ok()) return;
          auto t = load_float_tensor(file, key, shape);
          if (!t.ok()) {
            status = Status(t.status().code(), t.status().message() + " (" + what + ")");
            return;
          }
          member = compute_layout(std::move(t).value());
        });
  }
  INFILL_RETURN_IF_ERROR(status);
  for (const TensorInfo& info : file.tensors()) {
    if (expected.count(info.name) == 0) {
      return invalid_argument(file.path() + ": unexpected tensor '" + info.name + "' for " + what);
    }
  }
  return layers;
}

std::string describe(const AutoencoderConfig& c, const char* half) {
  return std::string("a TAESD ") + half +
         " with latent_channels=" + std::to_string(c.latent_channels) +
         ", width=" + std::to_string(c.width) +
         ", context_blocks=" + (c.context_blocks ? "true" : "false");
}

at::Tensor conv(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                int64_t stride) {
  const int64_t pad = weight.size(2) / 2;
  return at::conv2d(x, weight, bias, {stride, stride}, {pad, pad});
}

at::Tensor block(at::Tensor x, const Layer& l) {
  if (l.pool0_weight.defined()) {
    at::Tensor h = at::conv2d(x, l.pool0_weight);
    h = at::relu(at::group_norm(h, kContextGroups, l.pool1_weight, l.pool1_bias, kGroupNormEps));
    x = x + at::conv2d(h, l.pool3_weight);
  }
  at::Tensor y = at::relu(conv(x, l.conv0_weight, l.conv0_bias, 1));
  y = at::relu(conv(y, l.conv2_weight, l.conv2_bias, 1));
  y = conv(y, l.conv4_weight, l.conv4_bias, 1);
  return at::relu(y + x);
}

// Runs layers [begin, end) of `net`.
at::Tensor run(const std::vector<Layer>& net, at::Tensor x, size_t begin, size_t end) {
  x = compute_layout(x);
  for (size_t i = begin; i < end; ++i) {
    const Layer& l = net[i];
    switch (l.kind) {
      case Kind::kConv:
        x = conv(x, l.weight, l.bias, l.stride);
        break;
      case Kind::kBlock:
        x = block(x, l);
        break;
      case Kind::kUpsample:
        x = at::upsample_nearest2d(x, {2 * x.size(2), 2 * x.size(3)});
        break;
      case Kind::kRelu:
        x = at::relu(x);
        break;
      case Kind::kClamp:
        x = at::tanh(x / 3) * 3;
        break;
    }
  }
  return x;
}

void check_input(const at::Tensor& x, int64_t channels, const char* what, const char* expected) {
  TORCH_CHECK(x.defined() && x.dim() == 4 && x.size(1) == channels, "autoencoder: ", what, " is ",
              x.defined() ? x.sizes() : at::IntArrayRef{}, ", expected ", expected);
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.device().is_cpu(), "autoencoder: ", what, " is ",
              x.scalar_type(), " on ", x.device(), ", expected float32 on CPU");
}

}  // namespace

Status AutoencoderConfig::validate() const {
  if (latent_channels <= 0 || width <= 0 || width % kContextGroups != 0) {
    return invalid_argument(
        "autoencoder config: latent_channels=" + std::to_string(latent_channels) +
        ", width=" + std::to_string(width) + "; expected both positive and width a multiple of " +
        std::to_string(kContextGroups));
  }
  return {};
}

Result<Autoencoder> Autoencoder::load(const std::string& encoder_path,
                                      const std::string& decoder_path) {
  // The config is read off the shapes that fix it; every other shape is then checked.
  INFILL_ASSIGN_OR_RETURN(SafetensorsFile enc, SafetensorsFile::open(encoder_path));
  INFILL_ASSIGN_OR_RETURN(SafetensorsFile dec, SafetensorsFile::open(decoder_path));
  AutoencoderConfig config;
  const TensorInfo* first = enc.find("0.weight");
  const TensorInfo* last = enc.find("14.weight");
  if (first == nullptr || last == nullptr || first->shape.size() != 4 || last->shape.size() != 4) {
    return invalid_argument(encoder_path +
                            ": not a TAESD encoder (expected 4-d tensors '0.weight' and "
                            "'14.weight')");
  }
  config.width = static_cast<int>(first->shape[0]);
  config.latent_channels = static_cast<int>(last->shape[0]);
  config.context_blocks = enc.find("11.pool.0.weight") != nullptr;
  const bool decoder_context = dec.find("3.pool.0.weight") != nullptr;
  if (decoder_context != config.context_blocks) {
    return invalid_argument(decoder_path + ": decoder " + (decoder_context ? "has" : "lacks") +
                            " the context blocks ('3.pool.*') but encoder " + encoder_path +
                            (config.context_blocks ? " has" : " lacks") + " them");
  }
  INFILL_RETURN_IF_ERROR(config.validate());
  Autoencoder ae;
  ae.config_ = config;
  INFILL_ASSIGN_OR_RETURN(ae.encoder_, load_half(enc, encoder_layout(config), config.width,
                                                 describe(config, "encoder")));
  INFILL_ASSIGN_OR_RETURN(ae.decoder_, load_half(dec, decoder_layout(config), config.width,
                                                 describe(config, "decoder")));
  return ae;
}

Autoencoder Autoencoder::random(const AutoencoderConfig& config, uint64_t seed) {
  const Status valid = config.validate();
  TORCH_CHECK(valid.ok(), valid.message());
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  Autoencoder ae;
  ae.config_ = config;
  const auto fill = [&](const std::vector<LayerSpec>& specs) {
    std::vector<Layer> layers = make_layers(specs);
    for (size_t i = 0; i < specs.size(); ++i) {
      // PyTorch's default conv init: weight and bias uniform in +-1/sqrt(fan_in).
      const int64_t fan_in = specs[i].kind == Kind::kConv ? specs[i].in * 9 : config.width * 9;
      visit_weights(
          specs[i], layers[i], i, config.width,
          [&](const std::string& key, at::Tensor& member, const std::vector<int64_t>& shape) {
            at::Tensor t;
            if (key.ends_with("pool.1.weight")) {
              t = at::ones(shape);
            } else if (key.ends_with("pool.1.bias")) {
              t = at::zeros(shape);
            } else {
              const int64_t fan = shape.size() == 4 ? shape[1] * shape[2] * shape[3] : fan_in;
              const double bound = 1.0 / std::sqrt(static_cast<double>(fan));
              t = (at::rand(shape, gen) * 2 - 1) * bound;
            }
            member = compute_layout(t.to(at::kHalf).to(at::kFloat));
          });
    }
    return layers;
  };
  ae.encoder_ = fill(encoder_layout(config));
  ae.decoder_ = fill(decoder_layout(config));
  return ae;
}

Status Autoencoder::save(const std::string& encoder_path, const std::string& decoder_path) const {
  const auto write = [&](const std::string& path, const std::vector<LayerSpec>& specs,
                         const std::vector<Layer>& layers, const char* half) -> Status {
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    Status status;
    for (size_t i = 0; i < specs.size(); ++i) {
      visit_weights(
          specs[i], layers[i], i, config_.width,
          [&](const std::string& key, const at::Tensor& member, const std::vector<int64_t>&) {
            if (status.ok() && member.abs().max().item<float>() > 65504.0f) {
              status = invalid_argument(path + ": weight '" + key + "' exceeds the fp16 range");
            }
            tensors.emplace_back(key, member.to(at::kHalf));
          });
    }
    INFILL_RETURN_IF_ERROR(status);
    return write_safetensors(path, tensors, {{"arch", describe(config_, half)}});
  };
  INFILL_RETURN_IF_ERROR(write(encoder_path, encoder_layout(config_), encoder_, "encoder"));
  return write(decoder_path, decoder_layout(config_), decoder_, "decoder");
}

at::Tensor Autoencoder::encode(const at::Tensor& rgb) const {
  check_input(rgb, 3, "encoder input", "[B, 3, H, W]");
  TORCH_CHECK(rgb.size(2) % kFactor == 0 && rgb.size(3) % kFactor == 0,
              "autoencoder: encoder input is ", rgb.sizes(), ", expected H and W multiples of ",
              kFactor);
  at::Tensor out;
  {
    c10::InferenceMode guard;
    out = run(encoder_, rgb, 0, encoder_.size());
  }
  // A clone made outside InferenceMode is an ordinary tensor, which callers may modify in place.
  return out.clone(at::MemoryFormat::Contiguous);
}

at::Tensor Autoencoder::decode(const at::Tensor& latent) const {
  check_input(latent, config_.latent_channels, "latent", "[B, latent_channels, h, w]");
  at::Tensor out;
  {
    c10::InferenceMode guard;
    out = run(decoder_, latent, 0, decoder_.size()).clamp(0, 1);
  }
  return out.clone(at::MemoryFormat::Contiguous);
}

at::Tensor Autoencoder::decode_crop(const at::Tensor& latent, int x0, int y0, int w, int h,
                                    int margin) const {
  check_input(latent, config_.latent_channels, "latent", "[B, latent_channels, h, w]");
  const auto [cx0, cy0, cx1, cy1] = latent_context_box(latent, x0, y0, w, h, margin, "autoencoder");
  const auto first_upsample =
      static_cast<size_t>(std::find_if(decoder_.begin(), decoder_.end(),
                                       [](const Layer& l) { return l.kind == Kind::kUpsample; }) -
                          decoder_.begin());
  at::Tensor out;
  {
    c10::InferenceMode guard;
    // The trunk's GroupNorms see the whole image, so it runs on the whole latent; at 1/64 of
    // the pixels it is a few percent of a full decode.
    at::Tensor trunk = run(decoder_, latent, 0, first_upsample);
    at::Tensor context = trunk.slice(2, cy0, cy1).slice(3, cx0, cx1);
    at::Tensor pixels = run(decoder_, context, first_upsample, decoder_.size());
    out = pixels.slice(2, (y0 - cy0) * kFactor, (y0 - cy0 + h) * kFactor)
              .slice(3, (x0 - cx0) * kFactor, (x0 - cx0 + w) * kFactor)
              .clamp(0, 1);
  }
  return out.clone(at::MemoryFormat::Contiguous);
}

}  // namespace infill
