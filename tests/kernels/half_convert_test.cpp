
#include "support/catch.h"
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "kernels/half_convert.h"

TEST_CASE("half_to_float and float_to_half equal ATen's conversions bit for bit", "[kernels][half]") {
  at::set_num_threads(2);
  int64_t checked = 0;
  for (int64_t n : {int64_t{1}, int64_t{15}, int64_t{16}, int64_t{17}, int64_t{200003}}) {
    at::Tensor values = at::randn({n}) * 1000;
    if (n > 5) {
      values[1] = INFINITY;
      values[2] = -0.0f;
      values[3] = 1e-7f;     // subnormal in fp16
      values[4] = 70000.0f;  // overflows fp16
    }
    at::Tensor expected_half = values.to(at::kHalf);
    at::Tensor half = at::empty({n}, at::kHalf);
    infill::kernels::float_to_half(values.data_ptr<float>(), reinterpret_cast<uint16_t*>(half.data_ptr()), n);
    CHECK(at::equal(half.view(at::kShort), expected_half.view(at::kShort)));
    at::Tensor back = at::empty({n});
    infill::kernels::half_to_float(reinterpret_cast<const uint16_t*>(half.data_ptr()), back.data_ptr<float>(), n);
    CHECK(at::equal(back, expected_half.to(at::kFloat)));
    ++checked;
  }
  CHECK(checked == 5);
}
