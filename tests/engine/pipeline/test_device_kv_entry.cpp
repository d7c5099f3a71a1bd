// The activation cache on a CUDA device: K/V a GPU forward computes reach the host entry
// through EntryKvSink, and an entry uploaded to the device (DeviceKvEntry) serves a mask-aware
// forward the same rows as the host entry. Skipped (exit 4) without a CUDA device.
#include "support/catch.h"
#include "support/cuda_device.h"
#include "support/flux2_requests.h"

#include <memory>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "cache/activation_entry.h"
#include "pipeline/cached_kv.h"
#include "pipeline/device_kv_entry.h"

using namespace infill::test;

TEST_CASE("a GPU forward's K/V fill a host entry, and the entry uploaded to the device reads back the same",
          "[cuda]") {
  const infill::ComputeDevice cuda = require_cuda_or_skip();
  const Flux2Config cfg = small_config();
  Flux2Transformer model = Flux2Transformer::random(cfg, 21, at::kFloat);
  REQUIRE(model.to_device(cuda, at::kBFloat16).ok());
  c10::InferenceMode guard;
  const Request r = make_request(cfg, 5, 4, 4, /*reference=*/true, 8);
  const double t = 0.45;

  auto entry = std::make_shared<infill::ActivationEntry>(
      infill::ActivationLayout{1, cfg.depth(), static_cast<int>(r.length()), cfg.hidden_size});
  infill::EntryKvSink sink(*entry, 0);
  MemoryKv reference_kv(/*slabs=*/true);  // the same K/V, narrowed to fp16 by plain libtorch ops
  struct Both final : infill::KvSink {
    infill::KvSink* a;
    infill::KvSink* b;
    void store(int block, const at::Tensor& k, const at::Tensor& v) override {
      a->store(block, k, v);
      b->store(block, k, v);
    }
  } both;
  both.a = &sink;
  both.b = &reference_kv;
  Flux2Segment prepare = full_segment(r, t);
  prepare.sink = &both;
  const at::Tensor full = forward_one(model, prepare);

  // The entry holds exactly what libtorch's own bf16 -> fp16 conversion gives.
  for (int block = 0; block < cfg.depth(); ++block) {
    at::Tensor k = at::empty({r.length(), cfg.hidden_size}), v = at::empty_like(k), rk = at::empty_like(k),
               rv = at::empty_like(k);
    infill::EntryKvSource(entry, 0).fetch(block, k, v);
    reference_kv.fetch(block, rk, rv);
    CHECK(at::equal(k, rk));
    CHECK(at::equal(v, rv));
  }

  infill::EntryKvSource host(entry, 0);
  const at::Tensor rows = at::tensor(std::vector<int64_t>{2, 3, 9, 30});
  const at::Tensor none = at::empty({0}, at::kLong);
  const at::Tensor from_host = forward_one(model, masked_segment(r, none, rows, t, &host));
  at::Tensor hk = at::empty({r.length(), cfg.hidden_size}), hv = at::empty_like(hk);
  host.fetch(0, hk, hv);
  // fp16 (the entry's own values: a bf16 forward converts a copy every step) and bf16 (the
  // engine's tier: the forward swaps its rows into the resident tensors and back).
  for (const at::ScalarType dtype : {at::kHalf, at::kBFloat16}) {
    INFO(c10::toString(dtype));
    auto resident = infill::DeviceKvEntry::upload(*entry, cuda, dtype);
    REQUIRE(resident.ok());
    CHECK((*resident)->bytes() == static_cast<int64_t>(entry->bytes()));
    CHECK((*resident)->k(0, 0).device().is_cuda());
    CHECK((*resident)->dtype() == dtype);
    infill::DeviceKvSource device(*resident, 0);
    at::Tensor kv;
    CHECK(device.device_kv_rows(0, cuda.torch_device(), &kv));
    CHECK_FALSE(device.device_kv_rows(0, at::Device(at::kCPU), &kv));
    const at::Tensor from_device = forward_one(model, masked_segment(r, none, rows, t, &device));
    // The same bf16 values reach the same kernels (for bf16, K and V rows strided by 2H):
    // fp16 equals exactly; bf16 within the kernel's rounding of its bf16 output.
    if (dtype == at::kHalf) {
      CHECK(at::equal(from_host, from_device));
    } else {
      CHECK(rel_err(from_device, from_host) <= 1e-2);
    }
    CHECK(rel_err(from_device, full.index_select(0, rows)) <= 3e-2);
    // The resident tensors hold the entry's rows after the forward: never left with fresh rows.
    at::Tensor k0 = at::empty({r.length(), cfg.hidden_size}), v0 = at::empty_like(k0);
    device.fetch(0, k0, v0);
    CHECK(at::equal(k0, hk.to(dtype).to(at::kFloat)));
    CHECK(at::equal(v0, hv.to(dtype).to(at::kFloat)));
  }
}

