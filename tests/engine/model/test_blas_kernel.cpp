// The choice of OpenBLAS kernels (engine/common/blas_kernel.h): never kernels the CPU cannot
// run, and GEMMs through a switched kernel table equal to a double-precision product.
#include "support/catch.h"

#include <cstdlib>
#include <string>

#include <ATen/ATen.h>

#include "common/blas_kernel.h"

using infill::CpuVectorFeatures;
using infill::wider_openblas_core;

namespace {

CpuVectorFeatures sse_only() { return {}; }

CpuVectorFeatures with_avx() {
  CpuVectorFeatures f;
  f.avx = true;
  return f;
}

CpuVectorFeatures with_avx2() {
  CpuVectorFeatures f = with_avx();
  f.avx2 = f.fma = true;
  return f;
}

CpuVectorFeatures with_avx512() {
  CpuVectorFeatures f = with_avx2();
  f.avx512f = f.avx512bw = f.avx512vl = f.avx512dq = f.avx512cd = true;
  return f;
}

// Whether `cpu` can execute the kernels of `core` (one of the three this choice names).
bool runs(const CpuVectorFeatures& cpu, const std::string& core) {
  if (core == "SkylakeX")
    return cpu.avx512f && cpu.avx512bw && cpu.avx512vl && cpu.avx512dq && cpu.avx512cd;
  if (core == "Haswell") return cpu.avx2 && cpu.fma;
  if (core == "Sandybridge") return cpu.avx;
  return false;
}

// A float GEMM against the same product in double precision, relative to its magnitude.
double gemm_error() {
  at::manual_seed(7);
  const at::Tensor a = at::randn({384, 192});
  const at::Tensor b = at::randn({192, 576});
  const at::Tensor got = at::mm(a, b);
  const at::Tensor want = at::mm(a.to(at::kDouble), b.to(at::kDouble));
  return ((got.to(at::kDouble) - want).abs().max() / want.abs().max()).item<double>();
}

}  // namespace

TEST_CASE("wider_openblas_core moves a fallback to the widest kernels the CPU runs",
          "[blas_kernel]") {
  CHECK(wider_openblas_core("Prescott", with_avx512()) == "SkylakeX");
  CHECK(wider_openblas_core("prescott", with_avx512()) ==
        "SkylakeX");  // OpenBLAS's names, any case
  CHECK(wider_openblas_core("Nehalem", with_avx2()) == "Haswell");
  CHECK(wider_openblas_core("Core2", with_avx()) == "Sandybridge");
  CHECK(wider_openblas_core("Sandybridge", with_avx2()) == "Haswell");
  CHECK(wider_openblas_core("Haswell", with_avx512()) == "SkylakeX");
}

TEST_CASE("wider_openblas_core leaves a core as wide as the CPU or one it does not know",
          "[blas_kernel]") {
  CHECK(wider_openblas_core("SkylakeX", with_avx512()).empty());
  CHECK(wider_openblas_core("Cooperlake", with_avx512()).empty());  // as wide, and tuned further
  CHECK(wider_openblas_core("Zen", with_avx2()).empty());           // AMD's own AVX2 tuning stays
  CHECK(wider_openblas_core("Haswell", with_avx2()).empty());
  CHECK(wider_openblas_core("Prescott", sse_only()).empty());
  CHECK(wider_openblas_core("NEOVERSEN1", with_avx512()).empty());  // not an x86 core we rank
  CHECK(wider_openblas_core("", with_avx512()).empty());
}

TEST_CASE("wider_openblas_core never names kernels the CPU cannot execute", "[blas_kernel]") {
  // Every combination of the eight flags, partial AVX-512 sets (a hypervisor masking some of
  // them) and AVX2 without FMA included.
  for (unsigned bits = 0; bits < 256; ++bits) {
    CpuVectorFeatures cpu;
    cpu.avx = bits & 1;
    cpu.avx2 = bits & 2;
    cpu.fma = bits & 4;
    cpu.avx512f = bits & 8;
    cpu.avx512bw = bits & 16;
    cpu.avx512vl = bits & 32;
    cpu.avx512dq = bits & 64;
    cpu.avx512cd = bits & 128;
    for (const char* current :
         {"Prescott", "Nehalem", "Sandybridge", "Haswell", "Zen", "SkylakeX"}) {
      const std::string wider = wider_openblas_core(current, cpu);
      INFO("flags " << bits << ", OpenBLAS chose " << current << ", moved to " << wider);
      if (!wider.empty()) CHECK(runs(cpu, wider));
    }
  }
}

TEST_CASE("select_blas_kernel never leaves a core narrower than this CPU runs", "[blas_kernel]") {
  // The test binary's main() made the start-up choice, as every binary does.
  const infill::BlasKernelChoice& choice = infill::blas_kernel_choice();
  INFO(infill::describe(choice));
  REQUIRE_FALSE(choice.library.empty());
  if (choice.in_use.empty()) {
    SUCCEED("libtorch's BLAS is not OpenBLAS here: nothing to choose");
    return;
  }
  if (std::getenv("OPENBLAS_CORETYPE") == nullptr || choice.changed) {
    CHECK(wider_openblas_core(choice.in_use, infill::detect_cpu_vector_features()).empty());
  }
  CHECK(choice.changed == (choice.in_use != choice.detected));
}

TEST_CASE("select_blas_kernel moves a Prescott fallback to the widest kernels this CPU runs",
          "[blas_kernel]") {
  const infill::BlasKernelChoice start = infill::blas_kernel_choice();
  const std::string widest = wider_openblas_core("Prescott", infill::detect_cpu_vector_features());
  if (start.in_use.empty() || widest.empty() ||
      (std::getenv("OPENBLAS_CORETYPE") != nullptr && !start.changed)) {
    SUCCEED("no OpenBLAS, an SSE-only CPU, or a core the user named: nothing to move");
    return;
  }
  if (start.changed) {  // this machine is one OpenBLAS does not know: main() already moved it
    CHECK(start.in_use == widest);
    return;
  }
  // Put OpenBLAS where it lands on a CPU model it does not know, then choose as main() does.
  REQUIRE(infill::use_openblas_core("Prescott") == "Prescott");
  REQUIRE(std::getenv("OPENBLAS_CORETYPE") == nullptr);  // the switch leaves no setting behind
  const infill::BlasKernelChoice moved = infill::select_blas_kernel();
  INFO(infill::describe(moved));
  CHECK(moved.detected == "Prescott");
  CHECK(moved.in_use == widest);
  CHECK(moved.changed);
  CHECK(gemm_error() < 1e-5);
  // Asking again keeps the record of what OpenBLAS chose, not the core now in use.
  CHECK(infill::select_blas_kernel().detected == "Prescott");
}

TEST_CASE("GEMMs are right after switching the OpenBLAS kernel table both ways", "[blas_kernel]") {
  const infill::BlasKernelChoice& choice = infill::blas_kernel_choice();
  if (choice.in_use.empty() || infill::use_openblas_core(choice.in_use).empty()) {
    SUCCEED("libtorch's BLAS is not a DYNAMIC_ARCH OpenBLAS here: no kernel table to switch");
    return;
  }
  const double in_use_error = gemm_error();
  // SSE3 kernels run on every x86-64 CPU.
  CHECK(infill::use_openblas_core("Prescott") == "Prescott");
  const double prescott_error = gemm_error();
  CHECK(infill::use_openblas_core(choice.in_use) == choice.in_use);
  const double back_error = gemm_error();
  // f32 accumulation over 192 products: ~1e-6 of the largest entry; a wrong kernel table gives
  // garbage or crashes.
  CHECK(in_use_error < 1e-5);
  CHECK(prescott_error < 1e-5);
  CHECK(back_error == in_use_error);
  CHECK(infill::use_openblas_core("NoSuchCore").empty());
}
