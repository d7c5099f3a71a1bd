#pragma once
/// Fused masked attention: M query rows (the masked tokens of one request) attend to all L
/// keys of that request, for every head, without materialising the [H, M, L] score matrix.
/// Tiled over keys with an online softmax; multi-threaded over (head, query tile).
///
/// Layout is token-major with heads side by side, exactly as a qkv projection produces it,
/// so no permutes are needed: q [M, heads * d], k and v [L, heads * d]; rows may be strided
/// (a q slice of a [M, 3 * heads * d] qkv tensor is accepted without a copy).
/// Returns out [M, heads * d] contiguous float32.
///
/// Accuracy: within 1e-4 absolute of masked_attention_reference for unit-scale inputs (the
/// tests' tolerance); the exponential is a polynomial with ~2e-7 relative error.
/// Threading: uses libtorch's intra-op pool (at::set_num_threads); safe to call from several
/// threads at once. Inputs that break the contract (dtype, shapes, device) throw c10::Error.

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace infill::kernels {

at::Tensor masked_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            int64_t heads, double scale);

/// The same maths in plain libtorch ops (matmul, softmax, matmul): the reference for tests
/// and the baseline of the benchmark.
at::Tensor masked_attention_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      int64_t heads, double scale);

/// Instruction-set variants of the CPU kernel. kAuto picks the best one the CPU supports
/// (AVX-512 F/BW/VL/DQ, else AVX2 + FMA, else portable code).
enum class CpuIsa { kAuto = 0, kAvx512 = 1, kAvx2 = 2, kScalar = 3 };

/// True when this CPU can run `isa` (kAuto and kScalar always can).
bool cpu_isa_supported(CpuIsa isa);
/// "auto", "avx512", "avx2", "scalar".
const char* cpu_isa_name(CpuIsa isa);
/// The variant kAuto resolves to on this CPU.
CpuIsa best_cpu_isa();

/// masked_attention forced onto one variant, for tests and benchmarks.
/// Precondition: cpu_isa_supported(isa).
at::Tensor masked_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            int64_t heads, double scale, CpuIsa isa);

/// masked_attention where K and V are the activation cache's fp16 slabs (`k_cache`,
/// `v_cache`: [keys, heads * d] IEEE binary16, row-major, valid for the call) except for the
/// rows `fresh_ids` (int64 [R], distinct, in [0, keys)), which are taken from `fresh_k` and
/// `fresh_v` ([R, heads * d] float32, rows may be strided). The result equals masked_attention
/// over float copies of the slabs with the fresh rows scattered in (fp16 -> float is exact),
/// but the slabs are converted while K and V are packed, so no float copy of the whole cache
/// is written and read again on every block of a mask-aware step.
at::Tensor masked_attention_over_cache(const at::Tensor& q, const uint16_t* k_cache, const uint16_t* v_cache,
                                       int64_t keys, const at::Tensor& fresh_ids, const at::Tensor& fresh_k,
                                       const at::Tensor& fresh_v, int64_t heads, double scale,
                                       CpuIsa isa = CpuIsa::kAuto);

}  // namespace infill::kernels
