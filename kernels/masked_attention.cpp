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

// Lazy packing of K (into panels) and, when d is not a multiple of the vector width, of V
// (into [L, padded d] with zero columns), one (head, key panel) at a time. The tile kernel
// asks for a panel right before it uses it: the first thread to ask packs it, so packing is
// shared by the threads, needs no fork / join of its own, and the packed panel is still in
// cache when it is read.
class KeyPacker {
 public:
  KeyPacker(const at::Tensor& k, const at::Tensor& v, const cpu::AttentionProblem& p,
            cpu::PackKPanelFn pack_panel, float* k_panels, float* v_packed)
      : k_(k.data_ptr<float>()),
        k_stride_(k.stride(0)),
        v_(v.data_ptr<float>()),
        v_stride_(v.stride(0)),
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
    const int64_t key0 = panel * cpu::kKeyPanel;
    const int64_t n = std::min(cpu::kKeyPanel, p_.keys - key0);
    if (k_panels_) {
      pack_panel_(k_ + key0 * k_stride_ + head * d, k_stride_, n, d,
                  k_panels_ + head * p_.keys_padded * d + key0 * d);
    }
    if (v_packed_) {
      const int64_t dp = p_.padded_head_dim;
      float* dst = v_packed_ + (head * p_.keys + key0) * dp;
      for (int64_t key = key0; key < key0 + n; ++key, dst += dp) {
        std::memcpy(dst, v_ + key * v_stride_ + head * d, static_cast<size_t>(d) * sizeof(float));
        std::fill(dst + d, dst + dp, 0.0f);
      }
    }
  }

  const float* k_;
  int64_t k_stride_;
  const float* v_;
  int64_t v_stride_;
  const cpu::AttentionProblem& p_;
  cpu::PackKPanelFn pack_panel_;
  float* k_panels_;
  float* v_packed_;
  int64_t panels_per_head_;
  std::vector<std::atomic<int>> state_;
};

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
  const int64_t m = q.size(0);
  const int64_t keys = k.size(0);
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

  p.k = k.data_ptr<float>();
  p.k_row_stride = k.stride(0);
  p.v = v.data_ptr<float>();
  p.v_row_stride = v.stride(0);
  p.v_head_stride = d;

  thread_local std::vector<float> k_panels_buffer;
  thread_local std::vector<float> v_packed_buffer;
  float* k_panels = nullptr;
  float* v_packed = nullptr;
  if (m >= cpu::kMinQueriesForPanels) {
    k_panels = thread_buffer(k_panels_buffer, heads * p.keys_padded * d);
    p.k_panels = k_panels;
  }
  if (p.padded_head_dim != d) {
    v_packed = thread_buffer(v_packed_buffer, heads * keys * p.padded_head_dim);
    p.v = v_packed;
    p.v_row_stride = p.padded_head_dim;
    p.v_head_stride = keys * p.padded_head_dim;
  }
  KeyPacker packer(
      k, v, p, resolved == CpuIsa::kAvx512 ? &cpu::pack_k_panel_avx512 : &cpu::pack_k_panel_scalar,
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
