#pragma once
/// CUDA versions of the token-row and masked-attention kernels, reached through a lazily
/// loaded shared library (libinfill_kernels_cuda.so, cudart linked statically). Nothing here
/// needs CUDA at build or run time: when the library or a device is missing, `cuda_available`
/// is false and the CPU kernels are used.
///
/// The library is looked for, in order, in the build tree's lib/ directory (when this build
/// compiled it), next to the running executable, in the executable's ../lib, and on the
/// default loader path. INFILL_DISABLE_CUDA=1 in the environment (read once, at the first
/// probe) keeps it unloaded. The cuda_* kernels take the same inputs as their CPU versions
/// and throw c10::Error on contract violations or CUDA failures.

#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

namespace infill::kernels {

/// True when the CUDA kernel library loaded and reports at least one device. Thread-safe;
/// the probe runs once.
bool cuda_available();
/// Why CUDA is unavailable ("libinfill_kernels_cuda.so not found", "no CUDA device: ..."),
/// or the device name when it is available.
std::string cuda_status();

/// Path of the loaded libinfill_kernels_cuda.so, or "" when it was not found (or CUDA is
/// disabled by INFILL_DISABLE_CUDA). The library may load while no device is usable.
std::string cuda_library_path();
/// The build tree's library directory when this build compiled the CUDA kernels (the
/// INFILL_CUDA_LIBRARY_BUILD_DIR definition), else "".
std::string cuda_library_build_dir();

/// The CUDA kernels on CPU tensors (copied to the device and back): used to check the CUDA
/// code against the CPU kernels on machines that have a GPU. Precondition: cuda_available().
at::Tensor cuda_gather_rows(const at::Tensor& src, const at::Tensor& index);
void cuda_scatter_rows(at::Tensor& dst, const at::Tensor& index, const at::Tensor& rows);
at::Tensor cuda_masked_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 int64_t heads, double scale);

}  // namespace infill::kernels
