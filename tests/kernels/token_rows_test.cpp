#include "support/catch.h"
#include "kernels/token_rows.h"


#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

namespace {

using infill::kernels::gather_rows;
using infill::kernels::scatter_rows;

// A source whose rows are strided: columns [offset, offset + c) of a wider tensor.
at::Tensor strided_rows(int64_t rows, int64_t c, int64_t extra, at::ScalarType dtype) {
  const at::Tensor wide = at::randn({rows, c + extra}).to(dtype);
  return wide.narrow(1, extra / 2, c);
}

struct Shape {
  int64_t l;
  int64_t c;
  int64_t m;
};

}  // namespace

TEST_CASE("gather_rows equals index_select over random shapes", "[kernels][token_rows]") {
  at::manual_seed(11);
  const Shape shapes[] = {{1, 1, 1},       {5, 3, 1},        {7, 64, 7},        {100, 384, 1},
                          {100, 384, 100}, {1024, 384, 102}, {4096, 512, 3000}, {33, 17, 50}};
  for (const at::ScalarType dtype : {at::kFloat, at::kHalf}) {
    for (const Shape& s : shapes) {
      for (const bool strided : {false, true}) {
        const at::Tensor src =
            strided ? strided_rows(s.l, s.c, 24, dtype) : at::randn({s.l, s.c}).to(dtype);
        // M == L is a permutation; other M draw with repetition (gather allows repeats).
        const at::Tensor index =
            s.m == s.l ? at::randperm(s.l, at::kLong) : at::randint(0, s.l, {s.m}, at::kLong);
        CAPTURE(s.l, s.c, s.m, strided, dtype);
        const at::Tensor out = gather_rows(src, index);
        REQUIRE(out.sizes() == at::IntArrayRef({s.m, s.c}));
        REQUIRE(out.is_contiguous());
        REQUIRE(out.scalar_type() == dtype);
        REQUIRE(at::equal(out, src.index_select(0, index)));
      }
    }
  }
}

TEST_CASE("scatter_rows equals index_copy_ and leaves other rows untouched",
          "[kernels][token_rows]") {
  at::manual_seed(12);
  const Shape shapes[] = {{1, 1, 1}, {9, 5, 1}, {64, 384, 64}, {1024, 384, 102}, {4096, 512, 3000}};
  for (const at::ScalarType dtype : {at::kFloat, at::kHalf}) {
    for (const Shape& s : shapes) {
      for (const bool strided : {false, true}) {
        const at::Tensor base = at::randn({s.l, s.c}).to(dtype);
        const at::Tensor rows =
            strided ? strided_rows(s.m, s.c, 8, dtype) : at::randn({s.m, s.c}).to(dtype);
        const at::Tensor index = at::randperm(s.l, at::kLong).narrow(0, 0, s.m).contiguous();
        CAPTURE(s.l, s.c, s.m, strided, dtype);
        at::Tensor dst = base.clone();
        scatter_rows(dst, index, rows);
        const at::Tensor expected = base.clone().index_copy_(0, index, rows);
        REQUIRE(at::equal(dst, expected));
      }
    }
  }
}

TEST_CASE("scatter_rows writes into strided destination rows", "[kernels][token_rows]") {
  at::manual_seed(13);
  at::Tensor wide = at::randn({50, 40});
  at::Tensor dst = wide.narrow(1, 4, 32);
  const at::Tensor before = wide.clone();
  const at::Tensor rows = at::randn({10, 32});
  const at::Tensor index = at::randperm(50, at::kLong).narrow(0, 0, 10).contiguous();
  scatter_rows(dst, index, rows);
  const at::Tensor expected = before.clone();
  expected.narrow(1, 4, 32).index_copy_(0, index, rows);
  REQUIRE(at::equal(wide, expected));  // columns outside the view are untouched too
}

TEST_CASE("gather then scatter round-trips with several threads", "[kernels][token_rows]") {
  const int saved = at::get_num_threads();
  at::set_num_threads(2);
  at::manual_seed(14);
  const at::Tensor src = at::randn({8192, 256});
  const at::Tensor index = at::randperm(8192, at::kLong).narrow(0, 0, 6000).contiguous();
  const at::Tensor rows = gather_rows(src, index);
  at::Tensor dst = at::zeros_like(src);
  scatter_rows(dst, index, rows);
  at::set_num_threads(saved);
  REQUIRE(at::equal(dst.index_select(0, index), src.index_select(0, index)));
  // Rows not listed stay zero.
  REQUIRE(at::count_nonzero(dst.index_fill_(0, index, 0.0)).item<int64_t>() == 0);
}

TEST_CASE("token_rows handle empty index", "[kernels][token_rows]") {
  const at::Tensor src = at::randn({4, 3});
  const at::Tensor none = at::empty({0}, at::kLong);
  REQUIRE(gather_rows(src, none).sizes() == at::IntArrayRef({0, 3}));
  at::Tensor dst = src.clone();
  scatter_rows(dst, none, at::empty({0, 3}));
  REQUIRE(at::equal(dst, src));
}

TEST_CASE("token_rows reject contract violations", "[kernels][token_rows]") {
  const at::Tensor src = at::randn({4, 3});
  REQUIRE_THROWS_AS(gather_rows(src, at::tensor({0, 4}, at::kLong)), c10::Error);
  REQUIRE_THROWS_AS(gather_rows(src, at::tensor({-1}, at::kLong)), c10::Error);
  REQUIRE_THROWS_AS(gather_rows(src, at::tensor({0, 1}, at::kInt)), c10::Error);
  REQUIRE_THROWS_AS(gather_rows(src.to(at::kDouble), at::tensor({0}, at::kLong)), c10::Error);
  REQUIRE_THROWS_AS(gather_rows(src.t(), at::tensor({0}, at::kLong)), c10::Error);

  at::Tensor dst = src.clone();
  // A bad index is caught before any row is written.
  REQUIRE_THROWS_AS(scatter_rows(dst, at::tensor({1, 9}, at::kLong), at::randn({2, 3})),
                    c10::Error);
  REQUIRE(at::equal(dst, src));
  REQUIRE_THROWS_AS(scatter_rows(dst, at::tensor({1}, at::kLong), at::randn({1, 4})), c10::Error);
  REQUIRE_THROWS_AS(scatter_rows(dst, at::tensor({1, 2}, at::kLong), at::randn({1, 3})),
                    c10::Error);
  REQUIRE_THROWS_AS(scatter_rows(dst, at::tensor({1}, at::kLong), at::randn({1, 3}).to(at::kHalf)),
                    c10::Error);
  try {
    gather_rows(src, at::tensor({7}, at::kLong));
    FAIL("expected an exception");
  } catch (const c10::Error& e) {
    REQUIRE_THAT(e.what_without_backtrace(), Catch::Contains("index[0] = 7"));
  }
}
