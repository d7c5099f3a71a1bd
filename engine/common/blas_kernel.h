#pragma once
/// Which BLAS kernels libtorch's float GEMMs run with, and choosing better ones when OpenBLAS
/// fell back to generic code.
///
/// Debian's libtorch does its f32 matrix products in OpenBLAS (DYNAMIC_ARCH: one kernel set per
/// CPU family, chosen at load from CPUID's family and model). On a CPU model it does not know
/// (seen on a KVM guest reporting "Intel(R) Xeon(R) Processor" with AVX-512 and AMX) it falls
/// back to "Prescott", SSE3 code: a 5376x192x576 GEMM took 42.5 ms there and 7.6 ms with the
/// SkylakeX kernels the CPU can run, and a training step 4.9 s instead of 1.85 s. The choice is
/// made from the CPU's feature flags instead, never naming kernels the CPU cannot execute.
///
/// Torch-free: OpenBLAS is found at run time (dlsym), so a libtorch on another BLAS (MKL on
/// pip wheels, the reference BLAS) is left alone and reported as such.

#include <string>
#include <string_view>

namespace infill {

/// The vector instruction sets that OpenBLAS's x86-64 kernel families need.
struct CpuVectorFeatures {
  bool avx = false;
  bool avx2 = false;
  bool fma = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512cd = false;
};

/// What this CPU and its operating system support (CPUID with XGETBV, through GCC's
/// __builtin_cpu_supports).
CpuVectorFeatures detect_cpu_vector_features();

/// The OpenBLAS core, as OPENBLAS_CORETYPE names it ("SkylakeX", "Haswell", "Sandybridge"),
/// whose kernels are the widest `cpu` can run and wider than those of `current` (a name as
/// openblas_get_corename() returns it). Empty when `current` is already as wide, or is a core
/// this list does not know (left as OpenBLAS chose it).
std::string wider_openblas_core(std::string_view current, const CpuVectorFeatures& cpu);

/// What select_blas_kernel() found and did.
struct BlasKernelChoice {
  std::string library;   ///< openblas_get_config(), or a sentence when the BLAS is not OpenBLAS
  std::string detected;  ///< the core OpenBLAS chose at load; empty when not OpenBLAS
  std::string in_use;    ///< the core in use now; empty when not OpenBLAS
  std::string reason;    ///< why it is the one in use, in words
  bool changed = false;
};

/// Switches the OpenBLAS loaded in this process to the core named `core` (OPENBLAS_CORETYPE's
/// names, any case) and returns the name it now reports. Returns an empty string when the BLAS
/// is not a DYNAMIC_ARCH OpenBLAS or has no kernels for `core` (nothing changed then).
/// OPENBLAS_CORETYPE is as it was after the call.
///
/// Threading: only before any BLAS call and while no other thread can make one (first thing in
/// main): the switch replaces the kernel table that running GEMMs read.
std::string use_openblas_core(std::string_view core);

/// At start-up: when OpenBLAS fell back to kernels narrower than the CPU runs, switches to the
/// widest it has for this CPU. Respects a core the user named in OPENBLAS_CORETYPE (which also
/// reproduces runs made with another core: the kernels round differently). Idempotent; same
/// threading rule as use_openblas_core().
BlasKernelChoice select_blas_kernel();

/// The last choice select_blas_kernel() made in this process (default-constructed before).
const BlasKernelChoice& blas_kernel_choice();

/// One line for logs: "OpenBLAS 0.3.21 ...: SkylakeX kernels (OpenBLAS fell back to Prescott
/// kernels; this CPU runs SkylakeX's)".
std::string describe(const BlasKernelChoice& choice);

}  // namespace infill
