// FLUX.2 edits through the worker with the transformer on a CUDA device: the shipped serving
// path (prompts encoded on the pool, the template-keyed prepare sliced on the loop, its K/V
// brought to the host entry, the edits' cached rows read back onto the device). Skipped
// (exit 4) without a CUDA device.
#include "support/catch.h"
#include "support/cuda_device.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "flux2_serving_fixture.h"

using namespace infill;
using namespace infill::test;

namespace {

int max_byte_diff(const PixelImage& a, const PixelImage& b) {
  REQUIRE(a.data.size() == b.data.size());
  int worst = 0;
  for (size_t i = 0; i < a.data.size(); ++i) {
    worst = std::max(worst, std::abs(std::to_integer<int>(a.data[i]) - std::to_integer<int>(b.data[i])));
  }
  return worst;
}

// The first 8 rows lie outside the mask (rows 16..31) and its feathering.
bool top_rows_equal(const PixelImage& a, const PixelImage& b) {
  const size_t bytes = static_cast<size_t>(a.width) * a.channels * 8;
  return std::equal(a.data.begin(), a.data.begin() + bytes, b.data.begin());
}

}  // namespace

TEST_CASE("Worker edits with the FLUX.2 transformer on CUDA equal the CPU's (float32) and keep unmasked pixels (bf16)",
          "[cuda]") {
  const ComputeDevice cuda = require_cuda_or_skip();
  Flux2Serving cpu;
  const RequestResult on_cpu = submit(*cpu.runtime(), 1, cpu.tmpl, cpu.params("make the cup red", 7)).get();
  REQUIRE(on_cpu.state == RequestState::kDone);

  Flux2Serving gpu32(cuda, at::kFloat);
  CHECK(gpu32.model->device() == cuda);
  CHECK(cpu.model->device() == ComputeDevice{});
  auto rt32 = gpu32.runtime();
  const RequestResult on_gpu = submit(*rt32, 1, gpu32.tmpl, gpu32.params("make the cup red", 7)).get();
  REQUIRE(on_gpu.state == RequestState::kDone);
  CHECK(on_gpu.output.cache_mode == "template_keyed");
  CHECK(on_gpu.output.used_cache);
  // Same weights and inputs; float32 on both, summed in other orders: a pixel may round the
  // other way.
  const int diff = max_byte_diff(on_gpu.output.image, on_cpu.output.image);
  INFO("max byte difference CPU vs CUDA float32: " << diff);
  CHECK(diff <= 2);
  CHECK(top_rows_equal(on_gpu.output.image, gpu32.tmpl->pixels));

  Flux2Serving gpu16(cuda, at::kBFloat16);
  auto rt16 = gpu16.runtime();
  auto a = submit(*rt16, 1, gpu16.tmpl, gpu16.params("make the cup red", 7));
  auto b = submit(*rt16, 2, gpu16.tmpl, gpu16.params("a dark blue patch", 8));
  const RequestResult ra = a.get(), rb = b.get();
  REQUIRE(ra.state == RequestState::kDone);
  REQUIRE(rb.state == RequestState::kDone);
  CHECK(top_rows_equal(ra.output.image, gpu16.tmpl->pixels));
  CHECK(top_rows_equal(rb.output.image, gpu16.tmpl->pixels));
  CHECK((ra.output.image.data != rb.output.image.data));
  CHECK((ra.output.image.data != gpu16.tmpl->pixels.data));
  // Both edits read the template-keyed entry from the device tier, copied there once.
  const DeviceKvTierStats tier = gpu16.model->device_tier_stats();
  CHECK(tier.uploads == 1);
  CHECK(tier.entries == 1);
  CHECK(cpu.model->device_tier_stats().uploads == 0);
  WARN("bf16 vs float32 on " << cuda.name() << ": max byte difference "
                             << max_byte_diff(ra.output.image, on_gpu.output.image));
}
