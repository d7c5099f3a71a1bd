#pragma once
/// CUDA versions of the token-row and masked-attention kernels, reached through a lazily
/// loaded shared library (libinfill_kernels_cuda.so, cudart linked statically). Nothing here
/// needs CUDA at build or run time: when the library or a device is missing, `cuda_available`
/// is false and the CPU kernels are used.

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

/// The CUDA kernels on CPU tensors (copied to the device and back): used to check the CUDA
/// code against the CPU kernels on machines that have a GPU. Precondition: cuda_available().
at::Tensor cuda_gather_rows(const at::Tensor& src, const at::Tensor& index);
void cuda_scatter_rows(at::Tensor& dst, const at::Tensor& index, const at::Tensor& rows);
at::Tensor cuda_masked_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 int64_t heads, double scale);

}  // namespace infill::kernels
