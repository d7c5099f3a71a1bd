// The FLUX.2 transformer on a CUDA device, against the upstream reference tensors and against
// the CPU (plain float32 forward). Skipped (exit 4) without a CUDA device: scripts/gpu_check.sh
// runs them on a GPU machine.
#include "support/catch.h"
#include "support/cuda_device.h"
#include "support/flux2_requests.h"
#include "support/shared_data.h"
#include "support/temp_dir.h"

#include <cmath>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/InferenceMode.h>

#include "model/reference_check.h"
#include "kernels/masked_attention.h"
#include "model/attention_over_cache.h"
#include "model/row_attention.h"

using namespace infill::test;

namespace {

// bf16 keeps 8 significant bits: after a few blocks the outputs differ from float32 by up to
// a few percent of their largest value.
constexpr double kBf16Tolerance = 3e-2;

Flux2Transformer on_device(const Flux2Transformer& cpu_model, const infill::ComputeDevice& device,
                           at::ScalarType dtype, const std::string& path) {
  // A copy through a file: the weights the CPU model has, byte for byte.
  REQUIRE(cpu_model.save(path).ok());
  auto file = infill::SafetensorsFile::open(path);
  REQUIRE(file.ok());
  auto loaded = Flux2Transformer::load(*file, "");
  REQUIRE(loaded.ok());
  REQUIRE(loaded->to_device(device, dtype).ok());
  CHECK(loaded->device().is_cuda());
  return std::move(*loaded);
}

}  // namespace

TEST_CASE("FLUX.2 on CUDA reproduces the upstream reference tensors in float32 and bf16", "[cuda][shared]") {
  const infill::ComputeDevice cuda = require_cuda_or_skip();
  for (const std::string name : {"flux2_dit_klein", "flux2_dit_dev"}) {
    const std::string path = shared_path("testdata/flux2/" + name + ".safetensors");
    require_shared_or_skip({path});
    for (const bool bf16 : {false, true}) {
      infill::ReferenceCheckOptions options;
      options.device = cuda;
      options.bfloat16 = bf16;
      auto check = infill::run_reference_check(path, options);
      REQUIRE(check.ok());
      for (const auto& c : check->comparisons) {
        INFO(name << (bf16 ? " bf16 " : " float32 ") << c.name << ": max_rel_err " << c.max_rel_err);
        CHECK(c.max_rel_err <= options.tolerance());
      }
      CHECK(check->ok);
      WARN(name << " on " << cuda.name() << (bf16 ? " bf16" : " float32") << ": max_rel_err " << check->max_rel_err
                << " (tolerance " << options.tolerance() << ")");
    }
  }
}

TEST_CASE("FLUX.2 on CUDA equals the CPU forward, full and mask-aware, alone and packed", "[cuda]") {
  const infill::ComputeDevice cuda = require_cuda_or_skip();
  TempDir dir;
  Flux2Config cfg = small_config();
  cfg.guidance_embed = true;
  const Flux2Transformer cpu = Flux2Transformer::random(cfg, 5, at::kFloat);
  c10::InferenceMode guard;
  const Request r = make_request(cfg, 6, 4, 5, /*reference=*/true, 3);
  const double t = 0.6, g = 3.0;
  const at::Tensor no_txt = at::empty({0}, at::kLong), all_txt = at::arange(6, at::kLong);
  const at::Tensor rows = at::tensor(std::vector<int64_t>{0, 1, 6, 7, 19});

  MemoryKv cpu_kv(true);
  Flux2Segment prepare = full_segment(r, t, g);
  prepare.sink = &cpu_kv;
  const at::Tensor cpu_full = forward_one(cpu, prepare);

  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    const double tol = dtype == at::kFloat ? 1e-4 : kBf16Tolerance;
    const Flux2Transformer gpu = on_device(cpu, cuda, dtype, dir.path() + "/w.safetensors");
    MemoryKv gpu_kv(true);
    Flux2Segment gpu_prepare = full_segment(r, t, g);
    gpu_prepare.sink = &gpu_kv;
    const at::Tensor gpu_full = forward_one(gpu, gpu_prepare);
    INFO("dtype " << c10::toString(dtype));
    REQUIRE(gpu_full.device().is_cpu());
    CHECK(rel_err(gpu_full, cpu_full) <= tol);
    REQUIRE(gpu_kv.blocks() == static_cast<size_t>(cfg.depth()));

    for (const bool slabs : {true, false}) {
      MemoryKv kv(slabs);
      Flux2Segment p = full_segment(r, t, g);
      p.sink = &kv;
      forward_one(gpu, p);
      // Prompt-keyed (image rows only) and template-keyed (text rows too) against the GPU's
      // own full forward: the cache holds fp16, so float32 agrees to fp16 rounding.
      const double cache_tol = dtype == at::kFloat ? 2e-3 : kBf16Tolerance;
      const at::Tensor pk = forward_one(gpu, masked_segment(r, no_txt, rows, t, &kv, g));
      const at::Tensor tk = forward_one(gpu, masked_segment(r, all_txt, rows, t, &kv, g));
      INFO("slabs " << slabs);
      CHECK(rel_err(pk, gpu_full.index_select(0, rows)) <= cache_tol);
      CHECK(rel_err(tk, gpu_full.index_select(0, rows)) <= cache_tol);
      // The rows are really computed there: other inputs give other outputs.
      Request changed = r;
      changed.img = r.img.clone();
      changed.img.index_fill_(0, rows, 0.5);
      CHECK(rel_err(forward_one(gpu, masked_segment(changed, no_txt, rows, t, &kv, g)), gpu_full.index_select(0, rows)) >
            5e-2);
    }

    // Packed with a second request: each gets what it gets alone.
    const Request b = make_request(cfg, 3, 3, 3, true, 9);
    std::vector<Flux2Segment> segs{full_segment(b, 0.2, 1.0), masked_segment(r, no_txt, rows, t, &gpu_kv, g)};
    const at::Tensor packed = gpu.forward(segs);
    const at::Tensor alone_b = forward_one(gpu, full_segment(b, 0.2, 1.0));
    const at::Tensor alone_r = forward_one(gpu, masked_segment(r, no_txt, rows, t, &gpu_kv, g));
    REQUIRE(packed.size(0) == alone_b.size(0) + alone_r.size(0));
    CHECK(rel_err(packed.narrow(0, 0, alone_b.size(0)), alone_b) <= (dtype == at::kFloat ? 1e-5 : 1e-2));
    CHECK(rel_err(packed.narrow(0, alone_b.size(0), alone_r.size(0)), alone_r) <= (dtype == at::kFloat ? 1e-5 : 1e-2));
  }
}

TEST_CASE("row attention on CUDA equals plain matmul-softmax attention", "[cuda]") {
  const infill::ComputeDevice cuda = require_cuda_or_skip();
  c10::InferenceMode guard;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(17);
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (const int64_t m : {1, 37, 300}) {
      const int64_t l = 777, heads = 4, d = 128;
      const auto opts = at::TensorOptions().device(cuda.torch_device()).dtype(dtype);
      const at::Tensor q = at::empty({m, heads * d}).normal_(0, 1, gen).to(opts);
      const at::Tensor k = at::empty({l, heads * d}).normal_(0, 1, gen).to(opts);
      const at::Tensor v = at::empty({l, heads * d}).normal_(0, 1, gen).to(opts);
      const double scale = 1.0 / std::sqrt(static_cast<double>(d));
      const at::Tensor fast = infill::row_attention(q, k, v, heads, scale);
      const at::Tensor ref = infill::kernels::masked_attention_reference(q.to(at::kFloat), k.to(at::kFloat), v.to(at::kFloat),
                                                             heads, scale);
      INFO(c10::toString(dtype) << " m " << m);
      REQUIRE(fast.sizes() == ref.sizes());
      CHECK(fast.scalar_type() == dtype);
      CHECK(rel_err(fast.to(at::kCPU, at::kFloat), ref.to(at::kCPU)) <= (dtype == at::kFloat ? 1e-4 : 2e-2));
    }
  }
}

TEST_CASE("attention with fresh rows swapped into a device cache equals attention over a patched copy on CUDA",
          "[cuda]") {
  const infill::ComputeDevice cuda = require_cuda_or_skip();
  c10::InferenceMode guard;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(23);
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    const int64_t l = 2577, heads = 4, d = 128, h = heads * d;
    const auto opts = at::TensorOptions().device(cuda.torch_device()).dtype(dtype);
    const at::Tensor positions = at::randperm(l, gen).narrow(0, 0, 257).to(cuda.torch_device());
    const int64_t r = positions.size(0);
    const at::Tensor q = at::empty({r, h}).normal_(0, 1, gen).to(opts);
    const at::Tensor k = at::empty({r, h}).normal_(0, 1, gen).to(opts);
    const at::Tensor v = at::empty({r, h}).normal_(0, 1, gen).to(opts);
    const at::Tensor kv = at::empty({l, 2 * h}).normal_(0, 1, gen).to(opts);
    const at::Tensor before = kv.clone();
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    const at::Tensor got = infill::attention_with_rows_swapped_in(q, kv, positions, k, v, heads, scale);
    // The engine's path before: a contiguous copy of K and V with the fresh rows written in.
    const at::Tensor keys = kv.narrow(1, 0, h).contiguous().index_copy_(0, positions, k);
    const at::Tensor values = kv.narrow(1, h, h).contiguous().index_copy_(0, positions, v);
    const at::Tensor copied = infill::row_attention(q, keys, values, heads, scale);
    const at::Tensor ref = infill::kernels::masked_attention_reference(q.to(at::kFloat), keys.to(at::kFloat),
                                                                       values.to(at::kFloat), heads, scale);
    INFO(c10::toString(dtype));
    CHECK(got.scalar_type() == dtype);
    // The same kernel over the same values with K and V rows strided by 2H: equal up to the
    // kernel's own rounding (bf16 output: 8 significant bits).
    CHECK(rel_err(got.to(at::kFloat), copied.to(at::kFloat)) <= (dtype == at::kFloat ? 1e-6 : 1e-2));
    CHECK(rel_err(got.to(at::kFloat), ref) <= (dtype == at::kFloat ? 1e-4 : 2e-2));
    CHECK(at::equal(kv, before));  // restored in stream order
  }
}
