// The fused norm kernels (kernels/fused_norms.h) and the transformer that runs them
// (Flux2Transformer::with_fused_norms). Here rather than in tests/kernels: the [cuda] cases run
// on a GPU machine through scripts/gpu_check.sh, which runs this suite's [cuda] tests.
// Without a GPU: the refusals, naming the device. On a GPU ([cuda]): each kernel against the
// upstream formula in float64 plain libtorch ops, in float32, fp16 and bf16, over strided rows;
// the transformer's forward with them against its forward without.
#include "support/catch.h"
#include "support/cuda_device.h"
#include "support/flux2_requests.h"

#include <vector>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/Exception.h>

#include "kernels/fused_norms.h"
#include "model/flux2_transformer.h"

using namespace infill::test;
using infill::kernels::fused_layer_norm_modulate;
using infill::kernels::fused_norms_unavailable;
using infill::kernels::fused_rms_norm_rope;

namespace {

constexpr double kEps = 1e-6;

// max |ours - reference| / max |reference|, in float64 on the CPU.
double max_relative(const at::Tensor& ours, const at::Tensor& reference) {
  const at::Tensor a = ours.to(at::kDouble).cpu(), b = reference.to(at::kDouble).cpu();
  return (a - b).abs().max().item<double>() / b.abs().max().item<double>();
}

// Upstream FLUX.2's QK norm then RoPE (flux2/src/flux2/model.py: RMSNorm, apply_rope), in
// float64: x [R, heads * d], scale [d], cos and sin [R, d / 2].
at::Tensor rms_norm_rope_reference(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& cos,
                                   const at::Tensor& sin, int64_t heads) {
  const int64_t r = x.size(0), d = scale.size(0);
  const at::Tensor xv = x.to(at::kDouble).cpu().reshape({r, heads, d});
  const at::Tensor normed = xv * at::rsqrt(xv.pow(2).mean(-1, true) + kEps) * scale.to(at::kDouble).cpu();
  const at::Tensor pairs = normed.reshape({r, heads, d / 2, 2});
  const at::Tensor x0 = pairs.select(3, 0), x1 = pairs.select(3, 1);
  const at::Tensor c = cos.to(at::kDouble).cpu().unsqueeze(1), s = sin.to(at::kDouble).cpu().unsqueeze(1);
  return at::stack({c * x0 - s * x1, s * x0 + c * x1}, 3).reshape({r, heads * d});
}

// torch.nn.LayerNorm without affine weights, then (1 + scale) * x + shift, in float64.
at::Tensor layer_norm_modulate_reference(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale) {
  const at::Tensor xd = x.to(at::kDouble).cpu();
  const at::Tensor normed = at::layer_norm(xd, {xd.size(1)}, {}, {}, kEps);
  return normed * (1 + scale.to(at::kDouble).cpu().reshape({1, -1})) + shift.to(at::kDouble).cpu().reshape({1, -1});
}

// The tolerance of one dtype against float64: float32's sums in another order; fp16 and bf16
// store the result (and, as upstream, two intermediate values) rounded: 2^-11 and 2^-8
// relative each, a few of them per value.
double tolerance(at::ScalarType dtype) {
  return dtype == at::kFloat ? 1e-5 : dtype == at::kHalf ? 4e-3 : 2e-2;
}

}  // namespace

TEST_CASE("The fused norms are refused off a GPU, naming the device and the input", "[fused-norms]") {
  const std::string cpu = fused_norms_unavailable(at::Device(at::kCPU));
  CHECK_THAT(cpu, Catch::StartsWith("cpu:") && Catch::Contains("CUDA kernels"));
  const at::Tensor x = at::randn({3, 16});
  try {
    fused_layer_norm_modulate(x, at::zeros({16}), at::zeros({16}), at::empty_like(x), kEps);
    FAIL("a CPU tensor was accepted");
  } catch (const c10::Error& e) {
    CHECK_THAT(e.what_without_backtrace(), Catch::StartsWith("x: cpu:"));
  }
  CHECK_THROWS_WITH(fused_rms_norm_rope(x, at::ones({8}), at::ones({3, 4}), at::zeros({3, 4}), 2, kEps, at::empty_like(x)),
                    Catch::Contains("x: cpu:"));

  c10::InferenceMode guard;
  const Flux2Transformer model = Flux2Transformer::random(small_config(), 3, at::kBFloat16);
  CHECK_FALSE(model.fused_norms());
  CHECK(model.rope_table_dtype() == at::kFloat);  // the CPU computes in float32
  auto refused = model.with_fused_norms();
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(refused.status().message(), Catch::Contains("fused norms: cpu:"));
}

TEST_CASE("The fused QK RMSNorm with RoPE equals upstream's formula in float32 fp16 and bf16 over strided rows",
          "[fused-norms][cuda]") {
  const at::Device cuda = require_cuda_or_skip().torch_device();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(17);
  // (heads, head width): klein's 128 (two pairs per lane), a width below a warp's pairs, and one
  // above two.
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{24, 128}, {3, 16}, {2, 160}};
  for (const at::ScalarType dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
    for (const auto& [heads, d] : shapes) {
      for (const int64_t rows : {1, 7, 300}) {
        for (const bool float_tables : {false, true}) {
          INFO("dtype " << dtype << ", heads " << heads << ", d " << d << ", rows " << rows << ", tables "
                        << (float_tables ? "float32" : "as x"));
          const int64_t H = heads * d;
          // q and k as slices of a qkv projection (row stride 3H), values far from unit scale.
          const at::Tensor qkv = (at::empty({rows, 3 * H}).normal_(0, 1, gen) * 7 + 2).to(cuda, dtype);
          const at::Tensor k = qkv.narrow(1, H, H);
          const at::Tensor scale = at::empty({d}).uniform_(0.5, 1.5, gen).to(cuda, dtype);
          const at::Tensor angles = at::empty({rows, d / 2}).uniform_(-6.3, 6.3, gen);
          const at::ScalarType table_type = float_tables ? at::kFloat : dtype;
          const at::Tensor cos = angles.cos().to(cuda, table_type), sin = angles.sin().to(cuda, table_type);
          // Into rows [2, 2 + rows) of a larger buffer: the rows around stay as they were.
          const at::Tensor buffer = at::full({rows + 4, H}, 42.0, at::TensorOptions().device(cuda).dtype(dtype));
          const at::Tensor out = buffer.narrow(0, 2, rows);
          fused_rms_norm_rope(k, scale, cos, sin, heads, kEps, out);
          const double difference = max_relative(out, rms_norm_rope_reference(k, scale, cos, sin, heads));
          CHECK(difference <= tolerance(dtype));
          CHECK(buffer.narrow(0, 0, 2).eq(42).all().item<bool>());
          CHECK(buffer.narrow(0, rows + 2, 2).eq(42).all().item<bool>());
        }
      }
    }
  }
}

TEST_CASE("The fused LayerNorm with its modulation equals LayerNorm then (1 + scale) x + shift in float64",
          "[fused-norms][cuda]") {
  const at::Device cuda = require_cuda_or_skip().torch_device();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(23);
  for (const at::ScalarType dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
    // klein's and dev's widths, one not a multiple of a warp, and a single channel.
    for (const int64_t width : {3072, 6144, 100, 1}) {
      for (const int64_t rows : {1, 5, 257}) {
        INFO("dtype " << dtype << ", width " << width << ", rows " << rows);
        const auto opts = at::TensorOptions().device(cuda).dtype(dtype);
        // Rows of a wider buffer (row stride width + 8), far from zero mean: the two-pass
        // variance's case.
        const at::Tensor wide = (at::empty({rows, width + 8}).normal_(0, 1, gen) * 3 + 50).to(opts);
        const at::Tensor x = wide.narrow(1, 4, width);
        // shift and scale as chunks of one modulation row, as the transformer's are.
        const at::Tensor mod = (at::empty({1, 2 * width}).normal_(0, 1, gen) * 0.5).to(opts);
        const at::Tensor shift = mod.narrow(1, 0, width), scale = mod.narrow(1, width, width);
        const at::Tensor out = at::full({rows, width}, 42.0, opts);
        fused_layer_norm_modulate(x, shift, scale, out, kEps);
        // (One channel normalises to 0: the row is its shift.)
        CHECK(max_relative(out, layer_norm_modulate_reference(x, shift, scale)) <= tolerance(dtype));
        // In place (out = x), as a segment's rows of a packed round.
        const at::Tensor again = x.clone();
        fused_layer_norm_modulate(again, shift, scale, again, kEps);
        CHECK(max_relative(again, out) == 0);
      }
    }
  }
}

TEST_CASE("The fused norms check their inputs on a GPU, naming the input and what was expected",
          "[fused-norms][cuda]") {
  const at::Device cuda = require_cuda_or_skip().torch_device();
  const auto opts = at::TensorOptions().device(cuda).dtype(at::kBFloat16);
  const at::Tensor x = at::randn({4, 64}, opts), out = at::empty({4, 64}, opts);
  const at::Tensor cos = at::ones({4, 16}, opts), sin = at::zeros({4, 16}, opts);
  CHECK_THROWS_WITH(fused_rms_norm_rope(x, at::ones({32}, opts), cos, sin, 3, kEps, out),
                    Catch::Contains("64 channels do not split into 3 heads"));
  CHECK_THROWS_WITH(fused_rms_norm_rope(x, at::ones({32}, opts.dtype(at::kFloat)), cos, sin, 2, kEps, out),
                    Catch::Contains("scale must be BFloat16"));
  CHECK_THROWS_WITH(fused_rms_norm_rope(x, at::ones({32}, opts), at::ones({3, 16}, opts), sin, 2, kEps, out),
                    Catch::Contains("cos must be [4, 16]"));
  CHECK_THROWS_WITH(fused_rms_norm_rope(x, at::ones({32}, opts), cos, sin, 2, kEps, at::empty({4, 32}, opts)),
                    Catch::Contains("out must be [4, 64]"));
  CHECK_THROWS_WITH(fused_rms_norm_rope(x.t().contiguous().t(), at::ones({32}, opts), cos, sin, 2, kEps, out),
                    Catch::Contains("x's channels must be contiguous"));
  CHECK_THROWS_WITH(fused_layer_norm_modulate(x, at::zeros({63}, opts), at::zeros({64}, opts), out, kEps),
                    Catch::Contains("shift must hold 64 values"));
  CHECK_THROWS_WITH(fused_layer_norm_modulate(x, at::zeros({64}, opts), at::zeros({64}, opts), out.cpu(), kEps),
                    Catch::Contains("out must be BFloat16 on cuda:0"));
  CHECK_THROWS_WITH(fused_layer_norm_modulate(x.to(at::kDouble), at::zeros({64}, opts.dtype(at::kDouble)),
                                              at::zeros({64}, opts.dtype(at::kDouble)), out.to(at::kDouble), kEps),
                    Catch::Contains("x must be float32, float16 or bfloat16"));
}

TEST_CASE("FLUX.2 with the fused norms on CUDA equals its forward without them, full and mask-aware",
          "[fused-norms][cuda]") {
  const infill::ComputeDevice cuda = require_cuda_or_skip();
  c10::InferenceMode guard;
  const Flux2Config cfg = small_config();
  const Request r = make_request(cfg, 6, 4, 5, /*reference=*/true, 3);
  const at::Tensor no_txt = at::empty({0}, at::kLong), rows = at::tensor(std::vector<int64_t>{0, 1, 6, 7, 19});
  const at::Tensor some_txt = at::tensor(std::vector<int64_t>{1, 4});
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    INFO("dtype " << dtype);
    Flux2Transformer plain = Flux2Transformer::random(cfg, 5, at::kFloat);
    REQUIRE(plain.to_device(cuda, dtype).ok());
    auto made = plain.with_fused_norms();
    REQUIRE(made.ok());
    const Flux2Transformer& fused = *made;
    CHECK(fused.fused_norms());
    CHECK_FALSE(plain.fused_norms());
    CHECK(fused.weight_bytes() == plain.weight_bytes());  // the weights are shared
    // The kernels read float32 tables (as upstream keeps pe); libtorch's ops the compute dtype.
    CHECK(fused.rope_table_dtype() == at::kFloat);
    CHECK(plain.rope_table_dtype() == dtype);
    // float32: the sums in another order; bf16: upstream's rounding points against libtorch's
    // composition, which rounds after every op.
    const double limit = dtype == at::kFloat ? 1e-4 : 3e-2;

    MemoryKv kv(true);
    Flux2Segment prepare = full_segment(r, 0.6);
    prepare.sink = &kv;
    const at::Tensor plain_full = forward_one(plain, prepare);
    const at::Tensor fused_full = forward_one(fused, full_segment(r, 0.6));
    CHECK(max_relative(fused_full, plain_full) <= limit);
    // Both against the same weights' float32 forward on the CPU, the numbers bf16 rounds.
    const at::Tensor exact = forward_one(Flux2Transformer::random(cfg, 5, at::kFloat), full_segment(r, 0.6));
    CHECK(max_relative(fused_full, exact) <= limit);
    CHECK(max_relative(plain_full, exact) <= limit);
    WARN("full step against float32 on the CPU, " << dtype << ": fused " << max_relative(fused_full, exact)
                                                    << ", libtorch's " << max_relative(plain_full, exact));
    // Masked, prompt-keyed (image rows only) and template-keyed (some text rows too), packed.
    std::vector<Flux2Segment> round = {masked_segment(r, no_txt, rows, 0.6, &kv),
                                       masked_segment(r, some_txt, rows, 0.6, &kv)};
    const at::Tensor plain_masked = plain.forward(round), fused_masked = fused.forward(round);
    CHECK(max_relative(fused_masked, plain_masked) <= limit);
    WARN("fused norms vs libtorch's, " << dtype << ": full " << max_relative(fused_full, plain_full) << ", masked "
                                       << max_relative(fused_masked, plain_masked));
  }
}
