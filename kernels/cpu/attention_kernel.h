#pragma once
/// Private interface between the masked-attention front end (kernels/masked_attention.cpp)
/// and its per-instruction-set tile kernels (kernels/cpu/attention_*.cpp).

#include <cstdint>

namespace infill::kernels::cpu {

/// Keys per K panel: K is repacked per head into panels [d, kKeyPanel] so that the score
/// kernel reads consecutive memory and never walks a 4 KiB-strided column.
constexpr int64_t kKeyPanel = 64;
/// Keys per online-softmax step (a multiple of kKeyPanel).
constexpr int64_t kKeyBlock = 128;
/// Most query rows one tile kernel call handles.
constexpr int64_t kMaxQueryTile = 24;

/// One attention problem in raw-pointer form. All strides are in floats.
struct AttentionProblem {
  const float* q = nullptr;  // [M, heads * d], row stride q_row_stride
  int64_t q_row_stride = 0;
  // K packed per head: [heads, keys_padded / kKeyPanel, d, kKeyPanel]; padded keys are zero.
  // Null when the queries are too few to repay packing: scores are then dot products over
  // the rows of k (row stride k_row_stride).
  const float* k_panels = nullptr;
  const float* k = nullptr;
  int64_t k_row_stride = 0;
  // V of head h, key j, column c at v[h * v_head_stride + j * v_row_stride + c]; columns up to
  // padded_head_dim are readable (zeros past head_dim when V was repacked).
  const float* v = nullptr;
  int64_t v_row_stride = 0;
  int64_t v_head_stride = 0;
  // When set, called before the tile kernel touches keys [panel * kKeyPanel, +kKeyPanel) of
  // `head` (in K panels or packed V), so packing can happen lazily, right before first use.
  void (*prepare_keys)(const void* ctx, int64_t head, int64_t panel) = nullptr;
  const void* prepare_ctx = nullptr;
  float* out = nullptr;  // [M, heads * d], row stride out_row_stride
  int64_t out_row_stride = 0;
  int64_t queries = 0;      // M
  int64_t keys = 0;         // L >= 1
  int64_t keys_padded = 0;  // L rounded up to kKeyPanel
  int64_t heads = 0;
  int64_t head_dim = 0;         // d
  int64_t padded_head_dim = 0;  // d rounded up to kHeadDimAlign
  float scale = 1.0f;
};

/// V columns are processed in vectors of up to 16 floats; head_dim is padded to this.
constexpr int64_t kHeadDimAlign = 16;

/// Below this many query rows per head, scores are computed from the rows of K directly:
/// packing K costs about as much as attending ~8 queries.
constexpr int64_t kMinQueriesForPanels = 8;

/// Scores below the row maximum by more than this contribute exp(-60) < 1e-26 of the
/// largest term, far below float resolution of the row sum; they are flushed to zero, which
/// also keeps denormals (and their microcode assists) out of the P * V products.
constexpr float kExpCutoff = -60.0f;

/// Floats of scratch one tile call needs (per thread, reused across calls).
inline int64_t attention_scratch_floats(int64_t padded_head_dim) {
  return 2 * kMaxQueryTile * padded_head_dim + kMaxQueryTile * kKeyBlock;
}

/// Attends query rows [q_begin, q_end) (at most kMaxQueryTile) of one head against all keys
/// and writes their output rows. `scratch` holds attention_scratch_floats() floats.
using AttendTileFn = void (*)(const AttentionProblem& p, int64_t head, int64_t q_begin,
                              int64_t q_end, float* scratch);

void attend_tile_avx512(const AttentionProblem& p, int64_t head, int64_t q_begin, int64_t q_end,
                        float* scratch);
void attend_tile_avx2(const AttentionProblem& p, int64_t head, int64_t q_begin, int64_t q_end,
                      float* scratch);
void attend_tile_scalar(const AttentionProblem& p, int64_t head, int64_t q_begin, int64_t q_end,
                        float* scratch);

/// Packs up to kKeyPanel keys of one head into a [d, kKeyPanel] panel: panel[c * kKeyPanel + j]
/// = k[j * k_row_stride + c] for j < keys, zero for keys <= j < kKeyPanel.
using PackKPanelFn = void (*)(const float* k, int64_t k_row_stride, int64_t keys, int64_t d,
                              float* panel);

void pack_k_panel_avx512(const float* k, int64_t k_row_stride, int64_t keys, int64_t d,
                         float* panel);
void pack_k_panel_scalar(const float* k, int64_t k_row_stride, int64_t keys, int64_t d,
                         float* panel);

/// pack_k_panel from IEEE binary16 keys (the activation cache's fp16 slabs), converting on
/// the way. AVX-512 only: other CPUs convert the slabs to float first (masked_attention.cpp).
void pack_k_panel_half_avx512(const uint16_t* k, int64_t k_row_stride, int64_t keys, int64_t d, float* panel);

/// dst[j * dst_row_stride + c] = float(src[j * src_row_stride + c]) for j < rows, c < d.
void convert_half_rows_avx512(const uint16_t* src, int64_t src_row_stride, int64_t rows, int64_t d, float* dst,
                              int64_t dst_row_stride);

}  // namespace infill::kernels::cpu
