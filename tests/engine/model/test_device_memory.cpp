// A GPU's memory as /metrics and --check report it (model/device_memory.h): refused naming
// the device where there is none; on a GPU, a tensor's bytes show up as allocated and reserved,
// and in the peak until it is reset.
#include "support/catch.h"
#include "support/cuda_device.h"

#include <torch/torch.h>

#include "model/compute_device.h"
#include "model/device_memory.h"

using namespace infill;

TEST_CASE("the memory of a CUDA device this machine or build lacks is an error naming it",
          "[device]") {
  const int missing = cuda_device_count();  // one past the last
  const auto memory = cuda_device_memory(missing);
  REQUIRE_FALSE(memory.ok());
  CHECK(memory.status().message().rfind("cuda:" + std::to_string(missing) + ": ", 0) == 0);
  const Status reset = reset_cuda_memory_peak(missing);
  REQUIRE_FALSE(reset.ok());
  CHECK(reset.message().rfind("cuda:" + std::to_string(missing) + ": ", 0) == 0);
}

TEST_CASE("a GPU's memory counts a tensor made there as allocated and reserved", "[device][cuda]") {
  const ComputeDevice cuda = test::require_cuda_or_skip();
  c10::InferenceMode guard;
  const auto before = cuda_device_memory(cuda.index);
  REQUIRE(before.ok());
  const int64_t bytes = int64_t{64} << 20;
  at::Tensor t = torch::empty(
      {bytes}, torch::TensorOptions().dtype(torch::kUInt8).device(cuda.torch_device()));
  const auto after = cuda_device_memory(cuda.index);
  REQUIRE(after.ok());
  CHECK(after->allocated_bytes >= before->allocated_bytes + bytes);
  CHECK(after->reserved_bytes >= after->allocated_bytes);
  CHECK(after->total_bytes > 0);
  CHECK(after->free_bytes <= after->total_bytes);
  CHECK(after->reserved_bytes <= after->total_bytes);
  t = at::Tensor();
  const auto released = cuda_device_memory(cuda.index);
  REQUIRE(released.ok());
  CHECK(released->allocated_bytes == before->allocated_bytes);
  // The peak remembers the tensor until it is reset to what is allocated now.
  CHECK(released->peak_allocated_bytes >= before->allocated_bytes + bytes);
  REQUIRE(reset_cuda_memory_peak(cuda.index).ok());
  const auto reset = cuda_device_memory(cuda.index);
  REQUIRE(reset.ok());
  CHECK(reset->peak_allocated_bytes == reset->allocated_bytes);
}
