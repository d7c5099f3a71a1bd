#include "support/catch.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "model/stored_linear.h"

TEST_CASE("stored_linear equals at::linear over the converted weight", "[stored_linear]") {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const at::Tensor w32 = at::empty({200, 96}).normal_(0, 0.05, gen);
  for (const at::ScalarType stored : {at::kBFloat16, at::kHalf, at::kFloat}) {
    const at::Tensor w = w32.to(stored);
    const at::Tensor reference_w = w.to(at::kFloat);
    for (const int64_t m : {int64_t{1}, int64_t{100}, int64_t{500}}) {
      const at::Tensor x = at::empty({m, 96}).normal_(0, 1, gen);
      const at::Tensor y = infill::stored_linear(x, w);
      const at::Tensor expected = at::linear(x, reference_w);
      INFO("stored " << c10::toString(stored) << ", " << m << " rows");
      REQUIRE(y.sizes() == expected.sizes());
      CHECK(y.scalar_type() == at::kFloat);
      CHECK(at::allclose(y, expected, 1e-5, 1e-5));
    }
    // A single vector, as the timestep embedding is.
    const at::Tensor v = at::empty({96}).normal_(0, 1, gen);
    CHECK(at::allclose(infill::stored_linear(v, w), at::linear(v, reference_w), 1e-5, 1e-5));
  }
  // Twice in a row with different shapes: the reused scratch must not leak values.
  const at::Tensor x = at::ones({3, 96});
  const at::Tensor a = infill::stored_linear(x, w32.to(at::kBFloat16));
  const at::Tensor b = infill::stored_linear(x.narrow(1, 0, 32), w32.narrow(1, 0, 32).contiguous().to(at::kBFloat16));
  CHECK(at::allclose(b, at::linear(x.narrow(1, 0, 32), w32.narrow(1, 0, 32).to(at::kBFloat16).to(at::kFloat)), 1e-5, 1e-5));
  CHECK(at::allclose(a, at::linear(x, w32.to(at::kBFloat16).to(at::kFloat)), 1e-5, 1e-5));
}
