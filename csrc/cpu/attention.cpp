// Paged attention on the CPU (see the kernel contract in chatpage/engine/model/attention.py).
//
// Work is cut into items: a tile of consecutive query rows of one sequence (one row for a decode
// step, up to 16 for prefill) against a range of that sequence's key blocks. An item walks its
// blocks in order; for every block it visits each KV head once, and every query head of that head's
// GQA group (and every row of the tile) reuses the block while it sits in L1. Softmax is online,
// one block at a time: scores for the block, new running max, rescale, accumulate V.
//
// An item of a tile whose rows x GQA heads fill a vector (prefill) runs run_tile instead: query
// vectors as lanes, a chunk of keys' scores by broadcast FMAs, no horizontal sums (see there; 4
// prompts of 256 tokens, 30 layers, bf16 cache, 2 threads on a Zen 4: 103 -> 76 ms). Over a bf16
// cache on a CPU with AMX it runs on the tiles instead (run_tile_amx: both products as bf16
// tile multiplications, fp32 queries and the softmax's weights split into bf16 terms so the
// result keeps fp32's precision).
//
// When there are fewer sequences than threads can share, long contexts are split into several
// items (flash-decoding); each writes its unnormalised partial state and a second pass merges them.
// Items are handed out largest first from an atomic counter, so uneven lengths balance out.
//
// A sequence of at most kRowByRow query rows (a decode step's one, a speculative verification's
// few) runs row by row: each row's context cut into pieces by its own length alone
// (kRowPieceKeys keys a piece), and its sums its own, block by block in order, by run_item
// (never run_tile). So a row's result does not depend on the other rows of the call, its own
// sequence's included: a verification of k drafted tokens gives each row the bits the decode
// step of that row alone gives (row invariance: exact speculative decoding). The rows of such a
// sequence that are cut alike share one item, so each block is read once for all of them (a
// verification of 15 drafts at 2,400 tokens of context, 1 thread: see docs/kernels.md).
//
// Vectors are vec.h's eight lanes, or sixteen (one zmm register) where the build has AVX-512 and
// head_dim and block_size are multiples of 16. An fp32 cache is read where it lies. Of a bf16 or
// fp16 cache block, run_item reads the values in place (group_pv: each row widened in registers
// once for the GQA group's heads), and the keys too with AVX-512 (group_scores); with AVX2 it
// widens the keys to fp32 once per KV head into a per-thread buffer, which every query head of
// the group and every row of the tile then reads from L1. run_tile widens both.
//
// An int8 cache (rows of head_dim int8 values and their fp16 scale, attention.py's quantize_kv)
// is read as a half-precision one is, the scale taken out of the sums: a key's score is its row's
// scale times q . k over the int8 values, and a value row's weight p times its scale; run_item
// reads a block head's scales into two small arrays first. Where keys or values are widened into
// a buffer (AVX2's keys, run_tile), the rows are scaled as they are widened. With AVX-512BW,
// run_item scores int8 keys in integers instead (group_scores_int): its queries as int16, the
// products summed exactly in int32 lanes, half the instructions of widening the keys to floats.
//
// A sliding window (window > 0: the query at position p sees keys p - window < j <= p) starts each
// item at the block of its first row's earliest key; no block before it is read.
#include "checks.h"
#include "cpu/amx.h"
#include "cpu/ops_cpu.h"
#include "cpu/vec.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

namespace chatpage::cpu {
namespace {

constexpr int kMaxBlockSize = 256;  // scores of one block live on the stack
constexpr int kMaxTileRows = 16;
// a GQA group's heads whose scores are computed, then updated (group_scores holds 8 vectors of
// each in registers)
constexpr int kHeadsAtOnce = 3;
constexpr int64_t kMinPieceCost = 128;  // query-row x key pairs below which a split does not pay
constexpr int64_t kRowByRow = 16;  // query rows of a sequence up to which it runs row by row
constexpr int64_t kRowPieceKeys = 512;  // keys per piece of a row run alone

// Everything the items of one call share.
struct Geometry {
  int block_size, kv_heads, q_heads, group, head_dim;
  int state_stride;  // floats per (row, q head) state: acc[head_dim], running max, running sum
  int64_t head_stride;  // cache elements from one KV head's row of a token to the next's
  int64_t block_stride, token_stride;  // cache elements per block / per token
  const float* query;            // fp32 queries, or
  const c10::BFloat16* query16;  // bf16 ones (the other pointer null)
  int64_t q_row_stride, q_head_stride;
  float scale;
  int64_t window;  // 0: every earlier key
  float* out;            // fp32 output, or
  c10::BFloat16* out16;  // bf16 (the other pointer null)
  int64_t o_row_stride, o_head_stride;
  bool amx;  // tiles run on AMX (run_tile_amx): a bf16 cache, the shapes it takes
  int q_terms, p_terms;  // (amx) bf16 terms of a query and of a key's weight
};

// Query head h of row `row` times the scale: its d values into dst.
inline void scaled_query(const Geometry& g, int64_t row, int h, float* dst) {
  const int64_t at = row * g.q_row_stride + h * g.q_head_stride;
  if (g.query16) {
    for (int c = 0; c < g.head_dim; ++c) dst[c] = static_cast<float>(g.query16[at + c]) * g.scale;
  } else {
    for (int c = 0; c < g.head_dim; ++c) dst[c] = g.query[at + c] * g.scale;
  }
}

// Output head h of row `row`: the d values of src times inv.
inline void store_out(const Geometry& g, int64_t row, int h, const float* src, float inv) {
  const int64_t at = row * g.o_row_stride + h * g.o_head_stride;
  if (g.out16) {
    int i = 0;
#if defined(__AVX512BF16__)
    // (round to nearest even, as c10's conversion)
    const __m512 iv = _mm512_set1_ps(inv);
    for (; i + 16 <= g.head_dim; i += 16) {
      const __m256bh y = _mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_loadu_ps(src + i), iv));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(g.out16 + at + i), (__m256i)y);
    }
#endif
    for (; i < g.head_dim; ++i) g.out16[at + i] = static_cast<c10::BFloat16>(src[i] * inv);
  } else {
    for (int i = 0; i < g.head_dim; ++i) g.out[at + i] = src[i] * inv;
  }
}

struct WorkItem {
  int64_t first_row;  // row of query/out
  int64_t first_pos;  // position of that row in its sequence (it sees keys up to first_pos)
  int rows;
  const int32_t* table;
  int64_t blk_begin, blk_end;
  int64_t state;  // offset of its partial states, or -1: finalise straight into out
  int64_t cost;
  bool alone;  // rows of a sequence run row by row: pieces by a row's own length
  int64_t pieces;  // (alone) the pieces each of its rows is cut into
};

// Lane `lane` of lane group lg of KV head kvh in a tile (run_tile, run_tile_amx: query vector
// i = lg * lanes + lane is row i / group, query head kvh * group + i % group): starts its running
// max m and sum l, sets the positions of the keys it sees [lo, hi], and returns its row and query
// head, or {-1, -1} for a spare lane past the item's vectors (lo > hi: it sees no key).
inline std::pair<int, int> start_lane(const Geometry& g, const WorkItem& w, int kvh, int i,
                                      int lane, float* m, float* l, float* lo, float* hi) {
  m[lane] = kNegInf;
  l[lane] = 0.0f;
  if (i >= w.rows * g.group) {
    lo[lane] = 1.0f;
    hi[lane] = -1.0f;
    return {-1, -1};
  }
  const int r = i / g.group;
  const int64_t pos = w.first_pos + r;
  hi[lane] = static_cast<float>(pos);
  lo[lane] = g.window > 0 ? static_cast<float>(pos - g.window + 1) : 0.0f;
  return {r, kvh * g.group + i % g.group};
}

// Partial states of `pieces` items covering the same rows, stored one after another.
struct MergeGroup {
  int64_t first_row;
  int rows;
  int64_t state;
  int pieces;
};

// The vector width the kernels are written against: vec.h's eight lanes everywhere, its Lanes16
// (one zmm register) where the build has AVX-512 and the shapes are multiples of 16.
struct Lanes8 {
  using V = Vec8;
  static constexpr int kWidth = 8;
  static V zero() { return zero8(); }
  static V splat(float x) { return splat8(x); }
  template <typename T>
  static V load(const T* p) { return load8(p); }
  static void store(float* p, V a) { store8(p, a); }
  static V add(V a, V b) { return add8(a, b); }
  static V sub(V a, V b) { return sub8(a, b); }
  static V mul(V a, V b) { return mul8(a, b); }
  static V max(V a, V b) { return max8(a, b); }
  static V fma(V a, V b, V c) { return fma8(a, b, c); }
  static V keep_first(V a, int n, float fill) { return keep_first8(a, n, fill); }
  static V keep_between(V a, V lo, V hi, float x, float fill) {
    return keep_between8(a, lo, hi, x, fill);
  }
  static float hsum(V a) { return hsum8(a); }
  static float hmax(V a) { return hmax8(a); }
  static V transpose_sum(const V* a) { return transpose_sum8(a); }
  static V exp(V a) { return exp8(a); }
};


template <typename L, typename KV>
inline float dot_row(const float* q, const KV* k, int nc) {
  constexpr int W = L::kWidth;
  typename L::V acc = L::zero();
  for (int c = 0; c < nc; ++c) acc = L::fma(L::load(q + W * c), L::load(k + W * c), acc);
  return L::hsum(acc);
}

// The scores of the keys t .. t + W - 1 of a block that ends before them (n keys of it, from kt
// on, `ts` apart), one by one: -inf from the n-th on.
template <typename L, typename KV>
inline typename L::V tail_scores(const float* q, const KV* kt, int64_t ts, int n, int nc) {
  constexpr int W = L::kWidth;
  alignas(64) float tmp[W];
  for (int j = 0; j < W; ++j) tmp[j] = j < n ? dot_row<L>(q, kt + j * ts, nc) : kNegInf;
  return L::load(tmp);
}

// s[t] = q . k_t for the first n keys of one block (and -inf up to the next multiple of the
// width), keys `ts` floats apart; `room` keys from k on are readable. Returns the largest score.
template <typename L, int NC>
inline float block_scores(const float* q, const float* k, int64_t ts, int n, int room,
                          int nc_rt, float* s) {
  using V = typename L::V;
  constexpr int W = L::kWidth;
  const int nc = NC ? NC : nc_rt;
  V vmax = L::splat(kNegInf);
  for (int t = 0; t < n; t += W) {
    const float* kt = k + t * ts;
    V sc;
    if (t + W <= room) {
      // W keys at once: W vector accumulators, one transpose-add at the end
      V acc[W];
      for (int j = 0; j < W; ++j) acc[j] = L::zero();
      for (int c = 0; c < nc; ++c) {
        const V qc = L::load(q + W * c);
        for (int j = 0; j < W; ++j) acc[j] = L::fma(qc, L::load(kt + j * ts + W * c), acc[j]);
      }
      sc = L::transpose_sum(acc);
    } else {  // a block that ends before the next multiple of W: the last keys one by one
      sc = tail_scores<L>(q, kt, ts, n - t, nc);
    }
    if (t + W > n) sc = L::keep_first(sc, n - t, kNegInf);
    L::store(s + t, sc);
    vmax = L::max(vmax, sc);
  }
  return L::hmax(vmax);
}

#if CHATPAGE_AVX512
// The sums of sixteen keys' products for H query heads, eight keys at a time (H x 8 vectors of
// partial sums in registers): fill(i0, acc) adds keys i0 .. i0 + 7 into the zeroed acc[j][i],
// then each head's eight vectors are reduced along their lanes by op (Lanes16's half_reduce,
// then join of the two halves): lane t of sums[j] is key t's sum for head j.
template <int H, typename Fill, typename Op>
inline void sixteen_keys(Fill fill, Op op, __m512* sums) {
  using L = Lanes16;
  __m512 half[H];
  for (int hf = 0; hf < 2; ++hf) {
    __m512 acc[H][8];
    for (int j = 0; j < H; ++j) {
      for (int i = 0; i < 8; ++i) acc[j][i] = L::zero();
    }
    fill(8 * hf, acc);
    for (int j = 0; j < H; ++j) {
      const __m512 part = L::half_reduce(acc[j], op);
      if (hf == 0) {
        half[j] = part;
      } else {
        sums[j] = L::join(half[j], part, op);
      }
    }
  }
}

// A block's scores for H query heads, sixteen keys at a time: scores16(t, sc) sets sc[j] to head
// j's scores of keys t .. t + 15 (any values from the n-th key on); the keys from n on become -inf,
// head j's scores are row j of s (kMaxBlockSize apart), and bmax[j] is its largest.
template <int H, typename Scores16>
inline void scores_by_16(int n, Scores16 scores16, float* s, float* bmax) {
  using L = Lanes16;
  L::V vmax[H];
  for (int j = 0; j < H; ++j) vmax[j] = L::splat(kNegInf);
  for (int t = 0; t < n; t += 16) {
    L::V sc[H];
    scores16(t, sc);
    for (int j = 0; j < H; ++j) {
      if (t + 16 > n) sc[j] = L::keep_first(sc[j], n - t, kNegInf);
      L::store(s + j * kMaxBlockSize + t, sc[j]);
      vmax[j] = L::max(vmax[j], sc[j]);
    }
  }
  for (int j = 0; j < H; ++j) bmax[j] = L::hmax(vmax[j]);
}

// block_scores of H query heads of one KV head (queries q + j * d) over keys read where they lie
// in a half-precision cache (`ts` elements apart): each key row is widened in registers once for
// the H heads, and the scores of sixteen keys are taken eight keys at a time (H x 8 vector
// accumulators; Lanes16's half_reduce, then join), instead of widening the block's keys into a
// buffer first that every head then reads (decode of 64 rows x 320 keys, 30 layers, bf16 cache,
// 1 thread on a Zen 4: 58 -> 48.5 ms). s: H rows of kMaxBlockSize; bmax[j]: head j's largest.
template <int H, int NC, typename KV>
inline void group_scores(const float* q, int d, const KV* k, int64_t ts, int n, int room,
                         int nc_rt, const float* kscale, float* s, float* bmax) {
  using L = Lanes16;
  using V = L::V;
  constexpr int W = 16;
  const int nc = NC ? NC : nc_rt;
  scores_by_16<H>(
      n,
      [&](int t, V (&sc)[H]) {
        const KV* kt = k + t * ts;
        if (t + W <= room) {
          sixteen_keys<H>(
              [&](int i0, V (&acc)[H][8]) {
                for (int c = 0; c < nc; ++c) {
                  for (int i = 0; i < 8; ++i) {
                    const V key = L::load(kt + (i0 + i) * ts + W * c);
                    for (int j = 0; j < H; ++j)
                      acc[j][i] = L::fma(L::load(q + j * d + W * c), key, acc[j][i]);
                  }
                }
              },
              _mm512_add_ps, sc);
        } else {
          for (int j = 0; j < H; ++j) sc[j] = tail_scores<L>(q + j * d, kt, ts, n - t, nc);
        }
        if constexpr (std::is_same_v<KV, int8_t>) {
          for (int j = 0; j < H; ++j) sc[j] = L::mul(sc[j], L::load(kscale + t));
        }
      },
      s, bmax);
}
#endif

#if CHATPAGE_AVX512 && defined(__AVX512BW__)
#define CHATPAGE_INT_KEYS 1
// An int8 cache's keys against queries held as int16 (quantize_query: a query head's values times
// 32767 over its largest magnitude, rounded; its scale qs apart), the products summed in integers:
// 32 dims of a key widened to int16 once for the H heads, vpdpwssd (vpmaddwd + add without VNNI)
// into int32 lanes, the lanes of 16 keys reduced as group_scores does; a score is then
// float(sum) * qs * (the key row's scale). Integer sums are exact, so a key's score has the same
// bits whatever the order, the tail's one-by-one keys included (row invariance). Two widening
// instructions and H multiply-adds a 32 dims of a key, where the float path takes four and 2H
// (the int8 decode at 4k tokens of context was compute-bound: issue 44). Needs d % 32 == 0 and
// d <= 256 (the int32 sums: 256 x 32767 x 127 < 2^31).
inline __m512i dot_i16(__m512i acc, __m512i a, __m512i b) {
#if defined(__AVX512VNNI__)
  return _mm512_dpwssd_epi32(acc, a, b);
#else
  return _mm512_add_epi32(acc, _mm512_madd_epi16(a, b));
#endif
}

inline __m512i widen_key32(const int8_t* k) {
  return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(k)));
}

inline __m512 add_i32(__m512 a, __m512 b) {
  return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(a), _mm512_castps_si512(b)));
}

template <int H, int NC>
inline void group_scores_int(const int16_t* q, const float* qs, int d, const int8_t* k,
                             int64_t ts, int n, int room, int nc_rt, const float* kscale,
                             float* s, float* bmax) {
  using L = Lanes16;
  using V = L::V;
  constexpr int W = 16;
  const int np = (NC ? NC : nc_rt) / 2;  // 32-dim pieces of a head
  scores_by_16<H>(
      n,
      [&](int t, V (&sc)[H]) {  // (the int32 sums in float registers, then converted)
        const int8_t* kt = k + t * ts;
        if (t + W <= room) {
          sixteen_keys<H>(
              [&](int i0, V (&acc)[H][8]) {
                for (int c = 0; c < np; ++c) {
                  for (int i = 0; i < 8; ++i) {
                    const __m512i key = widen_key32(kt + (i0 + i) * ts + 32 * c);
                    for (int j = 0; j < H; ++j) {
                      const __m512i qc = _mm512_loadu_si512(q + j * d + 32 * c);
                      acc[j][i] =
                          _mm512_castsi512_ps(dot_i16(_mm512_castps_si512(acc[j][i]), qc, key));
                    }
                  }
                }
              },
              add_i32, sc);
        } else {  // a block that ends before the next 16 keys: the last keys one by one
          for (int j = 0; j < H; ++j) {
            alignas(64) int32_t one[W] = {};
            for (int i = 0; i < n - t; ++i) {
              __m512i acc = _mm512_setzero_si512();
              for (int c = 0; c < np; ++c)
                acc = dot_i16(acc, _mm512_loadu_si512(q + j * d + 32 * c),
                              widen_key32(kt + i * ts + 32 * c));
              one[i] = _mm512_reduce_add_epi32(acc);
            }
            sc[j] = _mm512_castsi512_ps(_mm512_load_si512(one));
          }
        }
        for (int j = 0; j < H; ++j) {
          const V sum = _mm512_cvtepi32_ps(_mm512_castps_si512(sc[j]));
          sc[j] = L::mul(L::mul(sum, L::splat(qs[j])), L::load(kscale + t));
        }
      },
      s, bmax);
}

#else
#define CHATPAGE_INT_KEYS 0
#endif

// A query head's d values (already times the softmax scale) as int16 for group_scores_int:
// q16 = round-half-even(x / qs) with qs = max |x| / 32767 (0 and all zeros for a head of zeros).
inline float quantize_query(const float* x, int d, int16_t* q16) {
  float m = 0.0f;
  for (int i = 0; i < d; ++i) m = std::max(m, std::fabs(x[i]));
  const float qs = m / 32767.0f;
  for (int i = 0; i < d; ++i)
    q16[i] = qs > 0.0f ? static_cast<int16_t>(std::nearbyint(x[i] / qs)) : int16_t{0};
  return qs;
}

// Whether run_item scores an int8 cache's keys in integers (group_scores_int).
template <typename L, typename KV>
constexpr bool int_scores(int d) {
  return CHATPAGE_INT_KEYS && std::is_same_v<KV, int8_t> && L::kWidth == 16 && d % 32 == 0 &&
         d <= 256;
}

// The online-softmax bookkeeping of one (row, q head) state (accumulator of d, running max,
// running sum) over a block's n scores in s (-inf past n up to the next multiple of the width):
// s becomes the weights exp(s - new max); returns the factor the accumulator is to be scaled by.
template <typename L>
inline float block_softmax(float* st, int d, int n, float* s, float bmax) {
  using V = typename L::V;
  constexpr int W = L::kWidth;
  if (bmax == kNegInf) {  // no finite score: the state stays as it is
    std::fill(s, s + n, 0.0f);
    return 1.0f;
  }
  const float m_old = st[d];
  const float m_new = std::max(m_old, bmax);
  const float alpha = m_old == m_new ? 1.0f : std::exp(m_old - m_new);
  const V mv = L::splat(m_new);
  V sum = L::zero();
  for (int t = 0; t < n; t += W) {
    const V p = L::exp(L::sub(L::load(s + t), mv));
    L::store(s + t, p);
    sum = L::add(sum, p);
  }
  st[d] = m_new;
  st[d + 1] = st[d + 1] * alpha + L::hsum(sum);
  return alpha;
}

// P x V of H query heads of one KV head over a block: acc_j = acc_j * alpha_j + sum_t p_j[t] v_t,
// with st[j] head j's state, p row j of kMaxBlockSize weights, v the first value row read (rows
// ts elements apart, as the cache holds them; of an int8 cache, p already times each row's
// scale: run_item). Each value row is loaded (and a half-precision one widened) once for the H
// heads, CG vectors of it at a time, instead of being widened into a buffer first (that took a
// quarter of a bf16 decode; 64 rows x 320 keys, 30 layers, 1 thread on a Zen 4: 71 -> 58 ms; a
// 32-row decode step of the default model 43 -> 38.5 ms).
template <typename L, int H, int CG, typename KV>
inline void group_pv(float* const* st, const float* alpha, const KV* v, int64_t ts, int n, int nc,
                     const float* p) {
  using V = typename L::V;
  constexpr int W = L::kWidth;
  for (int c0 = 0; c0 < nc; c0 += CG) {
    V acc[H][CG];
    for (int j = 0; j < H; ++j) {
      const V a = L::splat(alpha[j]);
      for (int i = 0; i < CG; ++i) acc[j][i] = L::mul(L::load(st[j] + W * (c0 + i)), a);
    }
    for (int t = 0; t < n; ++t) {
      V row[CG];
      for (int i = 0; i < CG; ++i) row[i] = L::load(v + t * ts + W * (c0 + i));
      for (int j = 0; j < H; ++j) {
        const V pj = L::splat(p[j * kMaxBlockSize + t]);
        for (int i = 0; i < CG; ++i) acc[j][i] = L::fma(pj, row[i], acc[j][i]);
      }
    }
    for (int j = 0; j < H; ++j) {
      for (int i = 0; i < CG; ++i) L::store(st[j] + W * (c0 + i), acc[j][i]);
    }
  }
}

// The fp16 scale after the d int8 values of an int8 cache row.
inline float row_scale(const int8_t* row, int d) {
  c10::Half h;
  std::memcpy(&h, row + d, sizeof(h));
  return static_cast<float>(h);
}

// The scales of n rows of an int8 cache (rows `ts` apart) into dst.
inline void row_scales(const int8_t* rows, int64_t ts, int n, int d, float* dst) {
  for (int t = 0; t < n; ++t) dst[t] = row_scale(rows + t * ts, d);
}

// The first n rows of one head of a block (rows `ts` apart) as fp32 rows of d (W * NC when NC is
// not 0), packed in dst (an int8 row times its scale).
template <typename L, int NC, typename KV>
inline void widen_rows(const KV* src, int64_t ts, int n, int d_rt, float* dst) {
  constexpr int W = L::kWidth;
  const int d = NC ? W * NC : d_rt;
  for (int t = 0; t < n; ++t) {
    if constexpr (std::is_same_v<KV, int8_t>) {
      const auto scale = L::splat(row_scale(src + t * ts, d));
      for (int c = 0; c < d; c += W)
        L::store(dst + t * d + c, L::mul(L::load(src + t * ts + c), scale));
    } else {
      for (int c = 0; c < d; c += W) L::store(dst + t * d + c, L::load(src + t * ts + c));
    }
  }
}

// KV head kvh's first `used` rows of a block's keys or values (heads hs elements apart) as fp32
// rows: where they lie in an fp32 cache, else widened into buf.
template <typename L, int NC, typename KV>
inline const float* head_rows(const KV* block, int kvh, int d, int64_t hs, int64_t ts, int used,
                              float* buf) {
  if constexpr (std::is_same_v<KV, float>) {
    return block + kvh * hs;
  } else {
    widen_rows<L, NC>(block + kvh * hs, ts, used, d, buf);
    return buf;
  }
}

// One item. A half-precision or int8 block's keys are widened to fp32 once per KV head (into
// kbuf) and then read by every query head of the group and every row of the tile, or with
// AVX-512 read in place by group_scores; an fp32 cache is read where it lies. Values are read
// where they lie, by group_pv.
template <typename L, typename KV, int NC>
void run_item(const Geometry& g, const KV* k_cache, const KV* v_cache, const WorkItem& w,
              float* state, float* qbuf, int16_t* q16, float* qscale, float* kbuf) {
  constexpr bool kDirect = std::is_same_v<KV, float>;
  const int d = g.head_dim, nc = d / L::kWidth, hq_n = g.q_heads, sd = g.state_stride;
  const bool int_keys = int_scores<L, KV>(d);
  for (int r = 0; r < w.rows; ++r) {
    for (int h = 0; h < hq_n; ++h) {
      float* dst = qbuf + (r * hq_n + h) * d;
      scaled_query(g, w.first_row + r, h, dst);
      if (int_keys) qscale[r * hq_n + h] = quantize_query(dst, d, q16 + (r * hq_n + h) * d);
      float* st = state + (r * hq_n + h) * sd;
      std::fill(st, st + d, 0.0f);
      st[d] = kNegInf;
      st[d + 1] = 0.0f;
    }
  }
  alignas(64) float s[kHeadsAtOnce * kMaxBlockSize];
  // an int8 block head's key and value scales (room for a vector read past the block's last)
  constexpr bool kInt8 = std::is_same_v<KV, int8_t>;
  alignas(64) float kscale[kInt8 ? kMaxBlockSize + 16 : 1] = {};
  alignas(64) float vscale[kInt8 ? kMaxBlockSize + 16 : 1] = {};
  const int bs = g.block_size;
  const int64_t ts = g.token_stride, hs = g.head_stride;
  const int64_t rs = kDirect ? ts : d;  // floats between the keys the scores read
  // a half-precision cache's keys read in place by group_scores (AVX-512), else widened
  constexpr bool kFuseKeys = CHATPAGE_AVX512 && L::kWidth == 16 && !kDirect;
  // vectors of a value row that group_pv holds at once for a group's heads (in registers: 32
  // vectors with AVX-512, 16 with AVX2)
  constexpr int kChunks =
      NC > 0 && NC % 4 == 0 && L::kWidth == 16 ? 4 : (NC > 0 && NC % 2 == 0 ? 2 : 1);
  for (int64_t blk = w.blk_begin; blk < w.blk_end; ++blk) {
    const int64_t tok0 = blk * bs;
    const int64_t phys = w.table[blk];
    const KV* kb = k_cache + phys * g.block_stride;
    const KV* vb = v_cache + phys * g.block_stride;
    // the tokens of this block that some row of the tile sees
    const int used = static_cast<int>(std::min<int64_t>(bs, w.first_pos + w.rows - tok0));
    // the next block is somewhere else in the pool: start fetching it into L2, a head's share at
    // a time (prefetcht1: with prefetcht0 the ~200 lines of a block fill L1's miss buffers and
    // the loads stall behind them; decode of 64 rows x 320 keys, 30 layers, on a Zen 4 took
    // 53 ms at 2 threads with it, 34 with prefetcht1)
    const char* next_k = nullptr;
    const char* next_v = nullptr;
    const int64_t bytes = g.block_stride * static_cast<int64_t>(sizeof(KV));
    if (blk + 1 < w.blk_end) {
      next_k = reinterpret_cast<const char*>(k_cache + w.table[blk + 1] * g.block_stride);
      next_v = reinterpret_cast<const char*>(v_cache + w.table[blk + 1] * g.block_stride);
    }
    for (int kvh = 0; kvh < g.kv_heads; ++kvh) {
      if (next_k != nullptr) {
        const int64_t lo = bytes * kvh / g.kv_heads, hi = bytes * (kvh + 1) / g.kv_heads;
        for (int64_t off = lo; off < hi; off += 64) {
          __builtin_prefetch(next_k + off, 0, 2);
          __builtin_prefetch(next_v + off, 0, 2);
        }
      }
      // the next head's rows of this block into L1 while this head's run (with the scores of a
      // GQA group's heads computed before their updates, below: decode of 64 rows x 320 keys,
      // 30 layers, bf16 cache, 1 thread on a Zen 4: 72 -> 66 ms)
      if (kvh + 1 < g.kv_heads) {
        for (int t = 0; t < used; ++t) {
          const char* kr = reinterpret_cast<const char*>(kb + (kvh + 1) * hs + t * ts);
          const char* vr = reinterpret_cast<const char*>(vb + (kvh + 1) * hs + t * ts);
          for (int64_t off = 0; off < d * static_cast<int64_t>(sizeof(KV)); off += 64) {
            __builtin_prefetch(kr + off, 0, 3);
            __builtin_prefetch(vr + off, 0, 3);
          }
        }
      }
      // keys widened into kbuf where group_scores does not read them in place
      const float* kh = kFuseKeys ? nullptr : head_rows<L, NC>(kb, kvh, d, hs, ts, used, kbuf);
      if constexpr (kInt8) {
        if (kFuseKeys) row_scales(kb + kvh * hs, ts, used, d, kscale);
        row_scales(vb + kvh * hs, ts, used, d, vscale);
      }
      for (int r = 0; r < w.rows; ++r) {
        const int64_t pos = w.first_pos + r;
        const int64_t visible = pos + 1 - tok0;
        // keys of this block before the row's window: skipped (the block's first `lo` tokens)
        const int64_t lo = g.window > 0 ? std::max<int64_t>(0, pos - g.window + 1 - tok0) : 0;
        if (visible <= 0 || lo >= bs) continue;
        const int n = static_cast<int>(std::min<int64_t>(bs, visible) - lo);
        const int room = bs - static_cast<int>(lo);  // tokens of the block from the first one read
        const KV* vr = vb + kvh * hs + lo * ts;
        for (int j0 = 0; j0 < g.group; j0 += kHeadsAtOnce) {
          const int heads = std::min(kHeadsAtOnce, g.group - j0);
          const int i0 = r * hq_n + kvh * g.group + j0;
          const float* q0 = qbuf + i0 * d;
          float bmax[kHeadsAtOnce], alpha[kHeadsAtOnce];
          float* st[kHeadsAtOnce];
          if (int_keys) {
#if CHATPAGE_INT_KEYS
            if constexpr (kInt8) {
              const int8_t* kr = kb + kvh * hs + lo * ts;
              const int16_t* qi = q16 + i0 * d;
              const float *qsc = qscale + i0, *ksc = kscale + lo;
              if (heads == 1) {
                group_scores_int<1, NC>(qi, qsc, d, kr, ts, n, room, nc, ksc, s, bmax);
              } else if (heads == 2) {
                group_scores_int<2, NC>(qi, qsc, d, kr, ts, n, room, nc, ksc, s, bmax);
              } else {
                group_scores_int<3, NC>(qi, qsc, d, kr, ts, n, room, nc, ksc, s, bmax);
              }
            }
#endif
          } else {
#if CHATPAGE_AVX512
            if constexpr (kFuseKeys) {
              const KV* kr = kb + kvh * hs + lo * ts;
              const float* ksc = kInt8 ? kscale + lo : nullptr;
              switch (heads) {
                case 1: group_scores<1, NC>(q0, d, kr, ts, n, room, nc, ksc, s, bmax); break;
                case 2: group_scores<2, NC>(q0, d, kr, ts, n, room, nc, ksc, s, bmax); break;
                default: group_scores<3, NC>(q0, d, kr, ts, n, room, nc, ksc, s, bmax); break;
              }
            } else
#endif
            {
              const float* kr = kh + lo * rs;
              for (int j = 0; j < heads; ++j)
                bmax[j] = block_scores<L, NC>(q0 + j * d, kr, rs, n, room, nc,
                                              s + j * kMaxBlockSize);
            }
          }
          for (int j = 0; j < heads; ++j) {
            st[j] = state + (i0 + j) * sd;
            alpha[j] = block_softmax<L>(st[j], d, n, s + j * kMaxBlockSize, bmax[j]);
          }
          if constexpr (kInt8) {  // each weight times its value row's scale, a vector at a time
            for (int j = 0; j < heads; ++j) {
              float* pj = s + j * kMaxBlockSize;
              for (int t = 0; t < n; t += L::kWidth)
                L::store(pj + t, L::mul(L::load(pj + t), L::load(vscale + lo + t)));
            }
          }
          switch (heads) {
            case 1: group_pv<L, 1, kChunks>(st, alpha, vr, ts, n, nc, s); break;
            case 2: group_pv<L, 2, kChunks>(st, alpha, vr, ts, n, nc, s); break;
            default: group_pv<L, 3, kChunks>(st, alpha, vr, ts, n, nc, s); break;
          }
        }
      }
    }
  }
}

// A tile of several query rows (prefill) as lanes: the rows x GQA heads of one KV head are W
// query vectors to a vector ("a lane group"; the last one's spare lanes see no key), held
// transposed (qt[d][W], ot[d][W]), so a chunk of W keys' scores is W vectors of W queries each:
// acc[t] += qt[c] * k_t[c] over the dims, with k_t[c] a broadcast. That needs no horizontal sum
// (run_item's transpose_sum per query head per block), and one load of qt[c] serves W keys' FMAs.
// The softmax then runs along lanes (max, exp, sum of W queries at a time), and P x V is
// ot[c] += p_t * v_t[c] with v_t[c] a broadcast. It ends with run_item's state layout (acc, max,
// sum per row and query head), so finalize and merge are shared.
//
// ws holds per KV head and lane group: qt and ot (d * W each), then the running max, the running
// sum, and each lane's first and last visible key position (W each).
template <typename L, typename KV, int NC>
void run_tile(const Geometry& g, const KV* k_cache, const KV* v_cache, const WorkItem& w,
              float* state, float* ws, float* kbuf, float* vbuf) {
  using V = typename L::V;
  constexpr int W = L::kWidth;
  constexpr bool kDirect = std::is_same_v<KV, float>;
  // accumulators of the output dims at once in P x V (the register file: 32 or 16 vectors)
  constexpr int kDims = W == 16 ? 16 : 8;
  const int d = NC ? W * NC : g.head_dim, hq_n = g.q_heads, sd = g.state_stride;
  const int vecs = w.rows * g.group, lane_groups = (vecs + W - 1) / W;
  const int64_t lg_floats = 2 * int64_t{d} * W + 4 * W;
  // lane group lg of KV head kvh: query vector i = lg * W + lane is row i / group, query head
  // kvh * group + i % group
  for (int kvh = 0; kvh < g.kv_heads; ++kvh) {
    for (int lg = 0; lg < lane_groups; ++lg) {
      float* qt = ws + (int64_t{kvh} * lane_groups + lg) * lg_floats;
      float* ot = qt + int64_t{d} * W;
      float *m = ot + int64_t{d} * W, *l = m + W, *lo = l + W, *hi = lo + W;
      for (int lane = 0; lane < W; ++lane) {
        const auto [r, h] = start_lane(g, w, kvh, lg * W + lane, lane, m, l, lo, hi);
        if (r >= 0) scaled_query(g, w.first_row + r, h, ot);  // (ot is zeroed below)
        for (int c = 0; c < d; ++c) qt[c * W + lane] = r < 0 ? 0.0f : ot[c];
      }
      std::fill(ot, ot + int64_t{d} * W, 0.0f);
    }
  }
  const int bs = g.block_size;
  const int64_t ts = g.token_stride;
  const int64_t rs = kDirect ? ts : d;  // floats between the keys of kh / vh
  const int64_t last_pos = w.first_pos + w.rows - 1;
  for (int64_t blk = w.blk_begin; blk < w.blk_end; ++blk) {
    const int64_t tok0 = blk * bs;
    const int64_t phys = w.table[blk];
    const KV* kb = k_cache + phys * g.block_stride;
    const KV* vb = v_cache + phys * g.block_stride;
    const int used = static_cast<int>(std::min<int64_t>(bs, last_pos + 1 - tok0));
    if (blk + 1 < w.blk_end) {  // the next block into L2 while this one is computed
      const char* nk = reinterpret_cast<const char*>(k_cache + w.table[blk + 1] * g.block_stride);
      const char* nv = reinterpret_cast<const char*>(v_cache + w.table[blk + 1] * g.block_stride);
      const int64_t bytes = g.block_stride * static_cast<int64_t>(sizeof(KV));
      for (int64_t off = 0; off < bytes; off += 64) {
        __builtin_prefetch(nk + off, 0, 2);
        __builtin_prefetch(nv + off, 0, 2);
      }
    }
    for (int kvh = 0; kvh < g.kv_heads; ++kvh) {
      const float* kh = head_rows<L, NC>(kb, kvh, d, g.head_stride, ts, used, kbuf);
      const float* vh = head_rows<L, NC>(vb, kvh, d, g.head_stride, ts, used, vbuf);
      for (int lg = 0; lg < lane_groups; ++lg) {
        float* qt = ws + (int64_t{kvh} * lane_groups + lg) * lg_floats;
        float* ot = qt + int64_t{d} * W;
        float *m = ot + int64_t{d} * W, *l = m + W, *lo = l + W, *hi = lo + W;
        const V lov = L::load(lo), hiv = L::load(hi);
        const float first_seen = *std::min_element(lo, lo + W);
        const float last_seen = *std::max_element(hi, hi + W);
        // every lane sees every key in [all_from, all_to]
        const float all_from = *std::max_element(lo, lo + W);
        const float all_to = *std::min_element(hi, hi + W);
        for (int t0 = 0; t0 < used; t0 += W) {
          const int n = std::min(W, used - t0);  // keys of the block from t0 on
          const float kp0 = static_cast<float>(tok0 + t0), kp1 = kp0 + static_cast<float>(n - 1);
          if (kp1 < first_seen || kp0 > last_seen) continue;  // no lane sees these keys
          const float* kt = kh + t0 * rs;
          const float* vt = vh + t0 * rs;
          V acc[W];
          for (int t = 0; t < W; ++t) acc[t] = L::zero();
          for (int c = 0; c < d; ++c) {
            const V qc = L::load(qt + c * W);
            for (int t = 0; t < W; ++t) acc[t] = L::fma(qc, L::splat(kt[t * rs + c]), acc[t]);
          }
          // keys past the block's used ones, and (lane by lane) keys outside a row's window
          if (n < W || kp0 < all_from || kp1 > all_to) {
            for (int t = 0; t < W; ++t)
              acc[t] = t < n ? L::keep_between(acc[t], lov, hiv, kp0 + t, kNegInf)
                             : L::splat(kNegInf);
          }
          V bmax = acc[0];
          for (int t = 1; t < W; ++t) bmax = L::max(bmax, acc[t]);
          const V m_old = L::load(m);
          const V m_new = L::max(m_old, bmax);
          // the max subtracted: a lane that has seen no key yet has -inf, which would give NaN
          const V m_sub = L::max(m_new, L::splat(-std::numeric_limits<float>::max()));
          const V alpha = L::exp(L::sub(m_old, m_sub));
          alignas(64) float p[W * W];
          V sum = L::zero();
          for (int t = 0; t < n; ++t) {
            const V pt = L::exp(L::sub(acc[t], m_sub));
            L::store(p + t * W, pt);
            sum = L::add(sum, pt);
          }
          L::store(m, m_new);
          L::store(l, L::fma(L::load(l), alpha, sum));
          for (int c0 = 0; c0 < d; c0 += kDims) {
            V o[kDims];
            for (int i = 0; i < kDims; ++i) o[i] = L::mul(L::load(ot + (c0 + i) * W), alpha);
            for (int t = 0; t < n; ++t) {
              const V pt = L::load(p + t * W);
              const float* vr = vt + t * rs + c0;
              for (int i = 0; i < kDims; ++i) o[i] = L::fma(pt, L::splat(vr[i]), o[i]);
            }
            for (int i = 0; i < kDims; ++i) L::store(ot + (c0 + i) * W, o[i]);
          }
        }
      }
    }
  }
  // back to run_item's layout: per row and query head, acc[d], running max, running sum
  for (int kvh = 0; kvh < g.kv_heads; ++kvh) {
    for (int lg = 0; lg < lane_groups; ++lg) {
      const float* qt = ws + (int64_t{kvh} * lane_groups + lg) * lg_floats;
      const float* ot = qt + int64_t{d} * W;
      const float *m = ot + int64_t{d} * W, *l = m + W;
      for (int lane = 0; lane < W && lg * W + lane < vecs; ++lane) {
        const int i = lg * W + lane;
        const int r = i / g.group, h = kvh * g.group + i % g.group;
        float* st = state + (r * hq_n + h) * sd;
        for (int c = 0; c < d; ++c) st[c] = ot[c * W + lane];
        st[d] = m[lane];
        st[d + 1] = l[lane];
      }
    }
  }
}

#if CHATPAGE_AVX512 && defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#define CHATPAGE_AMX_ATTENTION 1
// run_tile on AMX's bf16 tiles (a bf16 cache; Geometry::amx): the same lanes (a lane group's
// W = 16 query vectors of one KV head), the same online softmax along them and the same state at
// the end, with both products on the tiles, 32 keys at a time (two 16-key halves, each within
// one block):
// * scores: S^T (32 keys x 16 queries, two accumulator tiles) = K Q^T, the keys the A operand
//   read where they lie in the cache (16 rows of 32 dims, a token's stride apart), the queries
//   the B operand, packed once per item as pairs of dims (VNNI: d / 32 tiles of 16 rows);
// * values: O^T (d x 16 queries) += V^T P^T, V^T (d rows of 32 keys) transposed from the cache
//   once per chunk and KV head for every lane group, P^T the B operand (a row: keys 2i and
//   2i + 1 of the 16 queries, interleaved).
// Chunks go in groups of up to 512 / d (16 KB of keys' V^T), three passes a group and lane group:
// the scores of every chunk and their largest per lane first, so that the running max changes
// once a group; then the weights; then O^T summed over the group's chunks in the accumulator
// tiles, and ot rescaled and added once (5-8% of the kernel against a rescale after every chunk).
// The tiles multiply bf16 values and sum the exact products in fp32. bf16 queries are exact in
// one term. fp32 queries are split into three bf16 terms whose sum is the query exactly (each
// the rounding of what the terms before left: 8 + 8 + 8 bits of its 24), each a product, so the
// scores are fp32's to summation order; and the weights P into two (16 bits: a relative 2^-17
// on a key's weight). For bf16 queries (a bf16 output) P is one term, rounded to bf16 as
// FlashAttention and torch's bf16 SDPA round it: 2^-9, below the output's own rounding. The
// softmax's sums are of the unrounded weights.
//
// ws per KV head and lane group: the packed query terms (amx_query_floats), then ot, m, l, lo
// and hi as run_tile's.
constexpr int kAmxKeys = 32;  // keys per chunk: the K dimension of a tdpbf16ps
constexpr int kMaxQueryTerms = 3;

// Room for one lane group's packed query terms (16 lanes of d bf16 values per term), and for
// all of its workspace.
constexpr int64_t amx_query_floats(int d, int terms) { return int64_t{d} * 8 * terms; }
constexpr int64_t amx_lane_group_floats(int d, int terms) {
  return amx_query_floats(d, terms) + int64_t{d} * 16 + 4 * 16;
}

// Tiles: 0-3 O^T sums of 16 dims each (in QK, the query terms), 4-5 the scores of a chunk's
// halves (in PV, 5 is P's second term), 6 an A operand (keys, or V^T), 7 a B operand (P^T's
// first term). All 16 rows of 64 bytes (configure_full_tiles).

// The fp32 values of the low or high 16 bf16 values of b.
inline __m512 bf16_low(__m512i b) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(b)), 16));
}
inline __m512 bf16_high(__m512i b) {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(b, 1)), 16));
}

// V^T of the `n` keys from `v` on (`ts` elements apart; the rest of the 16 zero), d values each,
// into the columns [16 h, 16 h + 16) of vt's d rows of kAmxKeys bf16.
inline void transpose_values(const c10::BFloat16* v, int64_t ts, int n, int d, int h,
                             c10::BFloat16* vt) {
  // lanes 2t (dim 2i of key t) first, then 2t + 1 (dim 2i + 1)
  const __m512i split = _mm512_set_epi16(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3,
                                         1, 30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4,
                                         2, 0);
  for (int c0 = 0; c0 < d; c0 += 32) {
    __m512i r[16];
    for (int t = 0; t < 16; ++t)
      r[t] = t < n ? _mm512_loadu_si512(v + t * ts + c0) : _mm512_setzero_si512();
    transpose16(r);  // r[i]: dims c0 + 2i, c0 + 2i + 1 of the 16 keys, pair by pair
    for (int i = 0; i < 16; ++i) {
      const __m512i both = _mm512_permutexvar_epi16(split, r[i]);
      c10::BFloat16* row = vt + (c0 + 2 * i) * kAmxKeys + 16 * h;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(row), _mm512_castsi512_si256(both));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(row + kAmxKeys),
                          _mm512_extracti64x4_epi64(both, 1));
    }
  }
}

// A lane group's queries as the B operand: term t of dims [32 kt, 32 kt + 32) at
// qp + (t * KT + kt) * 512, row i holding dims 32 kt + 2i and 2i + 1 of the 16 lanes. src[lane]
// is a lane's query head (null: a spare lane, zeros).
template <int KT>
void pack_queries(const Geometry& g, const void* const* src, c10::BFloat16* qp) {
  for (int kt = 0; kt < KT; ++kt) {
    __m512i r[kMaxQueryTerms][16];
    for (int lane = 0; lane < 16; ++lane) {
      if (!src[lane]) {
        for (int t = 0; t < g.q_terms; ++t) r[t][lane] = _mm512_setzero_si512();
      } else if (g.query16) {
        r[0][lane] = _mm512_loadu_si512(static_cast<const c10::BFloat16*>(src[lane]) + kt * 32);
      } else {
        const float* q = static_cast<const float*>(src[lane]) + kt * 32;
        __m512 lo = _mm512_loadu_ps(q), hi = _mm512_loadu_ps(q + 16);
        for (int t = 0; t < g.q_terms; ++t) {  // what the terms before left, rounded
          const __m512i b = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
          r[t][lane] = b;
          lo = _mm512_sub_ps(lo, bf16_low(b));
          hi = _mm512_sub_ps(hi, bf16_high(b));
        }
      }
    }
    for (int t = 0; t < g.q_terms; ++t) {
      transpose16(r[t]);
      for (int i = 0; i < 16; ++i) _mm512_storeu_si512(qp + ((t * KT + kt) * 16 + i) * 32, r[t][i]);
    }
  }
}

template <int NC>
void run_tile_amx(const Geometry& g, const c10::BFloat16* k_cache, const c10::BFloat16* v_cache,
                  const WorkItem& w, float* state, float* ws) {
  using L = Lanes16;
  using V = L::V;
  constexpr int W = 16, d = W * NC, KT = d / 32;
  static_assert(NC % 2 == 0, "head_dim must be a multiple of 32");
  const int hq_n = g.q_heads, sd = g.state_stride;
  const int vecs = w.rows * g.group, lane_groups = (vecs + W - 1) / W;
  const int64_t q_floats = amx_query_floats(d, g.q_terms);
  const int64_t lg_floats = amx_lane_group_floats(d, g.q_terms);
  for (int kvh = 0; kvh < g.kv_heads; ++kvh) {
    for (int lg = 0; lg < lane_groups; ++lg) {
      float* lgw = ws + (int64_t{kvh} * lane_groups + lg) * lg_floats;
      float* ot = lgw + q_floats;
      float *m = ot + int64_t{d} * W, *l = m + W, *lo = l + W, *hi = lo + W;
      const void* src[W];
      for (int lane = 0; lane < W; ++lane) {
        const auto [r, h] = start_lane(g, w, kvh, lg * W + lane, lane, m, l, lo, hi);
        const int64_t at = (w.first_row + r) * g.q_row_stride + h * g.q_head_stride;
        src[lane] = r < 0      ? nullptr
                    : g.query16 ? static_cast<const void*>(g.query16 + at)
                                : g.query + at;
      }
      pack_queries<KT>(g, src, reinterpret_cast<c10::BFloat16*>(lgw));
      std::fill(ot, ot + int64_t{d} * W, 0.0f);
    }
  }
  // P's pairs of keys interleaved lane by lane: lanes 0-15 of one key, then of the next
  const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25,
                                              9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2,
                                              17, 1, 16, 0);
  // the chunks of a group of keys: their V^T, scores and weights, kept for its three passes
  constexpr int G = std::max(1, 512 / d);
  alignas(64) c10::BFloat16 vt[G][d * kAmxKeys];
  alignas(64) float s[G][kAmxKeys * W];
  alignas(64) c10::BFloat16 pt[G][2][kAmxKeys * W];
  alignas(64) float sums[4][W * W];
  const int bs = g.block_size;
  const int64_t ts = g.token_stride, hs = g.head_stride;
  const int64_t last_pos = w.first_pos + w.rows - 1;
  const int64_t end = std::min<int64_t>(last_pos + 1, w.blk_end * bs);
  const V scale = L::splat(g.scale);
  for (int64_t g0 = w.blk_begin * bs; g0 < end; g0 += G * kAmxKeys) {
    const int chunks = static_cast<int>(std::min<int64_t>(G, (end - g0 + kAmxKeys - 1) / kAmxKeys));
    // per chunk: its keys, each half's first key in the cache (its block's, at its offset) and
    // its keys
    int count[G], n[G][2];
    int64_t at[G][2];
    for (int c = 0; c < chunks; ++c) {
      const int64_t c0 = g0 + int64_t{c} * kAmxKeys;
      count[c] = static_cast<int>(std::min<int64_t>(kAmxKeys, end - c0));
      n[c][0] = std::min(count[c], 16);
      n[c][1] = std::max(count[c] - 16, 0);
      for (int h = 0; h < 2; ++h) {
        const int64_t pos = c0 + 16 * h;
        at[c][h] = n[c][h] > 0 ? w.table[pos / bs] * g.block_stride + pos % bs * ts : 0;
      }
    }
    for (int kvh = 0; kvh < g.kv_heads; ++kvh) {
      bool packed[G] = {};
      for (int lg = 0; lg < lane_groups; ++lg) {
        float* lgw = ws + (int64_t{kvh} * lane_groups + lg) * lg_floats;
        const auto* qp = reinterpret_cast<const c10::BFloat16*>(lgw);
        float* ot = lgw + q_floats;
        float *m = ot + int64_t{d} * W, *l = m + W, *lo = l + W, *hi = lo + W;
        const float first_seen = *std::min_element(lo, lo + W);
        const float last_seen = *std::max_element(hi, hi + W);
        const float all_from = *std::max_element(lo, lo + W);
        const float all_to = *std::min_element(hi, hi + W);
        const V lov = L::load(lo), hiv = L::load(hi);
        // the chunks some lane sees
        bool seen[G];
        int any = 0;
        for (int c = 0; c < chunks; ++c) {
          const float kp0 = static_cast<float>(g0 + int64_t{c} * kAmxKeys);
          const float kp1 = kp0 + static_cast<float>(count[c] - 1);
          seen[c] = !(kp1 < first_seen || kp0 > last_seen);
          any += seen[c];
        }
        if (!any) continue;
        // 1: the scores, scaled and masked, and their largest per lane
        V bmax = L::splat(kNegInf);
        for (int c = 0; c < chunks; ++c) {
          if (!seen[c]) continue;
          _tile_zero(4);
          _tile_zero(5);
          for (int kt = 0; kt < KT; ++kt) {
            // (tile numbers are immediates: the terms spelled out)
            _tile_loadd(0, qp + kt * 512, 64);
            if (g.q_terms > 1) {
              _tile_loadd(1, qp + (KT + kt) * 512, 64);
              _tile_loadd(2, qp + (2 * KT + kt) * 512, 64);
            }
            _tile_loadd(6, k_cache + at[c][0] + kvh * hs + kt * 32, ts * 2);
            _tile_dpbf16ps(4, 6, 0);
            if (g.q_terms > 1) {
              _tile_dpbf16ps(4, 6, 1);
              _tile_dpbf16ps(4, 6, 2);
            }
            if (n[c][1] > 0) {
              _tile_loadd(6, k_cache + at[c][1] + kvh * hs + kt * 32, ts * 2);
              _tile_dpbf16ps(5, 6, 0);
              if (g.q_terms > 1) {
                _tile_dpbf16ps(5, 6, 1);
                _tile_dpbf16ps(5, 6, 2);
              }
            }
          }
          float* sc = s[c];
          _tile_stored(4, sc, 64);
          _tile_stored(5, sc + 16 * W, 64);
          const float kp0 = static_cast<float>(g0 + int64_t{c} * kAmxKeys);
          const float kp1 = kp0 + static_cast<float>(count[c] - 1);
          const bool masked = count[c] < kAmxKeys || kp0 < all_from || kp1 > all_to;
          for (int t = 0; t < kAmxKeys; ++t) {
            V a = L::mul(L::load(sc + t * W), scale);
            if (masked)
              a = t < count[c] ? L::keep_between(a, lov, hiv, kp0 + t, kNegInf)
                               : L::splat(kNegInf);
            L::store(sc + t * W, a);
            bmax = L::max(bmax, a);
          }
        }
        const V m_old = L::load(m);
        const V m_new = L::max(m_old, bmax);
        // the max subtracted: a lane that has seen no key yet has -inf, which would give NaN
        const V m_sub = L::max(m_new, L::splat(-std::numeric_limits<float>::max()));
        const V alpha = L::exp(L::sub(m_old, m_sub));
        // 2: the weights, as P^T's terms
        V sum = L::zero();
        for (int c = 0; c < chunks; ++c) {
          if (!seen[c]) continue;
          if (!packed[c]) {  // V^T of the chunk, for every lane group of the KV head
            for (int h = 0; h < 2; ++h) {
              if (n[c][h] > 0) {
                transpose_values(v_cache + at[c][h] + kvh * hs, ts, n[c][h], d, h, vt[c]);
              } else {
                for (int r = 0; r < d; ++r)
                  std::memset(vt[c] + r * kAmxKeys + 16 * h, 0, 16 * sizeof(c10::BFloat16));
              }
            }
            packed[c] = true;
          }
          for (int i = 0; i < kAmxKeys / 2; ++i) {
            const V p0 = L::exp(L::sub(L::load(s[c] + 2 * i * W), m_sub));
            const V p1 = L::exp(L::sub(L::load(s[c] + (2 * i + 1) * W), m_sub));
            sum = L::add(sum, L::add(p0, p1));
            const __m512i first = (__m512i)_mm512_cvtne2ps_pbh(p1, p0);
            _mm512_store_si512(pt[c][0] + i * 32, _mm512_permutexvar_epi16(interleave, first));
            if (g.p_terms > 1) {
              const __m512i second = (__m512i)_mm512_cvtne2ps_pbh(
                  _mm512_sub_ps(p1, bf16_high(first)), _mm512_sub_ps(p0, bf16_low(first)));
              _mm512_store_si512(pt[c][1] + i * 32, _mm512_permutexvar_epi16(interleave, second));
            }
          }
        }
        L::store(m, m_new);
        L::store(l, L::fma(L::load(l), alpha, sum));
        // 3: O^T += V^T P^T over the group's chunks in the accumulator tiles, four dims tiles
        // at a time, then ot rescaled and added once
        for (int dt0 = 0; dt0 < NC; dt0 += 4) {
          const int tiles = std::min(4, NC - dt0);
          _tile_zero(0);
          _tile_zero(1);
          _tile_zero(2);
          _tile_zero(3);
          for (int c = 0; c < chunks; ++c) {
            if (!seen[c]) continue;
            _tile_loadd(7, pt[c][0], 64);
            if (g.p_terms > 1) _tile_loadd(5, pt[c][1], 64);
            // (tile numbers are immediates: the four dims tiles spelled out)
#define CHATPAGE_PV_TILE(j)                                  \
  if (tiles > j) {                                           \
    _tile_loadd(6, vt[c] + (dt0 + j) * 16 * kAmxKeys, 64);   \
    _tile_dpbf16ps(j, 6, 7);                                 \
    if (g.p_terms > 1) _tile_dpbf16ps(j, 6, 5);              \
  }
            CHATPAGE_PV_TILE(0)
            CHATPAGE_PV_TILE(1)
            CHATPAGE_PV_TILE(2)
            CHATPAGE_PV_TILE(3)
#undef CHATPAGE_PV_TILE
          }
          _tile_stored(0, sums[0], 64);
          _tile_stored(1, sums[1], 64);
          _tile_stored(2, sums[2], 64);
          _tile_stored(3, sums[3], 64);
          for (int j = 0; j < tiles; ++j)
            for (int r = 0; r < 16; ++r) {
              float* o = ot + ((dt0 + j) * 16 + r) * W;
              L::store(o, L::fma(L::load(o), alpha, L::load(sums[j] + r * W)));
            }
        }
      }
    }
  }
  // back to run_item's layout: per row and query head, acc[d], running max, running sum (ot's
  // 16 x 16 squares transposed)
  for (int kvh = 0; kvh < g.kv_heads; ++kvh) {
    for (int lg = 0; lg < lane_groups; ++lg) {
      const float* ot = ws + (int64_t{kvh} * lane_groups + lg) * lg_floats + q_floats;
      const float *m = ot + int64_t{d} * W, *l = m + W;
      float* st[W];
      for (int lane = 0; lane < W; ++lane) {
        const int i = lg * W + lane;
        const int r = i / g.group, h = kvh * g.group + i % g.group;
        st[lane] = i < vecs ? state + (r * hq_n + h) * sd : nullptr;
        if (!st[lane]) continue;
        st[lane][d] = m[lane];
        st[lane][d + 1] = l[lane];
      }
      for (int dt = 0; dt < NC; ++dt) {
        __m512i r[W];
        for (int c = 0; c < W; ++c) r[c] = _mm512_loadu_si512(ot + (dt * 16 + c) * W);
        transpose16(r);
        for (int lane = 0; lane < W; ++lane)
          if (st[lane]) _mm512_storeu_si512(st[lane] + dt * 16, r[lane]);
      }
    }
  }
}
#endif

// A tile of rows (prefill): on AMX where the call allows it (Geometry::amx) and the shapes take
// it, else run_tile.
template <typename L, typename KV, int NC>
void tile_item(const Geometry& g, const KV* k_cache, const KV* v_cache, const WorkItem& w,
               float* state, float* ws, float* kbuf, float* vbuf) {
#if CHATPAGE_AMX_ATTENTION
  if constexpr (std::is_same_v<L, Lanes16> && std::is_same_v<KV, c10::BFloat16> && NC > 0 &&
                NC % 2 == 0) {
    if (g.amx) return run_tile_amx<NC>(g, k_cache, v_cache, w, state, ws);
  }
#endif
  run_tile<L, KV, NC>(g, k_cache, v_cache, w, state, ws, kbuf, vbuf);
}

void finalize(const Geometry& g, int64_t first_row, int rows, const float* state) {
  const int d = g.head_dim;
  for (int r = 0; r < rows; ++r) {
    for (int h = 0; h < g.q_heads; ++h) {
      const float* st = state + (r * g.q_heads + h) * g.state_stride;
      const float l = st[d + 1];
      store_out(g, first_row + r, h, st, l > 0.0f ? 1.0f / l : 0.0f);
    }
  }
}

void merge(const Geometry& g, const MergeGroup& mg, const float* partials) {
  const int d = g.head_dim;
  const int64_t piece_stride = static_cast<int64_t>(mg.rows) * g.q_heads * g.state_stride;
  std::vector<float> weight(mg.pieces), sums(d);
  for (int r = 0; r < mg.rows; ++r) {
    for (int h = 0; h < g.q_heads; ++h) {
      const float* first = partials + mg.state + (r * g.q_heads + h) * g.state_stride;
      float m = kNegInf;
      for (int p = 0; p < mg.pieces; ++p) m = std::max(m, first[p * piece_stride + d]);
      float l = 0.0f;
      for (int p = 0; p < mg.pieces; ++p) {
        const float* st = first + p * piece_stride;
        weight[p] = st[d] == kNegInf ? 0.0f : std::exp(st[d] - m);
        l += st[d + 1] * weight[p];
      }
      for (int i = 0; i < d; ++i) {
        float acc = 0.0f;
        for (int p = 0; p < mg.pieces; ++p) acc += first[p * piece_stride + i] * weight[p];
        sums[i] = acc;
      }
      store_out(g, mg.first_row + r, h, sums.data(), l > 0.0f ? 1.0f / l : 0.0f);
    }
  }
}

struct Plan {
  std::vector<WorkItem> items;
  std::vector<MergeGroup> merges;
  int64_t partial_floats = 0;
  int max_rows = 1;
};

// The keys row `pos` attends to (its window, or every earlier one).
inline int64_t visible_keys(const Geometry& g, int64_t pos) {
  return g.window > 0 ? std::min<int64_t>(pos + 1, g.window) : pos + 1;
}

// The first block a query at `pos` reads.
inline int64_t first_block(const Geometry& g, int64_t pos) {
  return (pos + 1 - visible_keys(g, pos)) / g.block_size;
}

// The pieces the context of a row at `pos` run row by row is cut into: by its own length alone.
inline int64_t row_pieces(const Geometry& g, int64_t pos, int threads) {
  const int64_t nblk = pos / g.block_size + 1 - first_block(g, pos);
  const int64_t pieces = (visible_keys(g, pos) + kRowPieceKeys - 1) / kRowPieceKeys;
  return threads > 1 ? std::min<int64_t>(nblk, pieces) : 1;
}

// Cuts the batch into row tiles, and tiles into context pieces when that helps the threads.
Plan make_plan(const Geometry& g, const AttentionShape& shape, const int32_t* tables,
               const std::vector<int64_t>& lens, const std::vector<int64_t>& starts, int threads) {
  Plan plan;
  const int tile = std::clamp(16384 / static_cast<int>(g.q_heads * g.head_dim), 1, kMaxTileRows);
  std::vector<WorkItem> tiles;
  int64_t total = 0;
  for (int64_t s = 0; s < shape.num_seqs; ++s) {
    const int64_t q_len = starts[s + 1] - starts[s], len = lens[s];
    const bool by_row = q_len <= kRowByRow;
    for (int64_t r0 = 0; r0 < q_len;) {
      WorkItem w;
      w.alone = by_row;
      w.first_row = starts[s] + r0;
      w.first_pos = len - q_len + r0;
      w.table = tables + s * shape.max_blocks;
      w.blk_begin = first_block(g, w.first_pos);
      w.pieces = by_row ? row_pieces(g, w.first_pos, threads) : 0;
      int64_t rows = by_row ? 1 : std::min<int64_t>(tile, q_len - r0);
      // the next rows run row by row join while they are cut into the same pieces: one piece
      // (a block a row does not see is skipped for it), or the same blocks
      for (; by_row && r0 + rows < q_len; ++rows) {
        const int64_t pos = w.first_pos + rows;
        const bool same_blocks = first_block(g, pos) == w.blk_begin &&
                                 pos / g.block_size == w.first_pos / g.block_size;
        if (row_pieces(g, pos, threads) != w.pieces || (w.pieces > 1 && !same_blocks)) break;
      }
      w.rows = static_cast<int>(rows);
      r0 += rows;
      w.blk_end = (w.first_pos + w.rows - 1) / g.block_size + 1;
      w.state = -1;
      w.cost = 0;
      for (int r = 0; r < w.rows; ++r) w.cost += visible_keys(g, w.first_pos + r);
      total += w.cost;
      tiles.push_back(w);
    }
  }
  const int64_t target = std::max<int64_t>(kMinPieceCost, total / (4 * std::max(threads, 1)));
  for (const WorkItem& w : tiles) {
    plan.max_rows = std::max(plan.max_rows, w.rows);
    const int64_t nblk = w.blk_end - w.blk_begin;
    const int64_t pieces = w.alone              ? w.pieces
                           : threads > 1 ? std::min<int64_t>(nblk, (w.cost + target - 1) / target)
                                         : 1;
    if (pieces <= 1) {
      plan.items.push_back(w);
      continue;
    }
    const int64_t piece_floats = static_cast<int64_t>(w.rows) * g.q_heads * g.state_stride;
    plan.merges.push_back({w.first_row, w.rows, plan.partial_floats, static_cast<int>(pieces)});
    for (int64_t p = 0; p < pieces; ++p) {
      WorkItem piece = w;
      piece.blk_begin = w.blk_begin + nblk * p / pieces;
      piece.blk_end = w.blk_begin + nblk * (p + 1) / pieces;
      piece.cost = w.cost * (piece.blk_end - piece.blk_begin) / nblk;
      piece.state = plan.partial_floats;
      plan.partial_floats += piece_floats;
      plan.items.push_back(piece);
    }
  }
  std::stable_sort(plan.items.begin(), plan.items.end(),
                   [](const WorkItem& a, const WorkItem& b) { return a.cost > b.cost; });
  return plan;
}

template <typename L, typename KV, int NC>
void run_plan(const Geometry& g, const Plan& plan, const at::Tensor& k_cache,
              const at::Tensor& v_cache, float* partials, int threads) {
  const KV* kc = k_cache.data_ptr<KV>();
  const KV* vc = v_cache.data_ptr<KV>();
  const int64_t n_items = static_cast<int64_t>(plan.items.size());
  std::atomic<int64_t> next{0};
  auto worker = [&](int64_t, int64_t) {
    const int64_t states = static_cast<int64_t>(plan.max_rows) * g.q_heads;
    const int64_t block = std::is_same_v<KV, float> ? 0 : int64_t{g.block_size} * g.head_dim;
    std::vector<float> local(states * g.state_stride), qbuf(states * g.head_dim);
    // the queries as int16 and their scales, where an int8 cache's keys are scored in integers
    const bool int_keys = int_scores<L, KV>(g.head_dim);
    std::vector<int16_t> q16(int_keys ? states * g.head_dim : 0);
    std::vector<float> qscale(int_keys ? states : 0);
    std::vector<float> kbuf(block), vbuf(block);
    // run_tile's (run_tile_amx's) queries and outputs per KV head and lane group (see there)
    constexpr int W = L::kWidth;
    const int64_t lane_groups = (int64_t{plan.max_rows} * g.group + W - 1) / W;
    int64_t lg_floats = 2 * g.head_dim * W + 4 * W;
#if CHATPAGE_AMX_ATTENTION
    if (g.amx) lg_floats = std::max(lg_floats, amx_lane_group_floats(g.head_dim, g.q_terms));
#endif
    std::vector<float> tile_ws(plan.max_rows * g.group >= W ? g.kv_heads * lane_groups * lg_floats
                                                           : 0);
#if CHATPAGE_AMX_ATTENTION
    if (g.amx) configure_full_tiles();
#endif
    for (int64_t i = next.fetch_add(1); i < n_items; i = next.fetch_add(1)) {
      const WorkItem& w = plan.items[i];
      float* st = w.state >= 0 ? partials + w.state : local.data();
      if (!w.alone && w.rows * g.group >= W) {
        tile_item<L, KV, NC>(g, kc, vc, w, st, tile_ws.data(), kbuf.data(), vbuf.data());
      } else {
        run_item<L, KV, NC>(g, kc, vc, w, st, qbuf.data(), q16.data(), qscale.data(),
                             kbuf.data());
      }
      if (w.state < 0) finalize(g, w.first_row, w.rows, st);
    }
#if CHATPAGE_AMX_ATTENTION
    if (g.amx) _tile_release();
#endif
  };
  if (threads <= 1 || n_items <= 1) {
    worker(0, 1);
  } else {
    at::parallel_for(0, std::min<int64_t>(threads, n_items), 1, worker);
  }
  if (!plan.merges.empty()) {
    at::parallel_for(0, static_cast<int64_t>(plan.merges.size()), 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) merge(g, plan.merges[i], partials);
    });
  }
}

template <typename KV>
void run_dtype(const Geometry& g, const Plan& plan, const at::Tensor& k_cache,
               const at::Tensor& v_cache, float* partials, int threads) {
#if CHATPAGE_AVX512
  if (g.head_dim % 16 == 0 && g.block_size % 16 == 0) {
    switch (g.head_dim) {
      case 64: return run_plan<Lanes16, KV, 4>(g, plan, k_cache, v_cache, partials, threads);
      case 96: return run_plan<Lanes16, KV, 6>(g, plan, k_cache, v_cache, partials, threads);
      case 128: return run_plan<Lanes16, KV, 8>(g, plan, k_cache, v_cache, partials, threads);
      case 256: return run_plan<Lanes16, KV, 16>(g, plan, k_cache, v_cache, partials, threads);
      default: return run_plan<Lanes16, KV, 0>(g, plan, k_cache, v_cache, partials, threads);
    }
  }
#endif
  switch (g.head_dim) {
    case 64: return run_plan<Lanes8, KV, 8>(g, plan, k_cache, v_cache, partials, threads);
    case 80: return run_plan<Lanes8, KV, 10>(g, plan, k_cache, v_cache, partials, threads);
    case 96: return run_plan<Lanes8, KV, 12>(g, plan, k_cache, v_cache, partials, threads);
    case 128: return run_plan<Lanes8, KV, 16>(g, plan, k_cache, v_cache, partials, threads);
    case 256: return run_plan<Lanes8, KV, 32>(g, plan, k_cache, v_cache, partials, threads);
    default: return run_plan<Lanes8, KV, 0>(g, plan, k_cache, v_cache, partials, threads);
  }
}

std::vector<int64_t> to_host_vector(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  if (c.scalar_type() == at::kInt) {
    const int32_t* p = c.data_ptr<int32_t>();
    return std::vector<int64_t>(p, p + c.numel());
  }
  const int64_t* p = c.data_ptr<int64_t>();
  return std::vector<int64_t>(p, p + c.numel());
}

}  // namespace

void paged_attention(const at::Tensor& out, const at::Tensor& query, const at::Tensor& k_cache,
                     const at::Tensor& v_cache, const at::Tensor& block_tables,
                     const at::Tensor& seq_lens, const at::Tensor& query_start_loc,
                     double scale, int64_t window) {
  const AttentionShape shape =
      check_attention_args(out, query, k_cache, v_cache, block_tables, seq_lens, query_start_loc);
  TORCH_CHECK(shape.head_dim % 8 == 0, "chatpage: head_dim must be a multiple of 8 on the CPU");
  TORCH_CHECK(shape.block_size <= kMaxBlockSize, "chatpage: block_size above ", kMaxBlockSize);
  const at::Tensor tables = block_tables.to(at::kInt).contiguous();
  const std::vector<int64_t> lens = to_host_vector(seq_lens);
  const std::vector<int64_t> starts = to_host_vector(query_start_loc);
  const int32_t* tab = tables.data_ptr<int32_t>();
  TORCH_CHECK(window >= 0, "chatpage: window must be 0 (none) or positive, got ", window);
  check_attention_indices(shape, block_tables, seq_lens, query_start_loc, window);

  // fp32 and bf16 queries and outputs are read and written where they lie (a head's values
  // contiguous), others through an fp32 copy
  const bool q_bf16 = query.scalar_type() == at::kBFloat16;
  at::Tensor q = q_bf16 || query.scalar_type() == at::kFloat ? query : query.to(at::kFloat);
  if (q.stride(2) != 1) q = q.contiguous();
  const bool direct =
      (out.scalar_type() == at::kFloat || out.scalar_type() == at::kBFloat16) && out.stride(2) == 1;
  at::Tensor out_f = direct ? out : out.to(at::kFloat).contiguous();

  Geometry g;
  g.block_size = static_cast<int>(shape.block_size);
  g.kv_heads = static_cast<int>(shape.num_kv_heads);
  g.q_heads = static_cast<int>(shape.num_q_heads);
  g.group = g.q_heads / g.kv_heads;
  g.head_dim = static_cast<int>(shape.head_dim);
  g.state_stride = g.head_dim + 16;  // keeps each state 64-byte aligned
  g.head_stride = k_cache.size(3);
  g.token_stride = shape.num_kv_heads * g.head_stride;
  g.block_stride = shape.block_size * g.token_stride;
  g.query = q_bf16 ? nullptr : q.data_ptr<float>();
  g.query16 = q_bf16 ? q.data_ptr<c10::BFloat16>() : nullptr;
  g.q_row_stride = q.stride(0);
  g.q_head_stride = q.stride(1);
  g.scale = static_cast<float>(scale);
  g.window = window;
  const bool out_bf16 = out_f.scalar_type() == at::kBFloat16;
  g.out = out_bf16 ? nullptr : out_f.data_ptr<float>();
  g.out16 = out_bf16 ? out_f.data_ptr<c10::BFloat16>() : nullptr;
  g.o_row_stride = out_f.stride(0);
  g.o_head_stride = out_f.stride(1);
  // AMX's tiles for prefill tiles over a bf16 cache, in 16-key halves of blocks, for bf16 and
  // fp32 queries (fp16 ones are widened to fp32 first)
  g.amx = k_cache.scalar_type() == at::kBFloat16 && g.block_size % 16 == 0 &&
          g.head_dim % 32 == 0 && gemm_amx();
  g.q_terms = q_bf16 ? 1 : 3;
  g.p_terms = q_bf16 ? 1 : 2;

  const int threads = at::get_num_threads();
  const Plan plan = make_plan(g, shape, tab, lens, starts, threads);
  at::Tensor partials;
  float* part = nullptr;
  if (plan.partial_floats > 0) {
    partials = at::empty({plan.partial_floats}, q.options().dtype(at::kFloat));
    part = partials.data_ptr<float>();
  }
  switch (k_cache.scalar_type()) {
    case at::kFloat: run_dtype<float>(g, plan, k_cache, v_cache, part, threads); break;
    case at::kBFloat16: run_dtype<c10::BFloat16>(g, plan, k_cache, v_cache, part, threads); break;
    case at::kHalf: run_dtype<c10::Half>(g, plan, k_cache, v_cache, part, threads); break;
    case at::kChar: run_dtype<int8_t>(g, plan, k_cache, v_cache, part, threads); break;
    default: TORCH_CHECK(false, "chatpage: unsupported cache dtype ", k_cache.scalar_type());
  }
  if (!direct) out.copy_(out_f);
}

}  // namespace chatpage::cpu
