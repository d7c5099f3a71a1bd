// A masked step's attention over cached K/V with its fresh rows swapped in and back out
// (model/attention_over_cache.h), against plain libtorch ops: a copy of the cache with the
// fresh rows written into it, attended by kernels::masked_attention_reference. The GPU case is
// in test_flux2_cuda.cpp.
#include "support/catch.h"

#include <cmath>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/InferenceMode.h>

#include "kernels/masked_attention.h"
#include "model/attention_over_cache.h"

namespace {

struct Case {
  at::Tensor q, k, v, kv, positions;
  int64_t heads = 4;
  double scale = 0;
};

Case random_case(at::ScalarType dtype, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const int64_t L = 53, heads = 4, d = 8, H = heads * d;
  Case c;
  // Out of order and spread over the sequence, first and last rows included.
  c.positions = at::tensor(std::vector<int64_t>{30, 2, 52, 17, 0, 41});
  const int64_t R = c.positions.size(0);
  c.q = at::empty({R, H}).normal_(0, 1, gen).to(dtype);
  c.k = at::empty({R, H}).normal_(0, 1, gen).to(dtype);
  c.v = at::empty({R, H}).normal_(0, 1, gen).to(dtype);
  c.kv = at::empty({L, 2 * H}).normal_(0, 1, gen).to(dtype);
  c.heads = heads;
  c.scale = 1.0 / std::sqrt(static_cast<double>(d));
  return c;
}

// The baseline: a copy of the cache's K and V with the fresh rows in place.
at::Tensor reference(const Case& c) {
  const int64_t H = c.k.size(1);
  at::Tensor keys = c.kv.narrow(1, 0, H).to(at::kFloat, false, true);
  at::Tensor values = c.kv.narrow(1, H, H).to(at::kFloat, false, true);
  keys.index_put_({c.positions}, c.k.to(at::kFloat));
  values.index_put_({c.positions}, c.v.to(at::kFloat));
  return infill::kernels::masked_attention_reference(c.q.to(at::kFloat), keys, values, c.heads, c.scale);
}

double rel_err(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kFloat) - b).abs().max().item<double>() / b.abs().max().item<double>();
}

}  // namespace

TEST_CASE("attention with fresh rows swapped into the cache equals attention over a patched copy",
          "[attention_over_cache]") {
  c10::InferenceMode guard;
  // float32: the engine's CPU kernel; bf16: the plain path (a GPU's dtype, run on the CPU).
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    INFO(c10::toString(dtype));
    const Case c = random_case(dtype, 5);
    const at::Tensor before = c.kv.clone();
    const at::Tensor got = infill::attention_with_rows_swapped_in(c.q, c.kv, c.positions, c.k, c.v, c.heads, c.scale);
    REQUIRE(got.sizes() == c.q.sizes());
    CHECK(got.scalar_type() == dtype);
    // float32: the kernel against plain ops (1e-4 absolute by the kernel's contract);
    // bf16: the inputs are the same bf16 values, the output rounds to bf16 (8 bits).
    CHECK(rel_err(got, reference(c)) <= (dtype == at::kFloat ? 1e-5 : 1e-2));
    // The cache holds its own rows again, bit for bit.
    CHECK(at::equal(c.kv, before));
    // And the fresh rows mattered: attending the cache as it is gives another result.
    const int64_t H = c.k.size(1);
    const at::Tensor stale = infill::kernels::masked_attention_reference(
        c.q.to(at::kFloat), c.kv.narrow(1, 0, H).to(at::kFloat), c.kv.narrow(1, H, H).to(at::kFloat), c.heads, c.scale);
    CHECK(rel_err(got, stale) > 1e-2);
  }
}

TEST_CASE("attention over the cache restores its rows when the attention throws, and refuses mismatched inputs",
          "[attention_over_cache]") {
  c10::InferenceMode guard;
  const Case c = random_case(at::kFloat, 6);
  const at::Tensor before = c.kv.clone();
  // Queries of another width: the attention throws after the fresh rows went in.
  const at::Tensor wide_q = at::cat({c.q, c.q.narrow(1, 0, 1)}, 1);
  CHECK_THROWS(infill::attention_with_rows_swapped_in(wide_q, c.kv, c.positions, c.k, c.v, c.heads, c.scale));
  CHECK(at::equal(c.kv, before));

  // The cache in another dtype than the fresh rows: refused, naming both, nothing written.
  try {
    infill::attention_with_rows_swapped_in(c.q, c.kv.to(at::kBFloat16), c.positions, c.k, c.v, c.heads, c.scale);
    FAIL("a bf16 cache with float32 rows was accepted");
  } catch (const c10::Error& e) {
    CHECK_THAT(e.what_without_backtrace(), Catch::Contains("BFloat16") && Catch::Contains("Float"));
  }
  // A cache that is not [L, 2H].
  CHECK_THROWS_WITH(
      infill::attention_with_rows_swapped_in(c.q, c.kv.narrow(1, 0, c.k.size(1)), c.positions, c.k, c.v, c.heads,
                                             c.scale),
      Catch::Contains("expected [L, 64]"));
  // Fewer positions than rows.
  CHECK_THROWS_WITH(infill::attention_with_rows_swapped_in(c.q, c.kv, c.positions.narrow(0, 0, 3), c.k, c.v,
                                                           c.heads, c.scale),
                    Catch::Contains("3 positions for 6 fresh rows"));
  CHECK(at::equal(c.kv, before));
}
