#include "kernels/masked_attention.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include <ATen/ATen.h>

#include "kernels/cpu/attention_kernel.h"
#include "kernels/cpu/parallel.h"

namespace infill::kernels {
namespace {

int64_t round_up(int64_t x, int64_t multiple) { return (x + multiple - 1) / multiple * multiple; }

bool cpu_has_avx512() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

bool cpu_has_avx2() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

cpu::AttendTileFn tile_kernel(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512: return &cpu::attend_tile_avx512;
    case CpuIsa::kAvx2: return &cpu::attend_tile_avx2;
    case CpuIsa::kScalar: return &cpu::attend_tile_scalar;
    case CpuIsa::kAuto: break;
  }
  return tile_kernel(best_cpu_isa());
}

// A strided-row view is fine; a tensor whose columns are not contiguous is copied.
at::Tensor with_contiguous_rows(const at::Tensor& t) {
  return t.size(1) <= 1 || t.stride(1) == 1 ? t : t.contiguous();
}

void check_input(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), "masked_attention: ", name, " must be a CPU tensor, got ",
              t.device());
  TORCH_CHECK(t.scalar_type() == at::kFloat, "masked_attention: ", name,
              " must be float32, got ", t.scalar_type());
  TORCH_CHECK(t.dim() == 2, "masked_attention: ", name, " must be 2-D [rows, heads * d], got ",
              t.sizes());
}

// Repacks K of every head into [keys_padded / kKeyPanel, d, kKeyPanel] panels (keys in the
// fast dimension, zero past L) so the score kernel reads it contiguously.
void pack_k(const at::Tensor& k, int64_t heads, int64_t d, int64_t keys_padded, float* panels) {
  const int64_t keys = k.size(0);
  const int64_t k_stride = k.stride(0);
  const float* k_data = k.data_ptr<float>();
  const int64_t n_panels = keys_padded / cpu::kKeyPanel;
  cpu::parallel_for(0, heads * n_panels, 4, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t head = t / n_panels;
      const int64_t key0 = (t % n_panels) * cpu::kKeyPanel;
      const int64_t n = std::min(cpu::kKeyPanel, keys - key0);
      float* panel = panels + head * keys_padded * d + key0 * d;
      for (int64_t j = 0; j < n; ++j) {
        const float* row = k_data + (key0 + j) * k_stride + head * d;
        for (int64_t c = 0; c < d; ++c) panel[c * cpu::kKeyPanel + j] = row[c];
      }
      if (n < cpu::kKeyPanel) {
        for (int64_t c = 0; c < d; ++c) {
          std::fill(panel + c * cpu::kKeyPanel + n, panel + (c + 1) * cpu::kKeyPanel, 0.0f);
        }
      }
    }
  });
}

// Repacks V into [heads, L, padded d] with zero columns past d, so the P*V kernel reads whole
// vectors; only needed when d is not a multiple of the vector width.
void pack_v(const at::Tensor& v, int64_t heads, int64_t d, int64_t dp, float* packed) {
  const int64_t keys = v.size(0);
  const int64_t v_stride = v.stride(0);
  const float* v_data = v.data_ptr<float>();
  cpu::parallel_for(0, heads * keys, 256, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t head = t / keys;
      const int64_t key = t % keys;
      float* dst = packed + (head * keys + key) * dp;
      std::memcpy(dst, v_data + key * v_stride + head * d, static_cast<size_t>(d) * sizeof(float));
      std::fill(dst + d, dst + dp, 0.0f);
    }
  });
}

}  // namespace

bool cpu_isa_supported(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512: return cpu_has_avx512();
    case CpuIsa::kAvx2: return cpu_has_avx2();
    case CpuIsa::kAuto:
    case CpuIsa::kScalar: return true;
  }
  return false;
}

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAuto: return "auto";
    case CpuIsa::kAvx512: return "avx512";
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kScalar: return "scalar";
  }
  return "unknown";
}

CpuIsa best_cpu_isa() {
  static const CpuIsa best = cpu_has_avx512() ? CpuIsa::kAvx512
                             : cpu_has_avx2() ? CpuIsa::kAvx2
                                              : CpuIsa::kScalar;
  return best;
}

at::Tensor masked_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            int64_t heads, double scale) {
  return masked_attention(q, k, v, heads, scale, CpuIsa::kAuto);
}

at::Tensor masked_attention(const at::Tensor& q_in, const at::Tensor& k_in,
                            const at::Tensor& v_in, int64_t heads, double scale, CpuIsa isa) {
  check_input(q_in, "q");
  check_input(k_in, "k");
  check_input(v_in, "v");
  TORCH_CHECK(cpu_isa_supported(isa), "masked_attention: this CPU does not support ",
              cpu_isa_name(isa));
  TORCH_CHECK(heads > 0, "masked_attention: heads must be positive, got ", heads);
  const int64_t width = q_in.size(1);
  TORCH_CHECK(width > 0 && width % heads == 0, "masked_attention: q has ", width,
              " columns, expected a positive multiple of heads = ", heads);
  TORCH_CHECK(k_in.size(1) == width && v_in.size(1) == width, "masked_attention: k is ",
              k_in.sizes(), " and v is ", v_in.sizes(), ", expected [L, ", width,
              "] like q's columns");
  TORCH_CHECK(k_in.size(0) == v_in.size(0), "masked_attention: k has ", k_in.size(0),
              " rows and v has ", v_in.size(0), "; they must match");
  TORCH_CHECK(k_in.size(0) > 0, "masked_attention: k and v have no rows (L = 0)");

  const at::Tensor q = with_contiguous_rows(q_in);
  const at::Tensor k = with_contiguous_rows(k_in);
  const at::Tensor v = with_contiguous_rows(v_in);
  const int64_t m = q.size(0);
  const int64_t keys = k.size(0);
  const int64_t d = width / heads;
  at::Tensor out = at::empty({m, width}, q.options().memory_format(at::MemoryFormat::Contiguous));
  if (m == 0) return out;

  cpu::AttentionProblem p;
  p.queries = m;
  p.keys = keys;
  p.keys_padded = round_up(keys, cpu::kKeyPanel);
  p.heads = heads;
  p.head_dim = d;
  p.padded_head_dim = round_up(d, cpu::kHeadDimAlign);
  p.scale = static_cast<float>(scale);
  p.q = q.data_ptr<float>();
  p.q_row_stride = q.stride(0);
  p.out = out.data_ptr<float>();
  p.out_row_stride = width;

  at::Tensor k_panels = at::empty({heads * p.keys_padded * d}, q.options());
  pack_k(k, heads, d, p.keys_padded, k_panels.data_ptr<float>());
  p.k_panels = k_panels.data_ptr<float>();

  at::Tensor v_packed;
  if (p.padded_head_dim == d) {
    p.v = v.data_ptr<float>();
    p.v_row_stride = v.stride(0);
    p.v_head_stride = d;
  } else {
    v_packed = at::empty({heads * keys * p.padded_head_dim}, q.options());
    pack_v(v, heads, d, p.padded_head_dim, v_packed.data_ptr<float>());
    p.v = v_packed.data_ptr<float>();
    p.v_row_stride = p.padded_head_dim;
    p.v_head_stride = keys * p.padded_head_dim;
  }

  // Tiles of whole 6-row register groups, as large as kMaxQueryTile allows, but small enough
  // that every thread gets several tasks.
  const int64_t threads = std::max(1, at::get_num_threads());
  int64_t tile = cpu::kMaxQueryTile;
  while (tile > 6 && heads * ((m + tile - 1) / tile) < 4 * threads) tile -= 6;
  const int64_t tiles = (m + tile - 1) / tile;
  // About 2 * 64K multiply-adds per thread is where a second thread starts to pay off.
  const int64_t work_per_task = std::min(tile, m) * keys * d;
  const int64_t grain = std::max<int64_t>(1, (1 << 17) / std::max<int64_t>(1, work_per_task));
  const cpu::AttendTileFn kernel = tile_kernel(isa);
  cpu::parallel_for(0, heads * tiles, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(
        static_cast<size_t>(cpu::attention_scratch_floats(p.padded_head_dim)));
    for (int64_t t = begin; t < end; ++t) {
      const int64_t head = t / tiles;
      const int64_t q0 = (t % tiles) * tile;
      kernel(p, head, q0, std::min(m, q0 + tile), scratch.data());
    }
  });
  return out;
}

at::Tensor masked_attention_reference(const at::Tensor& q, const at::Tensor& k,
                                      const at::Tensor& v, int64_t heads, double scale) {
  TORCH_CHECK(q.dim() == 2 && k.dim() == 2 && v.dim() == 2 && heads > 0 &&
                  q.size(1) % heads == 0,
              "masked_attention_reference: expected q [M, heads * d], k, v [L, heads * d]");
  const int64_t m = q.size(0);
  const int64_t keys = k.size(0);
  const int64_t d = q.size(1) / heads;
  const at::Tensor qh = q.reshape({m, heads, d}).permute({1, 0, 2});     // [H, M, d]
  const at::Tensor kh = k.reshape({keys, heads, d}).permute({1, 0, 2});  // [H, L, d]
  const at::Tensor vh = v.reshape({keys, heads, d}).permute({1, 0, 2});  // [H, L, d]
  const at::Tensor scores = at::matmul(qh, kh.transpose(1, 2)) * scale;  // [H, M, L]
  const at::Tensor probs = at::softmax(scores, -1);
  return at::matmul(probs, vh).permute({1, 0, 2}).reshape({m, heads * d}).contiguous();
}

}  // namespace infill::kernels
