#include "support/catch.h"
#include "kernels/cuda_kernels.h"


#include <cstdlib>
#include <filesystem>
#include <string>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "kernels/masked_attention.h"
#include "kernels/token_rows.h"

namespace ik = infill::kernels;

namespace {

bool cuda_disabled_by_env() {
  const char* v = std::getenv("INFILL_DISABLE_CUDA");
  return v && *v && std::string(v) != "0";
}

}  // namespace

TEST_CASE("CUDA availability is explained, and CUDA kernels match CPU ones when present",
          "[kernels][cuda]") {
  const std::string status = ik::cuda_status();
  INFO("cuda_status: " << status);
  REQUIRE_FALSE(status.empty());
  REQUIRE(ik::cuda_available() == ik::cuda_available());  // the probe is stable
  if (!ik::cuda_available()) {
    // This build machine has no GPU and no driver: the reason must say which part is missing.
    const bool explained = status.find("not found") != std::string::npos ||
                           status.find("no CUDA device") != std::string::npos ||
                           status.find("INFILL_DISABLE_CUDA") != std::string::npos;
    REQUIRE(explained);
    try {
      ik::cuda_masked_attention(at::randn({2, 32}), at::randn({4, 32}), at::randn({4, 32}), 2,
                                0.25);
      FAIL("cuda_masked_attention ran without a device");
    } catch (const c10::Error& e) {
      REQUIRE_THAT(e.what_without_backtrace(), Catch::Contains(status));
    }
    return;
  }

  // A device is present: the CUDA kernels must agree with the CPU kernels.
  at::manual_seed(31);
  const at::Tensor src = at::randn({300, 96}).narrow(1, 8, 80);
  const at::Tensor index = at::randperm(300, at::kLong).narrow(0, 0, 120).contiguous();
  REQUIRE(at::equal(ik::cuda_gather_rows(src, index), ik::gather_rows(src, index)));
  REQUIRE(at::equal(ik::cuda_gather_rows(src.to(at::kHalf), index),
                    ik::gather_rows(src.to(at::kHalf), index)));
  at::Tensor dst_cuda = at::randn({300, 80});
  at::Tensor dst_cpu = dst_cuda.clone();
  const at::Tensor rows = at::randn({120, 80});
  ik::cuda_scatter_rows(dst_cuda, index, rows);
  ik::scatter_rows(dst_cpu, index, rows);
  REQUIRE(at::equal(dst_cuda, dst_cpu));
  for (const int64_t l : {1, 200, 1030}) {
    const at::Tensor qkv = at::randn({77, 3 * 6 * 64});
    const at::Tensor q = qkv.narrow(1, 0, 384);
    const at::Tensor k = at::randn({l, 384});
    const at::Tensor v = at::randn({l, 384});
    const at::Tensor gpu = ik::cuda_masked_attention(q, k, v, 6, 0.125);
    const at::Tensor cpu = ik::masked_attention(q, k, v, 6, 0.125);
    CAPTURE(l);
    REQUIRE((gpu - cpu).abs().max().item<float>() <= 1e-4f);
  }
}

TEST_CASE("the CUDA kernel library is built with nvcc and loads without a GPU", "[kernels][cuda]") {
  const std::string dir = ik::cuda_library_build_dir();
  if (dir.empty()) {
    std::error_code ec;
    if (std::filesystem::exists("/usr/local/cuda/bin/nvcc", ec)) {
      WARN("nvcc exists but this build did not compile the CUDA kernels (INFILL_WITH_CUDA=OFF?)");
    }
    SUCCEED("CUDA kernels not part of this build");
    return;
  }
  const std::filesystem::path library = std::filesystem::path(dir) / "libinfill_kernels_cuda.so";
  INFO("expected " << library.string() << "; cuda_status: " << ik::cuda_status());
  REQUIRE(std::filesystem::is_regular_file(library));
  // Probing loads it and asks the CUDA runtime for devices; getting here means no crash.
  (void)ik::cuda_available();
  if (!cuda_disabled_by_env()) {
    REQUIRE(std::filesystem::equivalent(ik::cuda_library_path(), library));
  } else {
    REQUIRE(ik::cuda_library_path().empty());
  }
}
