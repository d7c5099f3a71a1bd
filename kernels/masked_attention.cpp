#include "kernels/masked_attention.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include <ATen/ATen.h>

#include "kernels/cpu/attention_kernel.h"
#include "kernels/cpu/parallel.h"
#include "kernels/half_convert.h"

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
    case CpuIsa::kAvx512:
      return &cpu::attend_tile_avx512;
    case CpuIsa::kAvx2:
      return &cpu::attend_tile_avx2;
    case CpuIsa::kScalar:
    case CpuIsa::kAuto:
      break;
  }
  return &cpu::attend_tile_scalar;
}

// A strided-row view is fine; a tensor whose columns are not contiguous is copied.
at::Tensor with_contiguous_rows(const at::Tensor& t) {
  return t.size(1) <= 1 || t.stride(1) == 1 ? t : t.contiguous();
}

void check_input(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), "masked_attention: ", name, " must be a CPU tensor, got ",
              t.device());
  TORCH_CHECK(t.scalar_type() == at::kFloat, "masked_attention: ", name, " must be float32, got ",
              t.scalar_type());
  TORCH_CHECK(t.dim() == 2, "masked_attention: ", name, " must be 2-D [rows, heads * d], got ",
              t.sizes());
}

// Scratch that outlives a call, so the hot path neither allocates nor first-touches fresh
// pages: each calling thread keeps the largest packed K / V it has needed.
float* thread_buffer(std::vector<float>& buffer, int64_t floats) {
  if (static_cast<int64_t>(buffer.size()) < floats) buffer.resize(static_cast<size_t>(floats));
  return buffer.data();
}

// Where the rows of K and V come from: float rows (views of a qkv projection or a float
// copy of the cache), or the activation cache's fp16 slabs with the rows of the fresh
// (masked) tokens taken from their float projections instead.
struct KvRows {
  const float* k = nullptr;  // [L, width], row stride k_stride
  int64_t k_stride = 0;
  const float* v = nullptr;
  int64_t v_stride = 0;
  const uint16_t* k_half = nullptr;  // [L, width] fp16, contiguous; set together with v_half
  const uint16_t* v_half = nullptr;
  const int32_t* fresh_row = nullptr;  // [L]: row of fresh_k / fresh_v holding the token, or -1
  const float* fresh_k = nullptr;
  int64_t fresh_k_stride = 0;
  const float* fresh_v = nullptr;
  int64_t fresh_v_stride = 0;

  bool cached() const { return k_half != nullptr; }
};

// Lazy packing of K (into panels) and of V (into [L, padded d] with zero columns, when d is
// not a multiple of the vector width or V comes from fp16), one (head, key panel) at a time.
// The tile kernel asks for a panel right before it uses it: the first thread to ask packs it,
// so packing is shared by the threads, needs no fork / join of its own, and the packed panel
// is still in cache when it is read.
class KeyPacker {
 public:
  KeyPacker(const KvRows& rows, const cpu::AttentionProblem& p, cpu::PackKPanelFn pack_panel, float* k_panels,
            float* v_packed)
      : rows_(rows),
        p_(p),
        pack_panel_(pack_panel),
        k_panels_(k_panels),
        v_packed_(v_packed),
        panels_per_head_(p.keys_padded / cpu::kKeyPanel),
        state_(static_cast<size_t>(p.heads * panels_per_head_)) {}

  bool needed() const { return k_panels_ || v_packed_; }

  /// Returns once keys [panel * kKeyPanel, +kKeyPanel) of `head` are packed; packs them when
  /// no other thread has started to. Thread-safe.
  void ensure(int64_t head, int64_t panel) {
    std::atomic<int>& state = state_[static_cast<size_t>(head * panels_per_head_ + panel)];
    if (state.load(std::memory_order_acquire) == kPacked) return;
    int expected = kUnpacked;
    if (state.compare_exchange_strong(expected, kPacking, std::memory_order_acq_rel)) {
      pack(head, panel);
      state.store(kPacked, std::memory_order_release);
      return;
    }
    while (state.load(std::memory_order_acquire) != kPacked) std::this_thread::yield();
  }

  static void ensure_thunk(const void* self, int64_t head, int64_t panel) {
    const_cast<KeyPacker*>(static_cast<const KeyPacker*>(self))->ensure(head, panel);
  }

 private:
  static constexpr int kUnpacked = 0;
  static constexpr int kPacking = 1;
  static constexpr int kPacked = 2;

  void pack(int64_t head, int64_t panel) const {
    const int64_t d = p_.head_dim;
    const int64_t width = p_.heads * d;
    const int64_t key0 = panel * cpu::kKeyPanel;
    const int64_t n = std::min(cpu::kKeyPanel, p_.keys - key0);
    if (k_panels_) {
      float* dst = k_panels_ + head * p_.keys_padded * d + key0 * d;
      if (!rows_.cached()) {
        pack_panel_(rows_.k + key0 * rows_.k_stride + head * d, rows_.k_stride, n, d, dst);
      } else {
        cpu::pack_k_panel_half_avx512(rows_.k_half + key0 * width + head * d, width, n, d, dst);
        // The few fresh keys of the panel overwrite their cached columns.
        for (int64_t j = 0; j < n; ++j) {
          const int32_t fresh = rows_.fresh_row[key0 + j];
          if (fresh < 0) continue;
          const float* src = rows_.fresh_k + fresh * rows_.fresh_k_stride + head * d;
          for (int64_t c = 0; c < d; ++c) dst[c * cpu::kKeyPanel + j] = src[c];
        }
      }
    }
    if (v_packed_) {
      const int64_t dp = p_.padded_head_dim;
      float* dst = v_packed_ + (head * p_.keys + key0) * dp;
      if (rows_.cached()) cpu::convert_half_rows_avx512(rows_.v_half + key0 * width + head * d, width, n, d, dst, dp);
      for (int64_t j = 0; j < n; ++j) {
        float* row = dst + j * dp;
        if (!rows_.cached()) {
          std::memcpy(row, rows_.v + (key0 + j) * rows_.v_stride + head * d, static_cast<size_t>(d) * sizeof(float));
        } else if (const int32_t fresh = rows_.fresh_row[key0 + j]; fresh >= 0) {
          std::memcpy(row, rows_.fresh_v + fresh * rows_.fresh_v_stride + head * d,
                      static_cast<size_t>(d) * sizeof(float));
        }
        std::fill(row + d, row + dp, 0.0f);
      }
    }
  }

  const KvRows& rows_;
  const cpu::AttentionProblem& p_;
  cpu::PackKPanelFn pack_panel_;
  float* k_panels_;
  float* v_packed_;
  int64_t panels_per_head_;
  std::vector<std::atomic<int>> state_;
};

// The fused kernel over K / V rows from either source. q is checked by the callers.
at::Tensor attend(const at::Tensor& q, const KvRows& rows, int64_t keys, int64_t heads, double scale, CpuIsa isa) {
  const int64_t width = q.size(1);
  const int64_t m = q.size(0);
  const int64_t d = width / heads;
  at::Tensor out = at::empty({m, width}, q.options().memory_format(at::MemoryFormat::Contiguous));
  if (m == 0) return out;

  const CpuIsa resolved = isa == CpuIsa::kAuto ? best_cpu_isa() : isa;
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

  p.k = rows.k;
  p.k_row_stride = rows.k_stride;
  p.v = rows.v;
  p.v_row_stride = rows.v_stride;
  p.v_head_stride = d;

  thread_local std::vector<float> k_panels_buffer;
  thread_local std::vector<float> v_packed_buffer;
  float* k_panels = nullptr;
  float* v_packed = nullptr;
  // fp16 rows are always converted while packing: the tile kernel reads only floats.
  if (m >= cpu::kMinQueriesForPanels || rows.cached()) {
    k_panels = thread_buffer(k_panels_buffer, heads * p.keys_padded * d);
    p.k_panels = k_panels;
  }
  if (p.padded_head_dim != d || rows.cached()) {
    v_packed = thread_buffer(v_packed_buffer, heads * keys * p.padded_head_dim);
    p.v = v_packed;
    p.v_row_stride = p.padded_head_dim;
    p.v_head_stride = keys * p.padded_head_dim;
  }
  KeyPacker packer(rows, p,
                   resolved == CpuIsa::kAvx512 ? &cpu::pack_k_panel_avx512 : &cpu::pack_k_panel_scalar,
                   k_panels, v_packed);
  if (packer.needed()) {
    p.prepare_keys = &KeyPacker::ensure_thunk;
    p.prepare_ctx = &packer;
  }
  // Tiles of whole 6-row register groups, as large as kMaxQueryTile allows, but small enough
  // that every thread gets several tasks.
  const int64_t threads = std::max(1, at::get_num_threads());
  int64_t tile = cpu::kMaxQueryTile;
  while (tile > 6 && heads * ((m + tile - 1) / tile) < 4 * threads) tile -= 6;
  const int64_t tiles = (m + tile - 1) / tile;
  // A thread per 2 * 512K multiply-adds (~0.1 ms): below that, waking a second thread costs
  // about as much as it saves, and far more when the machine is busy.
  constexpr int64_t kWorkPerThread = int64_t{1} << 19;
  const cpu::AttendTileFn kernel = tile_kernel(resolved);
  const int64_t tasks = heads * tiles;
  // Tasks (head-major) are split into one contiguous queue per worker, so workers start on
  // different heads and pack different keys; a worker that runs dry takes tasks from the
  // front of the others' queues, so a thread that is descheduled or slowed down by a
  // neighbour does not hold up the call.
  const int64_t workers =
      std::min({threads, tasks, std::max<int64_t>(1, m * keys * d * heads / kWorkPerThread)});
  struct Queue {
    std::atomic<int64_t> next{0};
    int64_t end = 0;
  };
  std::unique_ptr<Queue[]> queues(new Queue[static_cast<size_t>(workers)]);
  for (int64_t w = 0; w < workers; ++w) {
    queues[w].next = w * tasks / workers;
    queues[w].end = (w + 1) * tasks / workers;
  }
  cpu::parallel_for(0, workers, 1, [&](int64_t begin, int64_t) {
    std::vector<float> scratch(
        static_cast<size_t>(cpu::attention_scratch_floats(p.padded_head_dim)));
    for (int64_t i = 0; i < workers; ++i) {
      // Own queues first, then the others' in order.
      Queue& queue = queues[(begin + i) % workers];
      for (int64_t t = queue.next++; t < queue.end; t = queue.next++) {
        const int64_t head = t / tiles;
        const int64_t q0 = (t % tiles) * tile;
        kernel(p, head, q0, std::min(m, q0 + tile), scratch.data());
      }
    }
  });
  return out;
}

}  // namespace

bool cpu_isa_supported(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512:
      return cpu_has_avx512();
    case CpuIsa::kAvx2:
      return cpu_has_avx2();
    case CpuIsa::kAuto:
    case CpuIsa::kScalar:
      return true;
  }
  return false;
}

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAuto:
      return "auto";
    case CpuIsa::kAvx512:
      return "avx512";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kScalar:
      return "scalar";
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

at::Tensor masked_attention(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                            int64_t heads, double scale, CpuIsa isa) {
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
  KvRows rows;
  rows.k = k.data_ptr<float>();
  rows.k_stride = k.stride(0);
  rows.v = v.data_ptr<float>();
  rows.v_stride = v.stride(0);
  return attend(q, rows, k.size(0), heads, scale, isa);
}

at::Tensor masked_attention_over_cache(const at::Tensor& q_in, const uint16_t* k_cache, const uint16_t* v_cache,
                                       int64_t keys, const at::Tensor& fresh_ids, const at::Tensor& fresh_k_in,
                                       const at::Tensor& fresh_v_in, int64_t heads, double scale, CpuIsa isa) {
  check_input(q_in, "q");
  check_input(fresh_k_in, "fresh_k");
  check_input(fresh_v_in, "fresh_v");
  TORCH_CHECK(cpu_isa_supported(isa), "masked_attention_over_cache: this CPU does not support ", cpu_isa_name(isa));
  TORCH_CHECK(k_cache != nullptr && v_cache != nullptr, "masked_attention_over_cache: null K or V slab");
  TORCH_CHECK(heads > 0, "masked_attention_over_cache: heads must be positive, got ", heads);
  TORCH_CHECK(keys > 0, "masked_attention_over_cache: the cache has no rows (L = 0)");
  const int64_t width = q_in.size(1);
  TORCH_CHECK(width > 0 && width % heads == 0, "masked_attention_over_cache: q has ", width,
              " columns, expected a positive multiple of heads = ", heads);
  TORCH_CHECK(fresh_k_in.size(1) == width && fresh_v_in.size(1) == width, "masked_attention_over_cache: fresh_k is ",
              fresh_k_in.sizes(), " and fresh_v is ", fresh_v_in.sizes(), ", expected [R, ", width, "]");
  TORCH_CHECK(fresh_ids.dim() == 1 && fresh_ids.scalar_type() == at::kLong && fresh_ids.device().is_cpu(),
              "masked_attention_over_cache: fresh_ids must be a 1-D int64 CPU tensor");
  const int64_t fresh = fresh_ids.size(0);
  TORCH_CHECK(fresh_k_in.size(0) == fresh && fresh_v_in.size(0) == fresh, "masked_attention_over_cache: ", fresh,
              " fresh ids but fresh_k has ", fresh_k_in.size(0), " rows and fresh_v ", fresh_v_in.size(0));
  const at::Tensor q = with_contiguous_rows(q_in);
  const at::Tensor fresh_k = with_contiguous_rows(fresh_k_in);
  const at::Tensor fresh_v = with_contiguous_rows(fresh_v_in);

  // Token -> fresh row; kept per thread so the step loop does not allocate.
  thread_local std::vector<int32_t> fresh_row;
  fresh_row.assign(static_cast<size_t>(keys), -1);
  const at::Tensor ids = fresh_ids.contiguous();
  const int64_t* id = ids.data_ptr<int64_t>();
  for (int64_t r = 0; r < fresh; ++r) {
    TORCH_CHECK(id[r] >= 0 && id[r] < keys, "masked_attention_over_cache: fresh id ", id[r], " is outside [0, ", keys,
                ")");
    fresh_row[static_cast<size_t>(id[r])] = static_cast<int32_t>(r);
  }
  const CpuIsa resolved = isa == CpuIsa::kAuto ? best_cpu_isa() : isa;
  if (resolved != CpuIsa::kAvx512) {
    // Only AVX-512 packs straight from fp16; elsewhere the slabs are converted to float
    // (F16C where present) and the fresh rows written over them, as the cache path did before.
    thread_local at::Tensor k_float, v_float;
    for (at::Tensor* t : {&k_float, &v_float}) {
      if (!t->defined() || t->size(0) != keys || t->size(1) != width) *t = at::empty({keys, width}, at::kFloat);
    }
    half_to_float(k_cache, k_float.data_ptr<float>(), keys * width);
    half_to_float(v_cache, v_float.data_ptr<float>(), keys * width);
    k_float.index_copy_(0, fresh_ids, fresh_k);
    v_float.index_copy_(0, fresh_ids, fresh_v);
    return masked_attention(q, k_float, v_float, heads, scale, resolved);
  }
  KvRows rows;
  rows.k_half = k_cache;
  rows.v_half = v_cache;
  rows.fresh_row = fresh_row.data();
  rows.fresh_k = fresh_k.data_ptr<float>();
  rows.fresh_k_stride = fresh_k.stride(0);
  rows.fresh_v = fresh_v.data_ptr<float>();
  rows.fresh_v_stride = fresh_v.stride(0);
  return attend(q, rows, keys, heads, scale, isa);
}

at::Tensor masked_attention_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      int64_t heads, double scale) {
  TORCH_CHECK(q.dim() == 2 && k.dim() == 2 && v.dim() == 2 && heads > 0 && q.size(1) % heads == 0,
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
