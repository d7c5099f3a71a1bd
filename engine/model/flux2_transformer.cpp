#include "model/flux2_transformer.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "common/shape_text.h"
#include "kernels/fused_norms.h"
#include "kernels/masked_attention.h"
#include "kernels/token_rows.h"
#include "model/attention_over_cache.h"
#include "model/float8_linear.h"
#include "model/flux2_checkpoint.h"
#include "model/flux2_layers.h"
#include "model/lora_round.h"
#include "model/row_attention.h"
#include "model/sequence_group.h"
#include "model/safetensors_torch.h"
#include "model/stored_linear.h"

namespace infill {

using namespace flux2;  // the weights and forward pieces (model/flux2_layers.h)

// ---------------------------------------------------------------------------------------------
// Configuration

Status Flux2Config::validate() const {
  auto bad = [](const std::string& what) { return invalid_argument("FLUX.2 transformer config: " + what); };
  if (in_channels <= 0 || context_dim <= 0 || hidden_size <= 0 || mlp_hidden <= 0 || time_embed_dim <= 0) {
    return bad("sizes must be positive");
  }
  if (mask_channels < 0 || mask_cells() * mask_cells() != mask_channels) {
    return bad("mask_channels is " + std::to_string(mask_channels) +
               ", expected 0 or a square (p x p mask cells per token): img_in reads " + std::to_string(input_channels()) +
               " channels, final_layer.linear writes " + std::to_string(in_channels));
  }
  if (num_heads <= 0 || hidden_size % num_heads != 0) {
    return bad("hidden_size " + std::to_string(hidden_size) + " is not a multiple of num_heads " +
               std::to_string(num_heads));
  }
  if (double_blocks < 0 || single_blocks < 0 || depth() == 0) return bad("no transformer blocks");
  int axes = 0;
  for (int a : axes_dim) {
    if (a <= 0 || a % 2 != 0) return bad("RoPE axis widths must be positive and even");
    axes += a;
  }
  if (axes_dim.size() != 4 || axes != head_dim()) {
    return bad("RoPE axes_dim must be 4 widths summing to head_dim " + std::to_string(head_dim()));
  }
  if (!(theta > 0)) return bad("theta must be positive");
  return {};
}

int Flux2Config::mask_cells() const {
  int p = 0;
  while ((p + 1) * (p + 1) <= mask_channels) ++p;
  return p;
}

std::string Flux2Config::family_size() const {
  if (in_channels != 128 || mask_channels != 0) return "custom";
  if (hidden_size == 3072 && num_heads == 24 && double_blocks == 5 && single_blocks == 20 && context_dim == 7680) {
    return "klein-4b";
  }
  if (hidden_size == 4096 && num_heads == 32 && double_blocks == 8 && single_blocks == 24 && context_dim == 12288) {
    return "klein-9b";
  }
  if (hidden_size == 6144 && num_heads == 48 && double_blocks == 8 && single_blocks == 48 && context_dim == 15360) {
    return "dev";
  }
  return "custom";
}

std::vector<Flux2LinearLayer> flux2_linear_layers(const Flux2Config& config) {
  Flux2Transformer::Weights w;
  w.cfg = config;
  std::vector<Flux2LinearLayer> layers;
  for (const auto& slot : w.slots()) {
    if (slot.shape.size() == 2) layers.push_back({slot.name, slot.shape[0], slot.shape[1]});
  }
  return layers;
}

Result<std::string> find_flux2_transformer_prefix(const SafetensorsFile& file) {
  static const std::string kAnchor = "img_in.weight";
  for (const TensorInfo& t : file.tensors()) {
    if (t.name.size() < kAnchor.size() || t.name.compare(t.name.size() - kAnchor.size(), kAnchor.size(), kAnchor) != 0) {
      continue;
    }
    const std::string prefix = t.name.substr(0, t.name.size() - kAnchor.size());
    if (file.find(prefix + "double_blocks.0.img_attn.qkv.weight") != nullptr ||
        file.find(prefix + "single_blocks.0.linear1.weight") != nullptr) {
      return prefix;
    }
  }
  return not_found(file.path() + ": not a FLUX.2 transformer (no img_in.weight with double_blocks or "
                   "single_blocks beside it)");
}

Result<Flux2Config> infer_flux2_config(const Flux2Checkpoint& checkpoint) {
  const auto& shapes = checkpoint.shapes();
  auto shape_of = [&](const std::string& name, size_t rank) -> Result<std::vector<int64_t>> {
    const auto it = shapes.find(name);
    if (it == shapes.end()) return not_found(checkpoint.where() + ": weight " + name + " is missing");
    if (it->second.size() != rank) {
      return invalid_argument(checkpoint.where() + ": " + name + " is " + shape_text(it->second) + ", expected " +
                              std::to_string(rank) + " dimensions");
    }
    return it->second;
  };
  // Blocks are counted by their indices; a gap (block 3 missing while 4 exists) is caught
  // later as a missing weight.
  auto count_blocks = [&](const std::string& kind) {
    int n = 0;
    const std::string head = kind + ".";
    for (const auto& [name, _] : shapes) {
      if (name.rfind(head, 0) != 0) continue;
      const size_t dot = name.find('.', head.size());
      try {
        n = std::max(n, std::stoi(name.substr(head.size(), dot - head.size())) + 1);
      } catch (const std::exception&) {
      }
    }
    return n;
  };
  Flux2Config c;
  INFILL_ASSIGN_OR_RETURN(auto img_in, shape_of("img_in.weight", 2));
  INFILL_ASSIGN_OR_RETURN(auto txt_in, shape_of("txt_in.weight", 2));
  INFILL_ASSIGN_OR_RETURN(auto time_in, shape_of("time_in.in_layer.weight", 2));
  c.hidden_size = static_cast<int>(img_in[0]);
  INFILL_ASSIGN_OR_RETURN(auto final_linear, shape_of("final_layer.linear.weight", 2));
  // The prediction is a latent; img_in may read more (mask-conditioned models).
  c.in_channels = static_cast<int>(final_linear[0]);
  c.mask_channels = static_cast<int>(img_in[1] - final_linear[0]);
  c.context_dim = static_cast<int>(txt_in[1]);
  c.time_embed_dim = static_cast<int>(time_in[1]);
  c.double_blocks = count_blocks("double_blocks");
  c.single_blocks = count_blocks("single_blocks");
  c.guidance_embed = shapes.count("guidance_in.in_layer.weight") > 0;
  if (c.double_blocks > 0) {
    INFILL_ASSIGN_OR_RETURN(auto q_scale, shape_of("double_blocks.0.img_attn.norm.query_norm.scale", 1));
    INFILL_ASSIGN_OR_RETURN(auto mlp_out, shape_of("double_blocks.0.img_mlp.2.weight", 2));
    c.num_heads = q_scale[0] > 0 ? static_cast<int>(c.hidden_size / q_scale[0]) : 0;
    c.mlp_hidden = static_cast<int>(mlp_out[1]);
  } else if (c.single_blocks > 0) {
    INFILL_ASSIGN_OR_RETURN(auto q_scale, shape_of("single_blocks.0.norm.query_norm.scale", 1));
    INFILL_ASSIGN_OR_RETURN(auto linear2, shape_of("single_blocks.0.linear2.weight", 2));
    c.num_heads = q_scale[0] > 0 ? static_cast<int>(c.hidden_size / q_scale[0]) : 0;
    c.mlp_hidden = static_cast<int>(linear2[1] - c.hidden_size);
  }
  // The RoPE split is not in the weights: upstream gives each of (t, h, w, l) a quarter.
  const int quarter = c.num_heads > 0 ? c.head_dim() / 4 : 0;
  c.axes_dim = {quarter, quarter, quarter, quarter};
  if (Status s = c.validate(); !s.ok()) return invalid_argument(checkpoint.where() + ": " + s.message());
  return c;
}

Result<Flux2Config> infer_flux2_config(const SafetensorsFile& file, const std::string& prefix) {
  INFILL_ASSIGN_OR_RETURN(Flux2Checkpoint checkpoint, Flux2Checkpoint::from_file(file, prefix));
  return infer_flux2_config(checkpoint);
}

// ---------------------------------------------------------------------------------------------
// Loading and saving

Flux2Transformer::Flux2Transformer(std::unique_ptr<Weights> weights) : w_(std::move(weights)) {}
Flux2Transformer::Flux2Transformer(Flux2Transformer&&) noexcept = default;
Flux2Transformer& Flux2Transformer::operator=(Flux2Transformer&&) noexcept = default;
Flux2Transformer::~Flux2Transformer() = default;

const Flux2Config& Flux2Transformer::config() const { return w_->cfg; }

Result<Flux2Transformer> Flux2Transformer::load(const Flux2Checkpoint& checkpoint) {
  INFILL_ASSIGN_OR_RETURN(Flux2Config cfg, infer_flux2_config(checkpoint));
  auto w = std::make_unique<Weights>();
  w->cfg = cfg;
  c10::InferenceMode guard;
  std::set<std::string> expected;
  for (auto& slot : w->slots()) {
    expected.insert(slot.name);
    INFILL_ASSIGN_OR_RETURN(*slot.tensor, checkpoint.read(slot.name, slot.shape));
    if (slot.linear != nullptr) {
      INFILL_ASSIGN_OR_RETURN(slot.linear->file_scale, checkpoint.float8_row_scales(slot.name));
    }
  }
  for (const auto& [name, _] : checkpoint.shapes()) {
    if (expected.count(name) == 0) {
      return invalid_argument(checkpoint.where() + ": unexpected tensor " + name + " for a FLUX.2 transformer with " +
                              std::to_string(cfg.double_blocks) + " double and " + std::to_string(cfg.single_blocks) +
                              " single blocks");
    }
  }
  return Flux2Transformer(std::move(w));
}

Result<Flux2Transformer> Flux2Transformer::load(const SafetensorsFile& file, const std::string& prefix) {
  INFILL_ASSIGN_OR_RETURN(Flux2Checkpoint checkpoint, Flux2Checkpoint::from_file(file, prefix));
  return load(checkpoint);
}

Flux2Transformer Flux2Transformer::random(const Flux2Config& config, uint64_t seed, at::ScalarType dtype) {
  TORCH_CHECK(config.validate().ok(), config.validate().message());
  auto w = std::make_unique<Weights>();
  w->cfg = config;
  c10::InferenceMode guard;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (auto& slot : w->slots()) {
    // Norm scales start near one, as trained ones do; one tensor at a time in float32, so
    // the peak is the largest layer, not the model.
    const bool norm_scale = slot.shape.size() == 1;
    at::Tensor t = at::empty(slot.shape, at::kFloat).normal_(norm_scale ? 1.0 : 0.0, 0.02, gen);
    *slot.tensor = t.to(dtype);
  }
  return Flux2Transformer(std::move(w));
}

Status Flux2Transformer::save(const std::string& path, const std::string& prefix) const {
  if (float8_layers() > 0) {
    return Status(ErrorCode::kUnimplemented, path + ": a transformer with FP8 layers (" + std::to_string(float8_layers()) +
                                                 ") is not saved; save the one it was made from");
  }
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (auto& slot : w_->slots()) tensors.emplace_back(prefix + slot.name, slot.tensor->contiguous());
  return write_safetensors(path, tensors, {{"format", "pt"}});
}

int64_t Flux2Transformer::weight_bytes() const {
  int64_t bytes = 0;
  for (auto& slot : w_->slots()) {
    bytes += static_cast<int64_t>(slot.tensor->nbytes());
    if (slot.linear != nullptr && slot.linear->scale.defined()) bytes += static_cast<int64_t>(slot.linear->scale.nbytes());
  }
  return bytes;
}

int Flux2Transformer::float8_layers() const {
  int layers = 0;
  for (auto& slot : w_->slots()) layers += slot.linear != nullptr && slot.linear->scale.defined() ? 1 : 0;
  return layers;
}

namespace {

// The layers the FP8 path holds in FP8: the block projections whose sizes suit _scaled_mm.
bool takes_float8(const Flux2Transformer::Weights::Slot& slot) {
  const bool block = slot.name.starts_with("double_blocks.") || slot.name.starts_with("single_blocks.");
  return slot.linear != nullptr && block && !slot.linear->scale.defined() && slot.shape[0] % 16 == 0 &&
         slot.shape[1] % 16 == 0;
}

// `dense` (the layer's weight in bf16 on the device) as FP8: an E4M3 file's own codes and
// scales where the file stored it so, else a scale per row from its largest value.
Float8Weight to_float8(const flux2::Linear& layer, const at::Tensor& dense) {
  return layer.file_scale.defined() ? quantize_float8_rows(dense, layer.file_scale) : quantize_float8_rows(dense);
}

}  // namespace

Result<Flux2Transformer> Flux2Transformer::with_float8_weights() const {
  const at::Device where = device();
  const ComputeDevice target{where.is_cuda(), where.is_cuda() ? static_cast<int>(where.index()) : 0};
  INFILL_RETURN_IF_ERROR(float8_compute_status(target));
  if (compute_dtype() != at::kBFloat16) {
    return invalid_argument(target.name() + ": FP8 weights are made from a transformer computing in bf16, not " +
                            std::string(c10::toString(compute_dtype())));
  }
  c10::InferenceMode guard;
  auto w = std::make_unique<Weights>(*w_);  // tensors shared until replaced below
  try {
    for (auto& slot : w->slots()) {
      if (!takes_float8(slot)) continue;
      Float8Weight q = to_float8(*slot.linear, slot.linear->w);
      slot.linear->w = std::move(q.codes);
      slot.linear->scale = std::move(q.scale);
    }
  } catch (const c10::Error& e) {
    return Status(ErrorCode::kResourceExhausted, "FP8 weights on " + target.name() + ": " + e.what_without_backtrace());
  }
  return Flux2Transformer(std::move(w));
}

Result<Flux2Transformer> Flux2Transformer::with_fused_norms() const {
  if (const std::string why = kernels::fused_norms_unavailable(device()); !why.empty()) {
    return invalid_argument("fused norms: " + why);
  }
  auto w = std::make_unique<Weights>(*w_);  // every tensor shared
  w->fused_norms = true;
  return Flux2Transformer(std::move(w));
}

bool Flux2Transformer::fused_norms() const { return w_->fused_norms && device().is_cuda(); }

at::Device Flux2Transformer::device() const { return w_->img_in.w.device(); }

at::ScalarType Flux2Transformer::compute_dtype() const {
  return device().is_cpu() ? at::kFloat : w_->img_in.w.scalar_type();
}

at::ScalarType Flux2Transformer::rope_table_dtype() const { return fused_norms() ? at::kFloat : compute_dtype(); }

Flux2Transformer Flux2Transformer::merged(const AdapterSet& adapters) const {
  c10::InferenceMode guard;
  auto w = std::make_unique<Weights>(*w_);  // tensors shared until replaced below
  for (auto& slot : w->slots()) {
    at::Tensor sum;
    for (const AdapterUse& use : adapters) {
      const auto it = use.adapter->layers.find(slot.name);
      if (it == use.adapter->layers.end()) continue;
      const at::Tensor delta = at::mm(it->second.up, it->second.down).mul_(use.strength).to(slot.tensor->device());
      sum = sum.defined() ? sum.add_(delta) : delta;
    }
    if (!sum.defined()) continue;
    if (slot.linear != nullptr) slot.linear->file_scale = at::Tensor();  // no longer the file's numbers
    if (slot.linear != nullptr && slot.linear->scale.defined()) {
      // An FP8 layer stays FP8: W + delta quantized again, with fresh row scales.
      Float8Weight q = quantize_float8_rows(slot.linear->dense(at::kFloat).add(sum));
      slot.linear->w = std::move(q.codes);
      slot.linear->scale = std::move(q.scale);
    } else {
      *slot.tensor = slot.tensor->to(at::kFloat).add(sum).to(slot.tensor->scalar_type());
    }
  }
  return Flux2Transformer(std::move(w));
}

Status Flux2Transformer::to_device(const ComputeDevice& target, at::ScalarType dtype) {
  INFILL_RETURN_IF_ERROR(check_compute_device(target));
  if (float8_layers() > 0) {
    return Status(ErrorCode::kUnimplemented, target.name() + ": a transformer with FP8 layers stays on " +
                                                 ComputeDevice{true, static_cast<int>(this->device().index())}.name() +
                                                 "; move the one it was made from");
  }
  const at::Device device = target.torch_device();
  auto slots = w_->slots();
  // Every tensor is copied before any is replaced, so a failure (out of device memory)
  // leaves the model where it was.
  std::vector<at::Tensor> moved;
  moved.reserve(slots.size());
  try {
    c10::InferenceMode guard;
    for (const auto& slot : slots) {
      moved.push_back(target.cuda ? slot.tensor->to(device, dtype) : slot.tensor->to(device));
    }
  } catch (const c10::Error& e) {
    return Status(ErrorCode::kResourceExhausted, "FLUX.2 transformer to " + target.name() + " (" +
                                                     std::to_string(weight_bytes()) + " bytes of weights): " +
                                                     e.what_without_backtrace());
  }
  for (size_t i = 0; i < slots.size(); ++i) *slots[i].tensor = std::move(moved[i]);
  return {};
}

Status Flux2Transformer::to_device_float8(const ComputeDevice& target) {
  INFILL_RETURN_IF_ERROR(check_compute_device(target));
  INFILL_RETURN_IF_ERROR(float8_compute_status(target));
  if (float8_layers() > 0 || !device().is_cpu()) {
    return invalid_argument(target.name() + ": FP8 weights are made on the way from the CPU; this transformer is on " +
                            device().str() + (float8_layers() > 0 ? " with FP8 layers" : ""));
  }
  const at::Device device = target.torch_device();
  auto slots = w_->slots();
  // As to_device: everything is made before anything is replaced. A block projection goes up
  // in bf16 and is quantized there at once, so beside the FP8 model the device holds one
  // layer's bf16 and float32 transients at most (klein 9B: its 9 GB of FP8 blocks, never the
  // 18 GB of bf16 ones with_float8_weights starts from).
  std::vector<at::Tensor> moved, scales;
  moved.reserve(slots.size());
  scales.resize(slots.size());
  try {
    c10::InferenceMode guard;
    for (size_t i = 0; i < slots.size(); ++i) {
      at::Tensor dense = slots[i].tensor->to(device, at::kBFloat16);
      if (takes_float8(slots[i])) {
        Float8Weight q = to_float8(*slots[i].linear, dense);
        dense = std::move(q.codes);
        scales[i] = std::move(q.scale);
      }
      moved.push_back(std::move(dense));
    }
  } catch (const c10::Error& e) {
    return Status(ErrorCode::kResourceExhausted, "FLUX.2 transformer to " + target.name() + " with FP8 block weights: " +
                                                     e.what_without_backtrace());
  }
  for (size_t i = 0; i < slots.size(); ++i) {
    *slots[i].tensor = std::move(moved[i]);
    if (scales[i].defined()) slots[i].linear->scale = std::move(scales[i]);
  }
  return {};
}

// ---------------------------------------------------------------------------------------------
// Embeddings

at::Tensor flux2_timestep_embedding(double t, int dim) {
  const int half = dim / 2;
  at::Tensor freqs = at::exp(-std::log(10000.0) * at::arange(half, at::kFloat) / static_cast<float>(half));
  at::Tensor args = freqs * static_cast<float>(1000.0 * t);
  at::Tensor emb = at::cat({at::cos(args), at::sin(args)});
  if (dim % 2 != 0) emb = at::cat({emb, at::zeros({1}, at::kFloat)});
  return emb;
}

std::pair<at::Tensor, at::Tensor> flux2_rope_angles(const at::Tensor& ids, const std::vector<int>& axes_dim,
                                                    double theta) {
  TORCH_CHECK(ids.dim() == 2 && ids.size(1) == static_cast<int64_t>(axes_dim.size()), "position ids must be [R, ",
              axes_dim.size(), "]");
  std::vector<at::Tensor> angles;
  const at::Tensor pos = ids.to(at::kDouble);
  for (size_t a = 0; a < axes_dim.size(); ++a) {
    const int d = axes_dim[a];
    at::Tensor omega = 1.0 / at::pow(theta, at::arange(0, d, 2, at::kDouble) / static_cast<double>(d));
    angles.push_back(at::outer(pos.select(1, static_cast<int64_t>(a)), omega));
  }
  at::Tensor all = at::cat(angles, 1);
  return {at::cos(all).to(at::kFloat), at::sin(all).to(at::kFloat)};
}

// ---------------------------------------------------------------------------------------------
// Forward

namespace {

// The end of a segment's recomputed prefix: from here on it computes only its kept rows (the
// rows were the whole sequence in order, so a kept position is also its row index).
void keep_rows_only(SegmentState& s, const at::Device& device) {
  const at::Tensor keep = s.keep.to(device);
  s.cos = s.cos.index_select(0, keep);
  s.sin = s.sin.index_select(0, keep);
  s.positions = s.keep;
  s.positions_device = at::Tensor();
  s.rt = s.keep_text;
  s.ri = s.keep.size(0) - s.keep_text;
  s.full = false;
}

// This rank's heads' columns [first, first + part) of `block`'s cached K and V [L, part], in
// `dtype` on `device`, ready to take the fresh rows: only those columns cross to the device.
std::pair<at::Tensor, at::Tensor> cached_head_columns(flux2::SegmentState& s, int block, int64_t first, int64_t part,
                                                      int64_t hidden, const at::Device& device, at::ScalarType dtype) {
  KvSource& kv = *s.seg->kv;
  const int64_t L = s.length;
  at::Tensor keys, values;
  const uint16_t *k_half = nullptr, *v_half = nullptr;
  if (!device.is_cpu() && kv.device_tensors(block, device, &keys, &values)) {
    // Resident on (or prefetched to) this rank's device.
  } else if (kv.fp16_slabs(block, &k_half, &v_half)) {
    keys = at::from_blob(const_cast<uint16_t*>(k_half), {L, hidden}, at::kHalf);
    values = at::from_blob(const_cast<uint16_t*>(v_half), {L, hidden}, at::kHalf);
  } else {
    if (!s.k_buf.defined()) {
      s.k_buf = at::empty({L, hidden}, at::kFloat);
      s.v_buf = at::empty({L, hidden}, at::kFloat);
    }
    kv.fetch(block, s.k_buf, s.v_buf);
    keys = s.k_buf;
    values = s.v_buf;
  }
  // Always a copy: the fresh rows must never land in the source's tensors.
  auto columns = [&](const at::Tensor& t) {
    return t.narrow(1, first, part).to(device, dtype, /*non_blocking=*/false, /*copy=*/true).contiguous();
  };
  return {columns(keys), columns(values)};
}

// Ulysses: this rank's rows q, k, v [R, H] (every head) become every rank's rows for this
// rank's heads, attend there (over the whole sequence, or over the cached K/V of every
// position with every rank's fresh rows in place), and return as this rank's rows for every
// head. RoPE was applied to each row before, so the order of the gathered rows (rank by rank)
// does not matter to the attention.
at::Tensor ulysses_attention(flux2::SegmentState& s, int block, const at::Tensor& q, const at::Tensor& k,
                             const at::Tensor& v, int64_t heads, double scale) {
  SequenceGroup& group = *s.seg->group;
  const std::vector<int64_t>& rank_rows = s.seg->group_rows;
  const int P = group.size();
  const int64_t R = q.size(0), H = q.size(1), part = H / P;  // channels of one rank's heads
  // [R, 3, P, part] -> [P, R, 3, part]: the rows for rank j are rank j's heads of q, k and v.
  const at::Tensor send = at::stack({q, k, v}, 1).view({R, 3, P, part}).permute({2, 0, 1, 3}).contiguous().view({P * R, 3 * part});
  const std::vector<int64_t> mine(P, R);
  const at::Tensor got = group.all_to_all(send, mine, rank_rows).view({-1, 3, part});  // [C, 3, part]
  const at::Tensor queries = got.select(1, 0).contiguous();
  at::Tensor out;
  if (s.seg->kv == nullptr) {  // the whole sequence's rows: they attend among themselves
    out = row_attention(queries, got.select(1, 1).contiguous(), got.select(1, 2).contiguous(), heads / P, scale);
  } else {
    auto [keys, values] = cached_head_columns(s, block, group.rank() * part, part, H, q.device(), q.scalar_type());
    keys.index_copy_(0, s.group_positions_device, got.select(1, 1));
    values.index_copy_(0, s.group_positions_device, got.select(1, 2));
    out = row_attention(queries, keys, values, heads / P, scale);  // [C, part]
  }
  // Back: each rank's rows of this rank's heads; from every rank, this rank's rows of its heads.
  const at::Tensor back = group.all_to_all(out.contiguous(), rank_rows, mine);  // [P * R, part]
  return back.view({P, R, part}).permute({1, 0, 2}).reshape({R, H});
}

}  // namespace

namespace flux2 {

at::Tensor layer_norm(const at::Tensor& x) { return at::layer_norm(x, {x.size(1)}, {}, {}, kNormEps); }

// x * (1 + scale) + shift, in place.
void modulate_(at::Tensor x, const at::Tensor& shift, const at::Tensor& scale) { x.addcmul_(x, scale).add_(shift); }

// RMSNorm over each head's channels: x [R, heads * d], scale [d].
at::Tensor rms_norm_heads(const at::Tensor& x, const at::Tensor& scale, int64_t heads) {
  const int64_t r = x.size(0), d = scale.size(0);
  at::Tensor xv = x.reshape({r, heads, d});
  at::Tensor rrms = at::rsqrt(xv.pow(2).mean(-1, true).add_(kNormEps));
  return (xv * rrms).mul_(scale.to(x.scalar_type())).reshape({r, heads * d});
}

// Rotates each adjacent channel pair (2i, 2i+1) of every head by the row's angle i.
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t heads) {
  const int64_t r = x.size(0), half = cos.size(1);
  at::Tensor xv = x.reshape({r, heads, half, 2});
  at::Tensor x0 = xv.select(3, 0), x1 = xv.select(3, 1);
  at::Tensor c = cos.unsqueeze(1), s = sin.unsqueeze(1);
  return at::stack({c * x0 - s * x1, s * x0 + c * x1}, 3).reshape({r, heads * half * 2});
}

at::Tensor pre_norm(const at::Tensor& x, bool fused) {
  return fused && x.is_cuda() ? at::empty_like(x) : layer_norm(x);
}

void modulate_rows(const at::Tensor& x_rows, at::Tensor h_rows, const at::Tensor& shift, const at::Tensor& scale,
                   bool fused) {
  if (fused && x_rows.is_cuda()) {
    kernels::fused_layer_norm_modulate(x_rows, shift, scale, std::move(h_rows), kNormEps);
  } else {
    modulate_(std::move(h_rows), shift, scale);
  }
}

namespace {

// q and k into the given buffers, or as they are when none are given.
std::pair<at::Tensor, at::Tensor> into(at::Tensor q, at::Tensor k, at::Tensor q_out, at::Tensor k_out) {
  if (!q_out.defined()) return {std::move(q), std::move(k)};
  q_out.copy_(q);
  k_out.copy_(k);
  return {std::move(q_out), std::move(k_out)};
}

}  // namespace

std::pair<at::Tensor, at::Tensor> double_block_qk(const DoubleBlock& blk, const at::Tensor& t, const at::Tensor& im,
                                                  const at::Tensor& cos, const at::Tensor& sin, int64_t heads,
                                                  bool fused, at::Tensor q_out, at::Tensor k_out) {
  const int64_t H = im.size(1) / 3, rt = t.defined() ? t.size(0) : 0, ri = im.size(0);
  if (fused && im.is_cuda()) {
    if (!q_out.defined()) {
      q_out = at::empty({rt + ri, H}, im.options());
      k_out = at::empty({rt + ri, H}, im.options());
    }
    // Each stream's rows with its own scales, straight into their rows of q and k.
    auto rows = [&](const Stream& st, const at::Tensor& qkv, int64_t begin, int64_t count) {
      if (count == 0) return;
      const at::Tensor c = cos.narrow(0, begin, count), s = sin.narrow(0, begin, count);
      // (The scales are in the compute dtype after to_device: .to is then no operation.)
      kernels::fused_rms_norm_rope(qkv.narrow(1, 0, H), st.q_scale.to(qkv.scalar_type()), c, s, heads, kNormEps,
                                   q_out.narrow(0, begin, count));
      kernels::fused_rms_norm_rope(qkv.narrow(1, H, H), st.k_scale.to(qkv.scalar_type()), c, s, heads, kNormEps,
                                   k_out.narrow(0, begin, count));
    };
    rows(blk.txt, t, 0, rt);
    rows(blk.img, im, rt, ri);
    return {std::move(q_out), std::move(k_out)};
  }
  at::Tensor q = rms_norm_heads(im.narrow(1, 0, H), blk.img.q_scale, heads);
  at::Tensor k = rms_norm_heads(im.narrow(1, H, H), blk.img.k_scale, heads);
  if (rt > 0) {
    q = at::cat({rms_norm_heads(t.narrow(1, 0, H), blk.txt.q_scale, heads), q});
    k = at::cat({rms_norm_heads(t.narrow(1, H, H), blk.txt.k_scale, heads), k});
  }
  return into(apply_rope(q, cos, sin, heads), apply_rope(k, cos, sin, heads), std::move(q_out), std::move(k_out));
}

std::pair<at::Tensor, at::Tensor> single_block_qk(const SingleBlock& blk, const at::Tensor& y, const at::Tensor& cos,
                                                  const at::Tensor& sin, int64_t heads, bool fused, at::Tensor q_out,
                                                  at::Tensor k_out) {
  const int64_t H = blk.q_scale.size(0) * heads;  // y also holds v and the MLP's halves
  if (fused && y.is_cuda()) {
    if (!q_out.defined()) {
      q_out = at::empty({y.size(0), H}, y.options());
      k_out = at::empty({y.size(0), H}, y.options());
    }
    kernels::fused_rms_norm_rope(y.narrow(1, 0, H), blk.q_scale.to(y.scalar_type()), cos, sin, heads, kNormEps, q_out);
    kernels::fused_rms_norm_rope(y.narrow(1, H, H), blk.k_scale.to(y.scalar_type()), cos, sin, heads, kNormEps, k_out);
    return {std::move(q_out), std::move(k_out)};
  }
  return into(apply_rope(rms_norm_heads(y.narrow(1, 0, H), blk.q_scale, heads), cos, sin, heads),
              apply_rope(rms_norm_heads(y.narrow(1, H, H), blk.k_scale, heads), cos, sin, heads), std::move(q_out),
              std::move(k_out));
}

// Attention of one segment's computed rows over all of its positions in block `block`:
// q, k, v [R, H] are the fresh rows (post norm and RoPE).
at::Tensor segment_attention(SegmentState& s, int block, const at::Tensor& q, const at::Tensor& k,
                             const at::Tensor& v, int64_t heads, double scale) {
  const bool cpu_float = q.device().is_cpu() && q.scalar_type() == at::kFloat;
  if (s.seg->group != nullptr) {
    if (s.seg->sink != nullptr) s.seg->sink->store_rows(block, s.positions, k, v);
    return ulysses_attention(s, block, q, k, v, heads, scale);
  }
  if (s.full) {
    if (s.seg->sink != nullptr) s.seg->sink->store(block, k, v);
    return row_attention(q, k, v, heads, scale);
  }
  const int64_t L = s.length, H = q.size(1);
  const uint16_t *k_half = nullptr, *v_half = nullptr;
  const bool slabs = s.seg->kv->fp16_slabs(block, &k_half, &v_half);
  if (cpu_float && slabs) {
    return kernels::masked_attention_over_cache(q, k_half, v_half, L, s.positions, k, v, heads, scale);
  }
  // The source's float copy of every position, into buffers the segment keeps.
  auto fetch_float = [&] {
    if (!s.k_buf.defined()) {
      s.k_buf = at::empty({L, H}, at::kFloat);
      s.v_buf = at::empty({L, H}, at::kFloat);
    }
    s.seg->kv->fetch(block, s.k_buf, s.v_buf);
  };
  if (cpu_float) {
    fetch_float();
    kernels::scatter_rows(s.k_buf, s.positions, k);
    kernels::scatter_rows(s.v_buf, s.positions, v);
    return row_attention(q, s.k_buf, s.v_buf, heads, scale);
  }
  if (!s.positions_device.defined()) s.positions_device = s.positions.to(q.device());
  // Resident on the device in the compute dtype (the device tier): the fresh rows are swapped
  // in for the attention and the cached ones back after, nothing else is copied.
  at::Tensor cached_rows;
  if (s.seg->kv->device_kv_rows(block, q.device(), &cached_rows) && cached_rows.scalar_type() == q.scalar_type()) {
    return attention_with_rows_swapped_in(q, cached_rows, s.positions_device, k, v, heads, scale);
  }
  // Another device or dtype: the cached rows travel as fp16 (half the bytes of float32) and
  // are widened to the compute dtype there; the fresh rows replace theirs on the device.
  at::Tensor keys, values;
  if (s.seg->kv->device_tensors(block, q.device(), &keys, &values)) {
    // Resident on the device: nothing crosses the bus.
  } else if (slabs) {
    keys = at::from_blob(const_cast<uint16_t*>(k_half), {L, H}, at::kHalf).to(q.device());
    values = at::from_blob(const_cast<uint16_t*>(v_half), {L, H}, at::kHalf).to(q.device());
  } else {
    fetch_float();
    keys = s.k_buf.to(q.device());
    values = s.v_buf.to(q.device());
  }
  // Always a copy (copy=true): the fresh rows must never land in a resident tier's tensors.
  keys = keys.to(q.scalar_type(), false, true).index_copy_(0, s.positions_device, k);
  values = values.to(q.scalar_type(), false, true).index_copy_(0, s.positions_device, v);
  return row_attention(q, keys, values, heads, scale);
}

}  // namespace flux2

namespace {

// Row ranges of segments inside a packed matrix.
struct Packing {
  std::vector<int64_t> begin, rows;
  at::Tensor slice(const at::Tensor& t, size_t i) const { return t.narrow(0, begin[i], rows[i]); }
};

Packing packing(const std::vector<int64_t>& rows) {
  Packing p;
  int64_t total = 0;
  for (int64_t r : rows) {
    p.begin.push_back(total);
    p.rows.push_back(r);
    total += r;
  }
  return p;
}

at::Tensor concat_rows(const std::vector<at::Tensor>& parts) { return parts.size() == 1 ? parts[0] : at::cat(parts, 0); }

}  // namespace

at::Tensor Flux2Transformer::forward(std::span<Flux2Segment> segments, Flux2Trace* trace) const {
  c10::InferenceMode guard;
  return forward_on_device(segments, trace).to(at::kCPU);
}

at::Tensor Flux2Transformer::forward_on_device(std::span<Flux2Segment> segments, Flux2Trace* trace) const {
  c10::InferenceMode guard;
  const Weights& w = *w_;
  const bool fused = w.fused_norms;
  const Flux2Config& cfg = w.cfg;
  const int64_t H = cfg.hidden_size, M = cfg.mlp_hidden, heads = cfg.num_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(cfg.head_dim()));
  const at::Device device = w.img_in.w.device();
  // float32 on the CPU (no fast bf16 GEMM there), the weights' dtype on a GPU (to_device).
  const at::ScalarType dtype = compute_dtype();
  const auto opts = at::TensorOptions().device(device).dtype(dtype);
  const auto table_opts = opts.dtype(rope_table_dtype());
  TORCH_CHECK(!segments.empty(), "FLUX.2 forward: no segments");
  TORCH_CHECK(trace == nullptr || segments.size() == 1, "FLUX.2 forward: a trace needs a single segment");

  const size_t n = segments.size();
  std::vector<SegmentState> states(n);
  // The segments' LoRAs, stacked per layer: a layer's low-rank terms cost two GEMMs for every
  // row of the round (model/lora_round.h); nothing at all when no segment has adapters.
  std::vector<const AdapterSet*> sets;
  for (const Flux2Segment& seg : segments) sets.push_back(&seg.adapters);
  const LoraRound round = LoraRound::build(sets, opts);
  // x W^T plus the round's terms of W for x's rows, whose coefficients are `coef`.
  auto linear = [&round](const Linear& l, const at::Tensor& x, const at::Tensor& coef) {
    at::Tensor y = l(x);
    if (!round.empty()) round.add(l.name, x, coef, y);
    return y;
  };
  std::vector<at::Tensor> txt_parts, img_parts;
  std::vector<int64_t> txt_rows, img_rows, all_rows;
  for (size_t i = 0; i < n; ++i) {
    Flux2Segment& seg = segments[i];
    SegmentState& s = states[i];
    s.seg = &seg;
    s.rt = seg.txt.defined() ? seg.txt.size(0) : 0;
    s.ri = seg.img.defined() ? seg.img.size(0) : 0;
    TORCH_CHECK(s.ri > 0 && seg.img.dim() == 2 && seg.img.size(1) == cfg.input_channels(), "segment ", i,
                ": img must be [R >= 1, ", cfg.input_channels(), "]");
    TORCH_CHECK(seg.img_ids.defined() && seg.img_ids.sizes() == at::IntArrayRef({s.ri, 4}), "segment ", i,
                ": img_ids must be [", s.ri, ", 4]");
    if (s.rt > 0) {
      TORCH_CHECK(seg.txt.dim() == 2 && seg.txt.size(1) == cfg.context_dim, "segment ", i, ": txt must be [R, ",
                  cfg.context_dim, "]");
      TORCH_CHECK(seg.txt_ids.defined() && seg.txt_ids.sizes() == at::IntArrayRef({s.rt, 4}), "segment ", i,
                  ": txt_ids must be [", s.rt, ", 4]");
    }
    const int64_t rows = s.rt + s.ri;
    const int64_t L = seg.sequence_length > 0 ? seg.sequence_length : rows;
    s.length = L;
    TORCH_CHECK(rows <= L, "segment ", i, ": ", rows, " rows computed of a sequence of ", L);
    s.positions = seg.positions.defined() ? seg.positions.to(at::kCPU, at::kLong).contiguous() : at::arange(L, at::kLong);
    TORCH_CHECK(s.positions.dim() == 1 && s.positions.size(0) == rows, "segment ", i, ": positions must be [", rows,
                "]");
    s.full = rows == L;
    if (seg.group != nullptr) {
      const int P = seg.group->size(), rank = seg.group->rank();
      TORCH_CHECK(n == 1, "segment ", i, ": a sequence-parallel share is the only segment of its forward");
      TORCH_CHECK(heads % P == 0, "segment ", i, ": ", heads, " heads do not split over ", P, " ranks");
      const int64_t computed = std::accumulate(seg.group_rows.begin(), seg.group_rows.end(), int64_t{0});
      TORCH_CHECK(static_cast<int>(seg.group_rows.size()) == P && seg.group_rows[rank] == rows &&
                      (seg.kv != nullptr ? computed <= L : computed == L),
                  "segment ", i, ": group_rows must give every rank's rows (this rank's: ", rows, ") summing to ",
                  seg.kv != nullptr ? "at most " : "", L);
      TORCH_CHECK(seg.full_blocks == 0, "segment ", i, ": a sequence-parallel share recomputes no prefix");
      if (seg.kv != nullptr) {
        TORCH_CHECK(seg.sink == nullptr, "segment ", i, ": a masked sequence-parallel share records no K/V");
        TORCH_CHECK(seg.group_positions.defined() && seg.group_positions.dim() == 1 &&
                        seg.group_positions.size(0) == computed,
                    "segment ", i, ": a masked sequence-parallel share needs group_positions [", computed, "]");
        s.group_positions_device = seg.group_positions.to(device, at::kLong);
      }
      TORCH_CHECK(seg.group->device() == device, "segment ", i, ": rank ", rank, " of its group computes on ",
                  seg.group->device(), ", the model on ", device);
    }
    TORCH_CHECK(s.full || seg.kv != nullptr || seg.group != nullptr, "segment ", i, ": computing ", rows, " of ", L,
                " positions needs a KvSource");
    TORCH_CHECK(seg.full_blocks >= 0 && seg.full_blocks <= cfg.depth(), "segment ", i, ": full_blocks is ",
                seg.full_blocks, ", expected 0 .. ", cfg.depth());
    if (seg.full_blocks > 0) {
      TORCH_CHECK(!seg.positions.defined() && s.full, "segment ", i,
                  ": a recomputed prefix runs on the whole sequence's rows (positions undefined)");
      TORCH_CHECK(seg.sink == nullptr, "segment ", i, ": a recomputed prefix records no K/V");
      TORCH_CHECK(seg.full_blocks == cfg.depth() || seg.kv != nullptr, "segment ", i, ": keeping rows after ",
                  seg.full_blocks, " blocks needs a KvSource");
      TORCH_CHECK(seg.keep_positions.defined() && seg.keep_positions.dim() == 1, "segment ", i,
                  ": a recomputed prefix needs keep_positions");
      s.keep = seg.keep_positions.to(at::kCPU, at::kLong).contiguous();
      const int64_t kept = s.keep.size(0);
      const int64_t* k = s.keep.data_ptr<int64_t>();
      for (int64_t j = 0; j < kept; ++j) {
        TORCH_CHECK(k[j] >= 0 && k[j] < L && (j == 0 || k[j] > k[j - 1]), "segment ", i,
                    ": keep_positions must ascend within [0, ", L, ")");
        s.keep_text += k[j] < s.rt;
      }
      TORCH_CHECK(kept > s.keep_text, "segment ", i, ": keep_positions keeps no image row");
    }

    if (seg.rope_cos.defined() || seg.rope_sin.defined()) {
      const std::vector<int64_t> table{rows, cfg.head_dim() / 2};
      TORCH_CHECK(seg.rope_cos.defined() && seg.rope_sin.defined() && seg.rope_cos.sizes() == at::IntArrayRef(table) &&
                      seg.rope_sin.sizes() == at::IntArrayRef(table),
                  "segment ", i, ": rope_cos and rope_sin must both be [", rows, ", ", cfg.head_dim() / 2, "]");
      s.cos = seg.rope_cos.to(table_opts);
      s.sin = seg.rope_sin.to(table_opts);
    } else {
      auto ids = s.rt > 0 ? at::cat({seg.txt_ids.to(at::kCPU, at::kFloat), seg.img_ids.to(at::kCPU, at::kFloat)})
                          : seg.img_ids.to(at::kCPU, at::kFloat);
      auto [cos, sin] = flux2_rope_angles(ids, cfg.axes_dim, cfg.theta);
      s.cos = cos.to(table_opts);
      s.sin = sin.to(table_opts);
    }
    if (seg.positions_on_device.defined() && seg.positions_on_device.device() == device) {
      TORCH_CHECK(seg.positions_on_device.sizes() == s.positions.sizes(), "segment ", i,
                  ": positions_on_device must be [", rows, "]");
      s.positions_device = seg.positions_on_device;
    }
    // A session's precomputed embedding, else made here from the value.
    auto embedding = [&](const at::Tensor& given, double value, const char* name) {
      if (!given.defined()) return flux2_timestep_embedding(value, cfg.time_embed_dim).to(opts);
      TORCH_CHECK(given.dim() == 1 && given.size(0) == cfg.time_embed_dim, "segment ", i, ": ", name, " must be [",
                  cfg.time_embed_dim, "]");
      return given.to(opts);
    };

    const at::Tensor cs = round.segment_coefficients(i);
    const at::Tensor t_emb = embedding(seg.time_embedding, seg.timestep, "time_embedding");
    at::Tensor vec = linear(w.time_in1, at::silu(linear(w.time_in0, t_emb, cs)), cs);
    if (cfg.guidance_embed) {
      const at::Tensor g_emb = embedding(seg.guidance_embedding, seg.guidance, "guidance_embedding");
      vec = vec + linear(w.guidance_in1, at::silu(linear(w.guidance_in0, g_emb, cs)), cs);
    }
    const at::Tensor act = at::silu(vec).unsqueeze(0);
    s.mod_img = linear(w.mod_img, act, cs).chunk(6, 1);
    s.mod_txt = linear(w.mod_txt, act, cs).chunk(6, 1);
    s.mod_single = linear(w.mod_single, act, cs).chunk(3, 1);
    s.mod_final = linear(w.final_ada, act, cs).chunk(2, 1);

    if (s.rt > 0) txt_parts.push_back(seg.txt.to(opts));
    img_parts.push_back(seg.img.to(opts));
    txt_rows.push_back(s.rt);
    img_rows.push_back(s.ri);
    all_rows.push_back(rows);
  }
  Packing pt = packing(txt_rows), pi = packing(img_rows), pa = packing(all_rows);
  // Each packed row's LoRA coefficients (text, image and joined rows), following the packing.
  at::Tensor ct, ci, ca;
  auto update_coefficients = [&] {
    if (round.empty()) return;
    ct = round.row_coefficients(txt_rows);
    ci = round.row_coefficients(img_rows);
    ca = round.row_coefficients(all_rows);
  };
  update_coefficients();
  int64_t total_txt = std::accumulate(txt_rows.begin(), txt_rows.end(), int64_t{0});
  at::Tensor x_txt = total_txt > 0 ? linear(w.txt_in, concat_rows(txt_parts), ct) : at::empty({0, H}, opts);
  at::Tensor x_img = linear(w.img_in, concat_rows(img_parts), ci);
  at::Tensor x;  // the single blocks' joined rows

  // After `block`, the segments whose recomputed prefix ends there drop to their kept rows;
  // the packing of every stream follows.
  auto end_prefixes_after = [&](int block) {
    bool any = false;
    for (const SegmentState& s : states) any = any || s.seg->full_blocks == block + 1;
    if (!any) return;
    const bool joined = block >= cfg.double_blocks;
    std::vector<at::Tensor> txt, img, all;
    for (size_t i = 0; i < n; ++i) {
      SegmentState& s = states[i];
      const bool ends = s.seg->full_blocks == block + 1;
      if (joined) {
        all.push_back(ends ? pa.slice(x, i).index_select(0, s.keep.to(device)) : pa.slice(x, i));
      } else {
        at::Tensor t = pt.slice(x_txt, i), im = pi.slice(x_img, i);
        if (ends) {
          t = t.index_select(0, s.keep.narrow(0, 0, s.keep_text).to(device));
          im = im.index_select(0, (s.keep.narrow(0, s.keep_text, s.keep.size(0) - s.keep_text) - s.rt).to(device));
        }
        txt.push_back(t);
        img.push_back(im);
      }
      if (ends) keep_rows_only(s, device);
      txt_rows[i] = s.rt;
      img_rows[i] = s.ri;
      all_rows[i] = s.rt + s.ri;
    }
    if (joined) {
      x = at::cat(all, 0).contiguous();
    } else {
      x_txt = at::cat(txt, 0).contiguous();
      x_img = at::cat(img, 0).contiguous();
    }
    pt = packing(txt_rows);
    pi = packing(img_rows);
    pa = packing(all_rows);
    update_coefficients();
    total_txt = std::accumulate(txt_rows.begin(), txt_rows.end(), int64_t{0});
  };

  // Double blocks: two streams, each with its own weights, attending jointly.
  for (int b = 0; b < cfg.double_blocks; ++b) {
    const DoubleBlock& blk = w.doubles[b];
    at::Tensor ht = pre_norm(x_txt, fused), hi = pre_norm(x_img, fused);
    for (size_t i = 0; i < n; ++i) {
      modulate_rows(pt.slice(x_txt, i), pt.slice(ht, i), states[i].mod_txt[0], states[i].mod_txt[1], fused);
      modulate_rows(pi.slice(x_img, i), pi.slice(hi, i), states[i].mod_img[0], states[i].mod_img[1], fused);
    }
    const at::Tensor qkv_t = total_txt > 0 ? linear(blk.txt.qkv, ht, ct) : at::empty({0, 3 * H}, opts);
    const at::Tensor qkv_i = linear(blk.img.qkv, hi, ci);
    at::Tensor attn_t = at::empty({total_txt, H}, opts), attn_i = at::empty_like(x_img);
    for (size_t i = 0; i < n; ++i) {
      SegmentState& s = states[i];
      const at::Tensor t = pt.slice(qkv_t, i), im = pi.slice(qkv_i, i);
      const auto [q, k] = double_block_qk(blk, t, im, s.cos, s.sin, heads, fused);
      const at::Tensor v = at::cat({t.narrow(1, 2 * H, H), im.narrow(1, 2 * H, H)});
      const at::Tensor out = segment_attention(s, b, q, k, v, heads, scale);
      pt.slice(attn_t, i).copy_(out.narrow(0, 0, s.rt));
      pi.slice(attn_i, i).copy_(out.narrow(0, s.rt, s.ri));
    }
    const at::Tensor proj_t = total_txt > 0 ? linear(blk.txt.proj, attn_t, ct) : attn_t;
    const at::Tensor proj_i = linear(blk.img.proj, attn_i, ci);
    for (size_t i = 0; i < n; ++i) {
      pt.slice(x_txt, i).addcmul_(pt.slice(proj_t, i), states[i].mod_txt[2]);
      pi.slice(x_img, i).addcmul_(pi.slice(proj_i, i), states[i].mod_img[2]);
    }
    auto mlp = [&](const Stream& st, at::Tensor& x, const Packing& p, const at::Tensor& coef, bool text) {
      if (x.size(0) == 0) return;
      at::Tensor h = pre_norm(x, fused);
      for (size_t i = 0; i < n; ++i) {
        const auto& mod = text ? states[i].mod_txt : states[i].mod_img;
        modulate_rows(p.slice(x, i), p.slice(h, i), mod[3], mod[4], fused);
      }
      at::Tensor up = linear(st.mlp_in, h, coef);
      at::Tensor out = linear(st.mlp_out, at::silu(up.narrow(1, 0, M)).mul_(up.narrow(1, M, M)), coef);
      for (size_t i = 0; i < n; ++i) {
        const auto& mod = text ? states[i].mod_txt : states[i].mod_img;
        p.slice(x, i).addcmul_(p.slice(out, i), mod[5]);
      }
    };
    mlp(blk.txt, x_txt, pt, ct, true);
    mlp(blk.img, x_img, pi, ci, false);
    if (trace != nullptr) {
      trace->double_img.push_back(x_img.to(at::kCPU, at::kFloat).clone());
      trace->double_txt.push_back(x_txt.to(at::kCPU, at::kFloat).clone());
    }
    end_prefixes_after(b);
  }

  // Single blocks: one stream over [text, image] rows of each segment.
  std::vector<at::Tensor> joined;
  for (size_t i = 0; i < n; ++i) {
    if (states[i].rt > 0) joined.push_back(pt.slice(x_txt, i));
    joined.push_back(pi.slice(x_img, i));
  }
  x = concat_rows(joined).contiguous();
  for (int sb = 0; sb < cfg.single_blocks; ++sb) {
    const SingleBlock& blk = w.singles[sb];
    const int block = cfg.double_blocks + sb;
    at::Tensor h = pre_norm(x, fused);
    for (size_t i = 0; i < n; ++i) {
      modulate_rows(pa.slice(x, i), pa.slice(h, i), states[i].mod_single[0], states[i].mod_single[1], fused);
    }
    const at::Tensor y = linear(blk.linear1, h, ca);  // [R, 3H + 2M]: q, k, v, then the MLP's gate and up halves
    at::Tensor inner = at::empty({x.size(0), H + M}, opts);
    for (size_t i = 0; i < n; ++i) {
      SegmentState& s = states[i];
      const at::Tensor ys = pa.slice(y, i);
      const auto [q, k] = single_block_qk(blk, ys, s.cos, s.sin, heads, fused);
      const at::Tensor v = ys.narrow(1, 2 * H, H);
      pa.slice(inner, i).narrow(1, 0, H).copy_(segment_attention(s, block, q, k, v, heads, scale));
    }
    inner.narrow(1, H, M).copy_(at::silu(y.narrow(1, 3 * H, M)).mul_(y.narrow(1, 3 * H + M, M)));
    const at::Tensor out = linear(blk.linear2, inner, ca);
    for (size_t i = 0; i < n; ++i) pa.slice(x, i).addcmul_(pa.slice(out, i), states[i].mod_single[2]);
    if (trace != nullptr) trace->single.push_back(x.to(at::kCPU, at::kFloat).clone());
    end_prefixes_after(block);
  }

  // Final layer on the image rows.
  std::vector<at::Tensor> outs;
  for (size_t i = 0; i < n; ++i) {
    const at::Tensor rows = pa.slice(x, i).narrow(0, states[i].rt, states[i].ri);
    at::Tensor h = pre_norm(rows, fused);
    modulate_rows(rows, h, states[i].mod_final[0], states[i].mod_final[1], fused);
    outs.push_back(h);
  }
  return linear(w.final_linear, concat_rows(outs), ci).to(at::kFloat);
}

}  // namespace infill
