// FP8 weights on a GPU (model/float8_linear.h, Flux2Transformer::with_float8_weights): refused,
// naming the device, where they cannot run (the CPU, a libtorch without FP8); on a GPU of
// compute capability 8.9+ ([cuda]) the codes and scales against plain libtorch ops, the FP8
// product against the same product of the dequantized operands, and the transformer's forward
// against its bf16 forward.
#include "support/catch.h"
#include "support/cuda_device.h"
#include "support/float8_files.h"
#include "support/flux2_requests.h"
#include "support/temp_dir.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "model/device_memory.h"
#include "model/float8_linear.h"
#include "model/flux2_checkpoint.h"
#include "model/flux2_layers.h"  // white-box: the codes each layer holds
#include "model/flux2_transformer.h"
#include "model/reference_check.h"
#include "model/torch_compat.h"

using namespace infill::test;

TEST_CASE("FP8 weights are refused where they cannot run: the CPU and a libtorch without FP8", "[float8]") {
  const infill::Status cpu = infill::float8_compute_status(infill::ComputeDevice{});
  CHECK_FALSE(cpu.ok());
  CHECK_THAT(cpu.message(), Catch::StartsWith("cpu:") && Catch::Contains("CUDA devices"));
  const infill::Status gpu = infill::float8_compute_status(infill::ComputeDevice{true, 0});
  if (!INFILL_TORCH_HAS_FLOAT8_MM || infill::cuda_device_count() == 0) {
    CHECK_FALSE(gpu.ok());
    CHECK_THAT(gpu.message(), Catch::StartsWith("cuda:0"));
  }

  c10::InferenceMode guard;
  const Flux2Transformer model = Flux2Transformer::random(small_config(), 3, at::kBFloat16);
  CHECK(model.float8_layers() == 0);
  auto refused = model.with_float8_weights();
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(refused.status().message(), Catch::StartsWith("cpu:") && Catch::Contains("FP8"));
  // Loading straight into FP8 needs such a device too; the model stays where it was.
  Flux2Transformer on_cpu = Flux2Transformer::random(small_config(), 3, at::kBFloat16);
  const infill::Status to_cpu = on_cpu.to_device_float8(infill::ComputeDevice{});
  CHECK_THAT(to_cpu.message(), Catch::StartsWith("cpu:") && Catch::Contains("CUDA devices"));
  if (!gpu.ok()) {
    const infill::Status to_gpu = on_cpu.to_device_float8(infill::ComputeDevice{true, 0});
    CHECK_THAT(to_gpu.message(), Catch::StartsWith("cuda:0"));
  }
  CHECK(on_cpu.device().is_cpu());
  CHECK(on_cpu.float8_layers() == 0);
}

#if INFILL_TORCH_HAS_FLOAT8_MM

namespace {

// cuda:0 when it multiplies FP8, or exits with 4 (skipped) naming why not.
infill::ComputeDevice require_float8_or_skip() {
  const infill::ComputeDevice cuda = require_cuda_or_skip();
  const infill::Status usable = infill::float8_compute_status(cuda);
  if (!usable.ok()) {
    WARN("SKIPPED: " << usable.message());
    std::fprintf(stderr, "SKIPPED: %s\n", usable.message().c_str());
    std::exit(4);
  }
  return cuda;
}

double max_relative(const at::Tensor& ours, const at::Tensor& reference) {
  const at::Tensor a = ours.to(at::kDouble).cpu(), b = reference.to(at::kDouble).cpu();
  return (a - b).abs().max().item<double>() / b.abs().max().item<double>();
}

}  // namespace

TEST_CASE("FP8 rows on CUDA: codes and scales against plain ops and the product against the dequantized operands",
          "[float8][cuda]") {
  const infill::ComputeDevice cuda = require_float8_or_skip();
  c10::InferenceMode guard;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  // Rows of very different magnitudes, and a row of zeros.
  at::Tensor w = at::empty({96, 160}).normal_(0, 0.02, gen);
  w.narrow(0, 0, 8).mul_(50);
  w[5].zero_();
  const at::Tensor w_gpu = w.to(cuda.torch_device(), at::kBFloat16);
  const infill::Float8Weight q = infill::quantize_float8_rows(w_gpu);
  REQUIRE(q.codes.scalar_type() == c10::ScalarType::Float8_e4m3fn);
  REQUIRE(q.codes.sizes() == w.sizes());
  REQUIRE(q.scale.sizes() == at::IntArrayRef({1, 96}));
  const at::Tensor wb = w_gpu.to(at::kFloat).cpu();
  const at::Tensor amax = wb.abs().amax(1);
  const at::Tensor scale = q.scale.reshape({-1}).cpu();
  CHECK(scale[5].item<float>() == 1.0f);
  const at::Tensor nonzero = amax > 0;
  CHECK(at::allclose(scale.masked_select(nonzero), amax.masked_select(nonzero) / 448.0, 1e-6, 0));
  // Each value within half a step of E4M3: 2^-4 relative for normals, half the subnormal step
  // (2^-10 of the row's scale) below them.
  const at::Tensor dequantized = q.codes.to(at::kFloat).cpu() * scale.reshape({-1, 1});
  const at::Tensor bound = wb.abs() * std::ldexp(1.0, -4) + scale.reshape({-1, 1}) * std::ldexp(1.0, -10);
  CHECK((dequantized - wb).abs().le(bound * 1.0001).all().item<bool>());
  CHECK(at::allclose(infill::dequantize_float8_rows(q, at::kFloat).cpu(), dequantized));

  for (const int64_t m : {int64_t{1}, int64_t{7}, int64_t{300}}) {
    const at::Tensor x = at::empty({m, 160}).normal_(0, 1, gen).to(cuda.torch_device(), at::kBFloat16);
    const at::Tensor y = infill::float8_linear(x, q);
    REQUIRE(y.sizes() == at::IntArrayRef({m, 96}));
    CHECK(y.scalar_type() == at::kBFloat16);
    // The reference: x's rows quantized with plain ops (max |row| / 448, E4M3), both operands
    // dequantized and multiplied in float64; ours differs by the bf16 rounding of the output.
    const at::Tensor xf = x.to(at::kFloat);
    const at::Tensor x_scale = xf.abs().amax(1, true) / 448.0;
    const at::Tensor x_deq = (xf / x_scale).to(c10::ScalarType::Float8_e4m3fn).to(at::kFloat) * x_scale;
    const at::Tensor reference = at::matmul(x_deq.to(at::kDouble), dequantized.to(at::kDouble).t().to(x.device()));
    INFO(m << " rows");
    CHECK(max_relative(y, reference) <= 1e-2);
    // Against the bf16 product: E4M3's rounding of both operands.
    CHECK(max_relative(y, at::linear(x, w_gpu)) <= 0.125);
  }
  // A vector and no rows at all.
  const at::Tensor v = at::empty({160}).normal_(0, 1, gen).to(cuda.torch_device(), at::kBFloat16);
  CHECK(infill::float8_linear(v, q).sizes() == at::IntArrayRef({96}));
  CHECK(infill::float8_linear(v.narrow(0, 0, 0).reshape({0, 160}), q).size(0) == 0);
}

TEST_CASE("FLUX.2 with FP8 block weights on CUDA: close to bf16, full and mask-aware, and refuses to move or save",
          "[float8][cuda]") {
  const infill::ComputeDevice cuda = require_float8_or_skip();
  c10::InferenceMode guard;
  Flux2Transformer bf16 = Flux2Transformer::random(small_config(), 5, at::kFloat);
  REQUIRE(bf16.to_device(cuda, at::kBFloat16).ok());
  auto made = bf16.with_float8_weights();
  REQUIRE(made.ok());
  Flux2Transformer& fp8 = *made;
  // Every block projection: 4 per stream of each double block, 2 per single block.
  const Flux2Config cfg = small_config();
  CHECK(fp8.float8_layers() == 8 * cfg.double_blocks + 2 * cfg.single_blocks);
  CHECK(bf16.float8_layers() == 0);
  CHECK(fp8.weight_bytes() < bf16.weight_bytes() * 0.6);
  CHECK(fp8.compute_dtype() == at::kBFloat16);

  const Request r = make_request(cfg, 6, 4, 5, /*reference=*/true, 3);
  MemoryKv kv(true);
  Flux2Segment prepare = full_segment(r, 0.6);
  prepare.sink = &kv;
  const at::Tensor ref_full = forward_one(bf16, prepare);
  const at::Tensor f8_full = forward_one(fp8, full_segment(r, 0.6));
  const double full_difference = max_relative(f8_full, ref_full);
  CHECK(full_difference <= infill::kReferenceToleranceFloat8);
  CHECK(full_difference > 0);  // the FP8 layers did run
  // A masked step over the bf16 prepare's K/V: the rows' own difference.
  const at::Tensor no_txt = at::empty({0}, at::kLong), rows = at::tensor(std::vector<int64_t>{0, 1, 6, 7, 19});
  const at::Tensor ref_masked = forward_one(bf16, masked_segment(r, no_txt, rows, 0.6, &kv));
  const at::Tensor f8_masked = forward_one(fp8, masked_segment(r, no_txt, rows, 0.6, &kv));
  CHECK(max_relative(f8_masked, ref_masked) <= infill::kReferenceToleranceFloat8);
  WARN("FP8 block weights vs bf16: full " << full_difference << ", masked " << max_relative(f8_masked, ref_masked));

  CHECK_FALSE(fp8.to_device(cuda, at::kBFloat16).ok());
  const infill::Status saved = fp8.save("/nonexistent/never-written.safetensors");
  CHECK_FALSE(saved.ok());
  CHECK_THAT(saved.message(), Catch::Contains("FP8"));
  auto again = fp8.with_float8_weights();  // already FP8: nothing more to do, the same layers
  REQUIRE(again.ok());
  CHECK(again->float8_layers() == fp8.float8_layers());
}

TEST_CASE("FLUX.2 from an E4M3 file onto CUDA: the file's own codes and scales, quantized a layer at a time",
          "[float8][cuda]") {
  const infill::ComputeDevice cuda = require_float8_or_skip();
  c10::InferenceMode guard;
  // Enough block layers that the bf16 model is well over the FP8 one plus a layer's transients.
  Flux2Config cfg = small_config();
  cfg.hidden_size = 256;
  cfg.mlp_hidden = 768;
  cfg.single_blocks = 8;
  cfg.axes_dim = {16, 16, 16, 16};
  REQUIRE(cfg.validate().ok());
  TempDir dir;
  REQUIRE(Flux2Transformer::random(cfg, 8, at::kFloat).save(dir.file("original.safetensors")).ok());
  const Fp8Checkpoint q = quantize(float_tensors(dir.file("original.safetensors")), Quantizer(infill::Float8Format::kE4M3FN),
                                   Companions::kComfyQuant, "single_blocks.3.linear2.weight");
  write_raw(dir.file("fp8.safetensors"), q.fp8, q.metadata);
  auto load = [&] {
    auto checkpoint = infill::Flux2Checkpoint::open({dir.file("fp8.safetensors")});
    REQUIRE(checkpoint.ok());
    auto model = Flux2Transformer::load(*checkpoint);
    REQUIRE(model.ok());
    return std::move(*model);
  };
  auto stored = [&](const std::string& name) -> const RawTensor& {
    for (const RawTensor& t : q.fp8) {
      if (t.name == name) return t;
    }
    FAIL("no stored tensor " << name);
    return q.fp8.front();
  };
  auto memory = [&] {
    auto m = infill::cuda_device_memory(cuda.index);
    REQUIRE(m.ok());
    return *m;
  };

  // As the engine loads it: straight from the CPU, a layer at a time.
  Flux2Transformer streamed = load();
  const int64_t bf16_bytes = streamed.weight_bytes();
  int64_t largest_layer = 0;
  for (const RawTensor& t : q.fp8) {
    if (t.dtype == "F8_E4M3") largest_layer = std::max<int64_t>(largest_layer, 2 * static_cast<int64_t>(t.bytes.size()));
  }
  REQUIRE(infill::reset_cuda_memory_peak(cuda.index).ok());
  const int64_t before = memory().allocated_bytes;
  REQUIRE(streamed.to_device_float8(cuda).ok());
  const infill::DeviceMemory streamed_memory = memory();
  CHECK(streamed.float8_layers() == 8 * cfg.double_blocks + 2 * cfg.single_blocks);
  CHECK(streamed.device().is_cuda());
  CHECK(streamed.compute_dtype() == at::kBFloat16);

  // Every FP8 layer holds the file's bytes as its codes and the file's scales.
  Flux2Transformer::Weights weights = streamed.weights();  // tensors shared
  int compared = 0;
  for (auto& slot : weights.slots()) {
    if (slot.linear == nullptr || !slot.linear->scale.defined()) continue;
    INFO(slot.name);
    const RawTensor& file = stored(slot.name);
    const at::Tensor codes = slot.linear->w.view(at::kByte).cpu().contiguous();
    std::string held(static_cast<const char*>(codes.data_ptr()), codes.nbytes());
    std::string want = file.bytes;
    for (std::string* s : {&held, &want}) std::replace(s->begin(), s->end(), '\x80', '\0');  // -0 is 0
    CHECK(held == want);
    const RawTensor& scale = stored(slot.name.substr(0, slot.name.size() - 7) + ".weight_scale");
    const at::Tensor file_scale =
        at::from_blob(const_cast<char*>(scale.bytes.data()), scale.shape, at::kFloat).reshape({-1}).expand({slot.shape[0]});
    CHECK(at::equal(slot.linear->scale.cpu().reshape({-1}), file_scale));
    ++compared;
  }
  CHECK(compared == streamed.float8_layers());

  // The device held the FP8 model and one layer's transients (its bf16 and one float32 copy),
  // never the bf16 model that to_device then with_float8_weights goes through.
  const int64_t streamed_peak = streamed_memory.peak_allocated_bytes - before;
  const int64_t streamed_held = streamed_memory.allocated_bytes - before;
  CHECK(streamed_peak <= streamed_held + 4 * largest_layer + (int64_t{1} << 20));
  Flux2Transformer dense = load();
  REQUIRE(infill::reset_cuda_memory_peak(cuda.index).ok());
  const int64_t before_dense = memory().allocated_bytes;
  REQUIRE(dense.to_device(cuda, at::kBFloat16).ok());
  auto made = dense.with_float8_weights();
  REQUIRE(made.ok());
  const int64_t dense_peak = memory().peak_allocated_bytes - before_dense;
  CHECK(dense_peak >= bf16_bytes);
  CHECK(streamed_peak < dense_peak);
  WARN("device peak loading FP8: " << streamed_peak << " bytes a layer at a time, " << dense_peak
                                   << " through the bf16 model (" << bf16_bytes << " bytes)");

  // Both routes hold the same codes and scales: the same forward, bit for bit.
  const Request r = make_request(cfg, 5, 3, 4, /*reference=*/false, 2);
  CHECK(at::equal(forward_one(streamed, full_segment(r, 0.4)), forward_one(*made, full_segment(r, 0.4))));

  // Refused: a transformer already on the GPU (move the CPU one), and the CPU as the target.
  const infill::Status again = dense.to_device_float8(cuda);
  CHECK_FALSE(again.ok());
  CHECK_THAT(again.message(), Catch::Contains("from the CPU"));
  Flux2Transformer on_cpu = load();
  const infill::Status cpu = on_cpu.to_device_float8(infill::ComputeDevice{});
  CHECK_FALSE(cpu.ok());
  CHECK_THAT(cpu.message(), Catch::StartsWith("cpu:"));
  CHECK(on_cpu.device().is_cpu());
}

#endif
