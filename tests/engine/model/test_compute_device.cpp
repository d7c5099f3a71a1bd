#include "support/catch.h"
#include "support/flux2_requests.h"

#include <string>

#include "model/compute_device.h"

using infill::ComputeDevice;

TEST_CASE("compute devices are parsed from the names users write", "[device]") {
  CHECK(*infill::parse_compute_device("cpu") == ComputeDevice{});
  CHECK(*infill::parse_compute_device("cuda") == ComputeDevice{true, 0});
  CHECK(*infill::parse_compute_device("cuda:3") == ComputeDevice{true, 3});
  CHECK(infill::parse_compute_device("cuda:3")->name() == "cuda:3");
  CHECK(ComputeDevice{}.name() == "cpu");
  for (const std::string bad : {"", "gpu", "cuda:", "cuda:-1", "cuda:1x", "CUDA", "cuda:999", "cpu:0"}) {
    const auto parsed = infill::parse_compute_device(bad);
    INFO("'" << bad << "'");
    REQUIRE_FALSE(parsed.ok());
    CHECK(parsed.status().message() == "device \"" + bad + "\": expected cpu, cuda or cuda:N");
  }
}

TEST_CASE("a CUDA device this machine or build lacks is an error naming it", "[device]") {
  CHECK(infill::check_compute_device(ComputeDevice{}).ok());
  const ComputeDevice missing{true, infill::cuda_device_count()};  // one past the last
  const infill::Status status = infill::check_compute_device(missing);
  REQUIRE_FALSE(status.ok());
  CHECK(status.message().rfind(missing.name() + ": ", 0) == 0);

  // A model asked onto it stays where it was and says why.
  infill::Flux2Transformer model = infill::Flux2Transformer::random(infill::test::small_config(), 1, at::kFloat);
  const infill::Status moved = model.to_device(missing);
  REQUIRE_FALSE(moved.ok());
  CHECK(moved.message() == status.message());
  CHECK(model.device().is_cpu());
}
