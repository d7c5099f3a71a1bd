#pragma once
/// The masked-attention tile kernel, written once over a small vector-ISA traits type and
/// instantiated by each kernels/cpu/attention_<isa>.cpp under its own `#pragma GCC target`.
///
/// Include this header AFTER <algorithm>, <cmath>, <cstdint> and <limits> and after the
/// target pragma: everything here has internal linkage, so each instruction set gets its own
/// copy and no AVX-512 code can leak into an inline function another file would use.
///
/// A traits type V provides: Reg, kWidth (floats per Reg), kScoreVecs (Regs of keys per
/// score micro-tile), kPvVecs (Regs of head dims per P*V micro-tile), and static zero, set1,
/// load, load_first(p, n) (the first n < kWidth floats, zeros after; reads nothing past them),
/// store (unaligned), add, sub, mul, max, fma(a, b, c) = a * b + c, exp (for x <= 0: e^x, and
/// 0 below kExpCutoff), reduce_max, reduce_add.
///
/// Per (head, tile of up to kMaxQueryTile queries), for each block of kKeyBlock keys:
///   S = (scale * Q) K^T       keys in vector lanes, K read from [d, kKeyPanel] panels
///                             (or, for few queries, dot products over unpacked K rows)
///   online softmax per row    m_new = max(m, rowmax S); O, l rescaled by exp(m - m_new)
///   O += exp(S - m_new) V     head dims in vector lanes, P broadcast per key
/// Register tiles are kRows query rows by kScoreVecs / kPvVecs vectors.

#include "kernels/cpu/attention_kernel.h"

namespace infill::kernels::cpu {
namespace {

constexpr int kRows = 6;

template <class V, int R>
inline void score_micro(const float* qs, int64_t qs_stride, const float* kp, int64_t d, float* s,
                        int64_t s_stride) {
  constexpr int kNv = V::kScoreVecs;
  constexpr int kW = V::kWidth;
  typename V::Reg acc[R][kNv];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < kNv; ++v) acc[r][v] = V::zero();
  }
  for (int64_t c = 0; c < d; ++c) {
    const float* krow = kp + c * kKeyPanel;
    typename V::Reg kv[kNv];
#pragma GCC unroll 8
    for (int v = 0; v < kNv; ++v) kv[v] = V::load(krow + v * kW);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const typename V::Reg qb = V::set1(qs[r * qs_stride + c]);
#pragma GCC unroll 8
      for (int v = 0; v < kNv; ++v) acc[r][v] = V::fma(qb, kv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < kNv; ++v) V::store(s + r * s_stride + v * kW, acc[r][v]);
  }
}

template <class V>
inline void score_rows(int rows, const float* qs, int64_t qs_stride, const float* kp, int64_t d,
                       float* s, int64_t s_stride) {
  switch (rows) {
    case 1:
      score_micro<V, 1>(qs, qs_stride, kp, d, s, s_stride);
      break;
    case 2:
      score_micro<V, 2>(qs, qs_stride, kp, d, s, s_stride);
      break;
    case 3:
      score_micro<V, 3>(qs, qs_stride, kp, d, s, s_stride);
      break;
    case 4:
      score_micro<V, 4>(qs, qs_stride, kp, d, s, s_stride);
      break;
    case 5:
      score_micro<V, 5>(qs, qs_stride, kp, d, s, s_stride);
      break;
    default:
      score_micro<V, 6>(qs, qs_stride, kp, d, s, s_stride);
      break;
  }
}

// V rows are strided (heads side by side), which the hardware prefetchers follow poorly;
// the first row group of a block requests them kPrefetchRows keys ahead.
constexpr int64_t kPrefetchRows = 8;

template <class V, int R, int kNv>
inline void pv_micro(const float* ps, int64_t ps_stride, const float* vb, int64_t v_stride,
                     int64_t nk, float* o, int64_t o_stride, bool prefetch) {
  constexpr int kW = V::kWidth;
  typename V::Reg acc[R][kNv];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < kNv; ++v) acc[r][v] = V::load(o + r * o_stride + v * kW);
  }
  for (int64_t j = 0; j < nk; ++j) {
    const float* vrow = vb + j * v_stride;
    if (prefetch) {
      for (int64_t c = 0; c < kNv * kW; c += 16) {
        __builtin_prefetch(vrow + kPrefetchRows * v_stride + c);
      }
    }
    typename V::Reg vv[kNv];
#pragma GCC unroll 8
    for (int v = 0; v < kNv; ++v) vv[v] = V::load(vrow + v * kW);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const typename V::Reg pb = V::set1(ps[r * ps_stride + j]);
#pragma GCC unroll 8
      for (int v = 0; v < kNv; ++v) acc[r][v] = V::fma(pb, vv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < kNv; ++v) V::store(o + r * o_stride + v * kW, acc[r][v]);
  }
}

template <class V, int R>
inline void pv_vecs(int nv, const float* ps, int64_t ps_stride, const float* vb, int64_t v_stride,
                    int64_t nk, float* o, int64_t o_stride, bool prefetch) {
  static_assert(V::kPvVecs >= 1 && V::kPvVecs <= 4, "pv_vecs handles 1..4 vectors");
  switch (nv) {
    case 1:
      pv_micro<V, R, 1>(ps, ps_stride, vb, v_stride, nk, o, o_stride, prefetch);
      break;
    case 2:
      if constexpr (V::kPvVecs >= 2)
        pv_micro<V, R, 2>(ps, ps_stride, vb, v_stride, nk, o, o_stride, prefetch);
      break;
    case 3:
      if constexpr (V::kPvVecs >= 3)
        pv_micro<V, R, 3>(ps, ps_stride, vb, v_stride, nk, o, o_stride, prefetch);
      break;
    default:
      if constexpr (V::kPvVecs >= 4)
        pv_micro<V, R, 4>(ps, ps_stride, vb, v_stride, nk, o, o_stride, prefetch);
      break;
  }
}

template <class V>
inline void pv_rows(int rows, int nv, const float* ps, int64_t ps_stride, const float* vb,
                    int64_t v_stride, int64_t nk, float* o, int64_t o_stride, bool prefetch) {
  switch (rows) {
    case 1:
      pv_vecs<V, 1>(nv, ps, ps_stride, vb, v_stride, nk, o, o_stride, prefetch);
      break;
    case 2:
      pv_vecs<V, 2>(nv, ps, ps_stride, vb, v_stride, nk, o, o_stride, prefetch);
      break;
    case 3:
      pv_vecs<V, 3>(nv, ps, ps_stride, vb, v_stride, nk, o, o_stride, prefetch);
      break;
    case 4:
      pv_vecs<V, 4>(nv, ps, ps_stride, vb, v_stride, nk, o, o_stride, prefetch);
      break;
    case 5:
      pv_vecs<V, 5>(nv, ps, ps_stride, vb, v_stride, nk, o, o_stride, prefetch);
      break;
    default:
      pv_vecs<V, 6>(nv, ps, ps_stride, vb, v_stride, nk, o, o_stride, prefetch);
      break;
  }
}

// Scores of `rows` query rows against keys [key0, key0 + nk) as dot products over the rows
// of K: the path for few queries, where packing K would cost more than it saves.
template <class V>
inline void score_direct(const AttentionProblem& p, int64_t head, int64_t rows, const float* qs,
                         int64_t qs_stride, int64_t key0, int64_t nk, float* s, int64_t s_stride) {
  constexpr int kW = V::kWidth;
  const int64_t d = p.head_dim;
  const int64_t full = d / kW * kW;
  for (int64_t j = 0; j < nk; ++j) {
    const float* krow = p.k + (key0 + j) * p.k_row_stride + head * d;
    for (int64_t r = 0; r < rows; ++r) {
      const float* qrow = qs + r * qs_stride;
      typename V::Reg acc0 = V::zero();
      typename V::Reg acc1 = V::zero();
      int64_t c = 0;
      for (; c + 2 * kW <= full; c += 2 * kW) {
        acc0 = V::fma(V::load(qrow + c), V::load(krow + c), acc0);
        acc1 = V::fma(V::load(qrow + c + kW), V::load(krow + c + kW), acc1);
      }
      if (c < full) {
        acc0 = V::fma(V::load(qrow + c), V::load(krow + c), acc0);
        c += kW;
      }
      if (c < d) {
        acc1 = V::fma(V::load(qrow + c), V::load_first(krow + c, static_cast<int>(d - c)), acc1);
      }
      s[r * s_stride + j] = V::reduce_add(V::add(acc0, acc1));
    }
  }
}

// Online-softmax update of one query row for a block of `nk` scores (in place: scores
// become probabilities relative to the new running max). Returns the factor by which the
// row's accumulated output must be rescaled.
template <class V>
inline float softmax_update(float* srow, int64_t nk, float& m, float& l) {
  constexpr int kW = V::kWidth;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const int64_t nvec = (nk + kW - 1) / kW;
  for (int64_t j = nk; j < nvec * kW; ++j) srow[j] = kNegInf;
  typename V::Reg mx = V::set1(kNegInf);
  for (int64_t i = 0; i < nvec; ++i) mx = V::max(mx, V::load(srow + i * kW));
  const float m_new = std::max(m, V::reduce_max(mx));
  // Most blocks do not raise the running max; they skip the scalar exp.
  const float alpha = m_new == m ? 1.0f : m - m_new < kExpCutoff ? 0.0f : std::exp(m - m_new);
  const typename V::Reg mv = V::set1(m_new);
  typename V::Reg sum = V::zero();
  for (int64_t i = 0; i < nvec; ++i) {
    const typename V::Reg e = V::exp(V::sub(V::load(srow + i * kW), mv));
    V::store(srow + i * kW, e);
    sum = V::add(sum, e);
  }
  l = l * alpha + V::reduce_add(sum);
  m = m_new;
  return alpha;
}

template <class V>
void attend_tile(const AttentionProblem& p, int64_t head, int64_t q_begin, int64_t q_end,
                 float* scratch) {
  constexpr int kW = V::kWidth;
  constexpr int64_t kKeyChunk = V::kScoreVecs * kW;
  static_assert(kKeyPanel % kKeyChunk == 0 && kKeyBlock % kKeyPanel == 0,
                "score chunks must tile key panels and blocks");
  const int64_t rows = q_end - q_begin;
  const int64_t d = p.head_dim;
  const int64_t dp = p.padded_head_dim;
  float* qs = scratch;                 // [rows, dp] scaled queries
  float* o = qs + kMaxQueryTile * dp;  // [rows, dp] unnormalised output
  float* s = o + kMaxQueryTile * dp;   // [rows, kKeyBlock] scores, then probabilities
  float m[kMaxQueryTile];
  float l[kMaxQueryTile];
  for (int64_t r = 0; r < rows; ++r) {
    const float* qrow = p.q + (q_begin + r) * p.q_row_stride + head * d;
    for (int64_t c = 0; c < d; ++c) qs[r * dp + c] = qrow[c] * p.scale;
    for (int64_t c = d; c < dp; ++c) qs[r * dp + c] = 0.0f;
    for (int64_t c = 0; c < dp; ++c) o[r * dp + c] = 0.0f;
    m[r] = -std::numeric_limits<float>::infinity();
    l[r] = 0.0f;
  }

  const float* kh = p.k_panels ? p.k_panels + head * p.keys_padded * d : nullptr;
  const float* vh = p.v + head * p.v_head_stride;
  const int64_t dvecs = dp / kW;
  const int64_t pv_chunks = (dvecs + V::kPvVecs - 1) / V::kPvVecs;
  const int64_t pv_chunk_vecs = (dvecs + pv_chunks - 1) / pv_chunks;

  for (int64_t kb0 = 0; kb0 < p.keys; kb0 += kKeyBlock) {
    const int64_t nk = std::min(kKeyBlock, p.keys - kb0);
    if (p.prepare_keys) {
      for (int64_t key = kb0; key < kb0 + nk; key += kKeyPanel) {
        p.prepare_keys(p.prepare_ctx, head, key / kKeyPanel);
      }
    }
    if (!p.k_panels) score_direct<V>(p, head, rows, qs, dp, kb0, nk, s, kKeyBlock);
    for (int64_t j0 = 0; p.k_panels && j0 < nk; j0 += kKeyChunk) {
      const int64_t key = kb0 + j0;
      const float* kp = kh + (key / kKeyPanel) * d * kKeyPanel + key % kKeyPanel;
      for (int64_t r0 = 0; r0 < rows; r0 += kRows) {
        score_rows<V>(static_cast<int>(std::min<int64_t>(kRows, rows - r0)), qs + r0 * dp, dp, kp,
                      d, s + r0 * kKeyBlock + j0, kKeyBlock);
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      const float alpha = softmax_update<V>(s + r * kKeyBlock, nk, m[r], l[r]);
      if (alpha != 1.0f) {
        const typename V::Reg av = V::set1(alpha);
        float* orow = o + r * dp;
        for (int64_t i = 0; i < dvecs; ++i)
          V::store(orow + i * kW, V::mul(V::load(orow + i * kW), av));
      }
    }
    const float* vb = vh + kb0 * p.v_row_stride;
    for (int64_t c0 = 0; c0 < dvecs; c0 += pv_chunk_vecs) {
      const int nv = static_cast<int>(std::min(pv_chunk_vecs, dvecs - c0));
      for (int64_t r0 = 0; r0 < rows; r0 += kRows) {
        pv_rows<V>(static_cast<int>(std::min<int64_t>(kRows, rows - r0)), nv, s + r0 * kKeyBlock,
                   kKeyBlock, vb + c0 * kW, p.v_row_stride, nk, o + r0 * dp + c0 * kW, dp, r0 == 0);
      }
    }
  }

  for (int64_t r = 0; r < rows; ++r) {
    const float inv = 1.0f / l[r];
    float* orow = p.out + (q_begin + r) * p.out_row_stride + head * d;
    for (int64_t c = 0; c < d; ++c) orow[c] = o[r * dp + c] * inv;
  }
}

}  // namespace
}  // namespace infill::kernels::cpu
