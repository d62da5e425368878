// Matmuls of a few activation rows against fp32, bf16, int8 and int4 weights:
// y [M, N] = x [M, K] @ W.T.
//
// At batch-1 decode a matmul reads every weight once for a handful of multiply-adds, so it runs at
// the memory's read rate or slower; torch's quantized CPU kernels and MKL's few-row fp32 paths
// fall well short of it (chatpage/engine/model/weights.py has the numbers). Here a dense matmul of one
// activation row reads the weights row after row, one sequential stream; otherwise each task
// streams four (int4: eight) weight rows at a time, decodes a chunk of them once into registers
// and reuses it for up to four (int4: two) activation rows, with the activations in L1. More
// activation rows are handled in tiles against the same weight rows, which are by then in L1
// too. Rows are split among threads with at::parallel_for.
//
// The int4 layout (packed by chatpage/engine/model/gemv.py, whose reference_* functions are the
// specification): q [N, K/2] uint8 where byte j of a group of 32 inputs holds input j in its low
// nibble and input j + 16 in its high nibble, w = (q - 8) * scale + zero with scales and zeros
// [N, K/32] bf16, or w = levels[q] * scale + zero for a matrix with a table of 16 int8 levels of
// its own (a GGUF's IQ4_NL). With AVX-512 BF16 two groups are decoded at once: their 32 bytes
// widen to 32 words, each nibble q becomes the bf16 value 128 + q (0x4300 | q, exact), or that of
// levels[q] (vpermw on a table of 32 words; |level| <= 128 is exact in bf16), and vdpbf16ps
// multiplies them with the activations rounded to bf16 (exact products, fp32 sums); the zero
// point, less the 136 the uniform decoding adds, comes back as sum_g (zero_g - 136 scale_g) *
// sum(x in g) (with a table: zero_g * sum(x in g)), from group sums taken once per call. int8,
// bf16 and fp32 weights are widened to fp32 and multiplied with fp32 activations. Without
// AVX-512 the same layouts run in vec.h's eight lanes (AVX2 + FMA, or portable loops) in smaller
// tiles (16 registers): int4 nibbles widen to fp32 levels q (with a table: levels[q], one pshufb
// per 8 bytes), multiplied with the activations rounded to bf16 and held in fp32; each group's
// sum is scaled into the accumulator, and the zero points come back as (zero - 8 scale) *
// sum(x in g) (with a table: zero * sum(x in g)).
#include "checks.h"
#include "cpu/matmul.h"
#include "cpu/ops_cpu.h"
#include "cpu/vec.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstring>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512BF16__)
#include <immintrin.h>
#define CHATPAGE_GEMV_AVX512 1
#else
#define CHATPAGE_GEMV_AVX512 0
#endif

namespace chatpage::cpu {
namespace {

constexpr int kGroup = 32;           // int4 inputs per scale/zero pair
constexpr int64_t kTaskBytes = 1 << 15;  // weight bytes below which a task is not split further
#if CHATPAGE_GEMV_AVX512
// tiles that keep their accumulators, activations and a decoded weight chunk in AVX-512's 32
// registers
constexpr int kRows = 4;             // weight rows streamed together: fp32, bf16, int8 weights
                                     // against more than one activation row
constexpr int kInt4Rows = 8;         // weight rows streamed together, int4 weights
constexpr int kDenseTile = 4;        // activation rows per pass, fp32, bf16 and int8 weights
constexpr int kInt4Tile = 2;         // activation rows per pass, int4 weights
using Int4Input = uint16_t;          // the int4 kernel's activations: bf16 bits
#else
// the same in AVX2's 16: 4 activation rows by 2 weight rows (8 accumulators; dense: 4
// activation vectors and a weight one; int4: a group's four vectors of levels), so that up to
// four rows share one widening of the weights, which costs more than their FMAs here
constexpr int kRows = 2;
constexpr int kInt4Rows = 2;
constexpr int kDenseTile = 4;
constexpr int kInt4Tile = 4;
using Int4Input = float;             // fp32, rounded to bf16 first
#endif

// The int4 kernel's activations, prepared once per call, and the fp32 sums of each group [M, G].
// With AVX-512: bf16 in the pair order the kernel reads (per pair of groups: inputs 0-15 of both
// groups, then 16-31 of both; an odd last group is padded with zeros). Otherwise: [M, K] fp32,
// each rounded to bf16 as the reference does.
struct Activations {
  at::Tensor values;
  at::Tensor group_sums;
};

// Calls fn(row_begin, row_end) over the N output rows, split into tasks of whole blocks of Rows
// rows and at least kTaskBytes.
template <int Rows, typename Fn>
void over_rows(int64_t n, int64_t row_bytes, Fn&& fn) {
  const int64_t blocks = (n + Rows - 1) / Rows;
  const int64_t grain = std::max<int64_t>(1, kTaskBytes / std::max<int64_t>(1, row_bytes * Rows));
  at::parallel_for(0, blocks, grain, [&](int64_t b, int64_t e) {
    fn(b * Rows, std::min(n, e * Rows));
  });
}

// Calls kernel.template operator()<T, R>(m0, n0) for every block of R weight rows in
// [n_begin, n_end) (R = Rows, then 1 for the leftovers) and every tile of up to `Tile` activation
// rows, the tiles of one block one after another (its weights are in L1 by the second).
template <int Tile, int Rows, typename Kernel>
void over_tiles(int64_t m, int64_t n_begin, int64_t n_end, Kernel&& kernel) {
  auto tiles = [&]<int R>(int64_t n0) {
    int64_t m0 = 0;
    for (; m0 + Tile <= m; m0 += Tile) kernel.template operator()<Tile, R>(m0, n0);
    if constexpr (Tile > 3)
      if (m - m0 == 3) kernel.template operator()<3, R>(m0, n0);
    if constexpr (Tile > 2)
      if (m - m0 == 2) kernel.template operator()<2, R>(m0, n0);
    if (m - m0 == 1) kernel.template operator()<1, R>(m0, n0);
  };
  int64_t n0 = n_begin;
  for (; n0 + Rows <= n_end; n0 += Rows) tiles.template operator()<Rows>(n0);
  for (; n0 < n_end; ++n0) tiles.template operator()<1>(n0);
}

// ---- dense weights: fp32 [N, K], or int8 [N, K] with one scale per row ------------------------

#if CHATPAGE_GEMV_AVX512

// While a block of rows streams in, each step also prefetches as many bytes as it reads, from
// this far ahead: the block after it, or further for small blocks (the memory's latency is
// longer than a small block's work).
constexpr int64_t kPrefetchAhead = 4096;

inline const char* prefetch_start(const void* block, int64_t block_bytes) {
  return static_cast<const char*>(block) + std::max(block_bytes, kPrefetchAhead);
}

template <bool Full>
inline __m512 load_weights16(const float* p, __mmask16 mask) {
  return Full ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(mask, p);
}
template <bool Full>
inline __m512 load_weights16(const int8_t* p, __mmask16 mask) {
  const __m128i raw = Full ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(p))
                           : _mm_maskz_loadu_epi8(mask, p);
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(raw));
}
// 16 (or fewer, per `mask`) stored bf16 values, widened to fp32 (exact: a 16-bit shift)
template <bool Full>
inline __m512 load_bf16x16(const uint16_t* p, __mmask16 mask) {
  const __m256i raw = Full ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                           : _mm256_maskz_loadu_epi16(mask, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
template <bool Full>
inline __m512 load_weights16(const c10::BFloat16* p, __mmask16 mask) {
  return load_bf16x16<Full>(reinterpret_cast<const uint16_t*>(p), mask);
}

// acc[t][r] += w[n0 + r, i..i+16) * x[m0 + t, i..i+16), lanes past `mask` zero
template <int T, int R, bool Full, typename W>
inline void dense_step(const W* w, const float* x, int64_t k, int64_t i, __mmask16 mask,
                       __m512 (&acc)[T][R]) {
  __m512 xv[T];
  for (int t = 0; t < T; ++t)
    xv[t] = Full ? _mm512_loadu_ps(x + t * k + i) : _mm512_maskz_loadu_ps(mask, x + t * k + i);
  for (int r = 0; r < R; ++r) {
    const __m512 wv = load_weights16<Full>(w + r * k + i, mask);
    for (int t = 0; t < T; ++t) acc[t][r] = _mm512_fmadd_ps(wv, xv[t], acc[t][r]);
  }
}

// out[t][r] = sum over k of w[n0 + r, k] * x[m0 + t, k]. With fewer than four (t, r) pairs the
// sums alternate between two sets of accumulators, so two FMA chains are in flight.
template <int T, int R, typename W>
void dense_dots(const W* w, const float* x, int64_t k, int64_t m0, int64_t n0, float (*out)[R]) {
  constexpr int C = T * R >= 4 ? 1 : 2;
  __m512 acc[C][T][R];
  for (int c = 0; c < C; ++c)
    for (int t = 0; t < T; ++t)
      for (int r = 0; r < R; ++r) acc[c][t][r] = _mm512_setzero_ps();
  const W* wr = w + n0 * k;
  const float* xr = x + m0 * k;
  const char* next = prefetch_start(wr, R * k * sizeof(W));
  constexpr int64_t kStepBytes = R * 16 * sizeof(W);
  int64_t i = 0;
  for (; i + 16 * C <= k; i += 16 * C)
    for (int c = 0; c < C; ++c) {
      for (int64_t b = 0; b < kStepBytes; b += 64)
        _mm_prefetch(next + (i / 16 + c) * kStepBytes + b, _MM_HINT_T0);
      dense_step<T, R, true>(wr, xr, k, i + 16 * c, 0xFFFF, acc[c]);
    }
  if (i + 16 <= k) {  // C == 2 and one full step left
    dense_step<T, R, true>(wr, xr, k, i, 0xFFFF, acc[0]);
    i += 16;
  }
  if (i < k) dense_step<T, R, false>(wr, xr, k, i, __mmask16((1u << (k - i)) - 1), acc[0]);
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r) {
      __m512 sum = acc[0][t][r];
      for (int c = 1; c < C; ++c) sum = _mm512_add_ps(sum, acc[c][t][r]);
      out[t][r] = _mm512_reduce_add_ps(sum);
    }
}

#else

// acc[t][r] += w[n0 + r, i..i+8) * x[m0 + t, i..i+8)
template <int T, int R, typename W>
inline void dense_step(const W* w, const float* x, int64_t k, int64_t i, Vec8 (&acc)[T][R]) {
  Vec8 xv[T];
  for (int t = 0; t < T; ++t) xv[t] = load8(x + t * k + i);
  for (int r = 0; r < R; ++r) {
    const Vec8 wv = load8(w + r * k + i);
    for (int t = 0; t < T; ++t) acc[t][r] = fma8(wv, xv[t], acc[t][r]);
  }
}

// out[t][r] = sum over k of w[n0 + r, k] * x[m0 + t, k], in vec.h's eight lanes (AVX2 + FMA, or
// portable loops). With fewer than four (t, r) pairs the sums take turns in C sets of
// accumulators, so that four FMA chains are in flight; the last k % 8 inputs are summed one by
// one.
template <int T, int R, typename W>
void dense_dots(const W* w, const float* x, int64_t k, int64_t m0, int64_t n0, float (*out)[R]) {
  constexpr int C = T * R >= 4 ? 1 : 4 / (T * R);
  Vec8 acc[C][T][R];
  for (int c = 0; c < C; ++c)
    for (int t = 0; t < T; ++t)
      for (int r = 0; r < R; ++r) acc[c][t][r] = zero8();
  const W* wr = w + n0 * k;
  const float* xr = x + m0 * k;
  int64_t i = 0;
  for (; i + 8 * C <= k; i += 8 * C)
    for (int c = 0; c < C; ++c) dense_step<T, R>(wr, xr, k, i + 8 * c, acc[c]);
  for (; i + 8 <= k; i += 8) dense_step<T, R>(wr, xr, k, i, acc[0]);
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r) {
      Vec8 sum = acc[0][t][r];
      for (int c = 1; c < C; ++c) sum = add8(sum, acc[c][t][r]);
      float s = hsum8(sum);
      for (int64_t j = i; j < k; ++j) s += to_float(wr[r * k + j]) * xr[t * k + j];
      out[t][r] = s;
    }
}

#endif

// ---- int4 weights ------------------------------------------------------------------------------

// (the kernels below take `Table`: whether the matrix has levels of its own; without, the
// table holds q - 8 and the uniform decoding runs)
struct Int4Weights {
  const uint8_t* q;
  const uint16_t* scales;  // bf16 bits
  const uint16_t* zeros;
  int64_t k, groups;
  int8_t levels[16];  // the level of each nibble
#if CHATPAGE_GEMV_AVX512
  alignas(64) uint16_t level_words[32];  // bf16 bits of levels[i & 15]
#endif
};

#if CHATPAGE_GEMV_AVX512

// One pair of groups (p) of R weight rows against T activation rows; `Two`: both groups exist.
// A nibble q becomes the bf16 value 128 + q (0x4300 | q, exact), so the dot products here are
// sum((128 + q) * x) and int4_dots subtracts the 136 * scale * sum(x) this adds per group; with
// a table, the bf16 of levels[q] (`table`: Int4Weights::level_words, whose words i and i + 16
// are equal, so a byte's high nibble in vpermw's fifth index bit needs no mask).
template <int T, int R, bool Two, bool Table>
inline void int4_pair(const Int4Weights& wt, const uint16_t* xp, int64_t row_stride, int64_t p,
                      int64_t n0, __m512i table, __m512 (&acc)[T][R]) {
  const __m512i nibble = _mm512_set1_epi16(0x000F), base = _mm512_set1_epi16(0x4300);
  const __m512i high_words = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  __m512i lo[T], hi[T];
  for (int t = 0; t < T; ++t) {
    lo[t] = _mm512_loadu_si512(xp + t * row_stride + p * 64);
    hi[t] = _mm512_loadu_si512(xp + t * row_stride + p * 64 + 32);
  }
  for (int r = 0; r < R; ++r) {
    const uint8_t* qp = wt.q + (n0 + r) * (wt.k / 2) + p * kGroup;
    const uint16_t* sp = wt.scales + (n0 + r) * wt.groups + 2 * p;
    const __m256i bytes = Two ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qp))
                              : _mm256_maskz_loadu_epi8(0xFFFF, qp);
    uint32_t scale_bits = sp[0];  // both groups' scales: bf16 bits, the first in the low half
    if (Two) std::memcpy(&scale_bits, sp, sizeof(scale_bits));
    const __m512i raw = _mm512_cvtepu8_epi16(bytes);
    __m512bh w_lo, w_hi;
    if constexpr (Table) {
      w_lo = (__m512bh)_mm512_permutexvar_epi16(raw, table);
      w_hi = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(raw, 4), table);
    } else {
      w_lo = (__m512bh)_mm512_ternarylogic_epi32(raw, nibble, base, 0xEA);  // a & b | c
      w_hi = (__m512bh)_mm512_or_si512(_mm512_srli_epi16(raw, 4), base);
    }
    // lanes 0-7: the first group's scale, 8-15: the second's (bf16 -> fp32 is a 16-bit shift)
    const __m512i both = _mm512_set1_epi32(static_cast<int>(scale_bits));
    const __m512 scale = _mm512_castsi512_ps(
        _mm512_mask_slli_epi32(_mm512_and_si512(both, high_words), 0x00FF, both, 16));
    for (int t = 0; t < T; ++t) {
      __m512 d = _mm512_dpbf16_ps(_mm512_setzero_ps(), w_lo, (__m512bh)lo[t]);
      d = _mm512_dpbf16_ps(d, w_hi, (__m512bh)hi[t]);
      acc[t][r] = _mm512_fmadd_ps(d, scale, acc[t][r]);
    }
  }
}

// acc[t][r] += (zero - 136 * scale) * sum(x) for groups g.. (16, or per `mask`): the zero point,
// less the 128 + 8 that int4_pair's uniform decoding adds (with a table: zero * sum(x))
template <int T, int R, bool Full, bool Table>
inline void zero_terms(const Int4Weights& wt, const float* sums, int64_t g, __mmask16 mask,
                       int64_t m0, int64_t n0, __m512 (&acc)[T][R]) {
  const __m512 offset = _mm512_set1_ps(136.f);
  __m512 xs[T];
  for (int t = 0; t < T; ++t) {
    const float* p = sums + (m0 + t) * wt.groups + g;
    xs[t] = Full ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(mask, p);
  }
  for (int r = 0; r < R; ++r) {
    const int64_t at = (n0 + r) * wt.groups + g;
    __m512 z = load_bf16x16<Full>(wt.zeros + at, mask);
    if constexpr (!Table)
      z = _mm512_fnmadd_ps(offset, load_bf16x16<Full>(wt.scales + at, mask), z);
    for (int t = 0; t < T; ++t) acc[t][r] = _mm512_fmadd_ps(z, xs[t], acc[t][r]);
  }
}

// out[t][r] = sum over groups g of scale_g * sum(level(q) * x) + zero_g * sums_g, for activation
// rows m0.. and weight rows n0..
template <int T, int R, bool Table>
void int4_dots(const Int4Weights& wt, const uint16_t* x, const float* sums, int64_t m0, int64_t n0,
               float (*out)[R]) {
  const int64_t pairs = (wt.groups + 1) / 2, stride = pairs * 64;
  const uint16_t* xp = x + m0 * stride;
  const __m512i table = Table ? _mm512_load_si512(wt.level_words) : _mm512_setzero_si512();
  __m512 acc[T][R];
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r) acc[t][r] = _mm512_setzero_ps();
  const char* next = prefetch_start(wt.q + n0 * (wt.k / 2), R * wt.k / 2);
  int64_t p = 0;
  for (; p < wt.groups / 2; ++p) {
    if constexpr (R > 1)
      for (int b = 0; b < R * kGroup; b += 64) _mm_prefetch(next + p * R * kGroup + b, _MM_HINT_T0);
    int4_pair<T, R, true, Table>(wt, xp, stride, p, n0, table, acc);
  }
  if (wt.groups % 2) int4_pair<T, R, false, Table>(wt, xp, stride, p, n0, table, acc);
  int64_t g = 0;
  for (; g + 16 <= wt.groups; g += 16)
    zero_terms<T, R, true, Table>(wt, sums, g, 0xFFFF, m0, n0, acc);
  if (g < wt.groups)
    zero_terms<T, R, false, Table>(wt, sums, g, __mmask16((1u << (wt.groups - g)) - 1), m0, n0,
                                   acc);
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r) out[t][r] = _mm512_reduce_add_ps(acc[t][r]);
}

#else

// out[t][r] = sum over groups g of scale_g * sum(q * x) + (zero_g - 8 scale_g) * sums_g (with a
// table: scale_g * sum(levels[q] * x) + zero_g * sums_g), for activation rows m0.. (fp32, k per
// row) and weight rows n0.., in vec.h's eight lanes: the 16 bytes of a group widen to four
// vectors of levels (inputs 0-7, 8-15 from the low nibbles, 16-23, 24-31 from the high ones),
// decoded once for the T activation rows, and each row's dot with them is scaled into its
// accumulator.
template <int T, int R, bool Table>
void int4_dots(const Int4Weights& wt, const float* x, const float* sums, int64_t m0, int64_t n0,
               float (*out)[R]) {
  const int64_t k = wt.k, groups = wt.groups;
  const Table16 table = load_table16(wt.levels);
  const float* xr = x + m0 * k;
  const c10::BFloat16* scales = reinterpret_cast<const c10::BFloat16*>(wt.scales);
  const c10::BFloat16* zeros = reinterpret_cast<const c10::BFloat16*>(wt.zeros);
  Vec8 acc[T][R];
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r) acc[t][r] = zero8();
  for (int64_t g = 0; g < groups; ++g) {
    for (int r = 0; r < R; ++r) {
      const uint8_t* qp = wt.q + (n0 + r) * (k / 2) + g * (kGroup / 2);
      Vec8 w[4];  // levels of inputs 0-7, 8-15, 16-23, 24-31
      if constexpr (Table) {
        looked_up8(qp, table, w[0], w[2]);
        looked_up8(qp + 8, table, w[1], w[3]);
      } else {
        nibbles8(qp, w[0], w[2]);
        nibbles8(qp + 8, w[1], w[3]);
      }
      const Vec8 scale = splat8(to_float(scales[(n0 + r) * groups + g]));
      for (int t = 0; t < T; ++t) {
        const float* xg = xr + t * k + g * kGroup;
        Vec8 d = mul8(w[0], load8(xg));
        for (int j = 1; j < 4; ++j) d = fma8(w[j], load8(xg + 8 * j), d);
        acc[t][r] = fma8(d, scale, acc[t][r]);
      }
    }
  }
  // the zero points, eight groups at a time: (zero - 8 scale) * sum(x) per group (with a table:
  // zero * sum(x))
  const Vec8 eight = splat8(8.f);
  const float offset = Table ? 0.f : 8.f;
  int64_t g = 0;
  for (; g + 8 <= groups; g += 8)
    for (int r = 0; r < R; ++r) {
      const int64_t at = (n0 + r) * groups + g;
      Vec8 z = load8(zeros + at);
      if constexpr (!Table) z = sub8(z, mul8(eight, load8(scales + at)));
      for (int t = 0; t < T; ++t)
        acc[t][r] = fma8(z, load8(sums + (m0 + t) * groups + g), acc[t][r]);
    }
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r) {
      float total = hsum8(acc[t][r]);
      for (int64_t j = g; j < groups; ++j) {
        const int64_t at = (n0 + r) * groups + j;
        const float z = to_float(zeros[at]) - offset * to_float(scales[at]);
        total += z * sums[(m0 + t) * groups + j];
      }
      out[t][r] = total;
    }
}

#endif

// ---- activations and outputs -------------------------------------------------------------------

#if CHATPAGE_GEMV_AVX512

Activations int4_activations(const at::Tensor& x, int64_t groups) {
  const at::Tensor xb = x.to(at::kBFloat16).contiguous();
  const int64_t m = x.size(0), k = x.size(1), pairs = (groups + 1) / 2;
  at::Tensor values = at::zeros({m, pairs * 64}, x.options().dtype(at::kBFloat16));
  at::Tensor sums = at::empty({m, groups}, x.options().dtype(at::kFloat));
  const uint16_t* src = reinterpret_cast<const uint16_t*>(xb.data_ptr<c10::BFloat16>());
  uint16_t* dst = reinterpret_cast<uint16_t*>(values.data_ptr<c10::BFloat16>());
  float* sum = sums.data_ptr<float>();
  for (int64_t t = 0; t < m; ++t)
    for (int64_t g = 0; g < groups; ++g) {
      const uint16_t* in = src + t * k + g * kGroup;
      uint16_t* lo = dst + t * pairs * 64 + g / 2 * 64 + g % 2 * 16;
      std::memcpy(lo, in, 16 * sizeof(uint16_t));
      std::memcpy(lo + 32, in + 16, 16 * sizeof(uint16_t));
      float s = 0.f;
      for (int j = 0; j < kGroup; ++j)
        s += static_cast<float>(c10::BFloat16(in[j], c10::BFloat16::from_bits()));
      sum[t * groups + g] = s;
    }
  return {values, sums};
}

#else

Activations int4_activations(const at::Tensor& x, int64_t groups) {
  const at::Tensor xb = x.to(at::kBFloat16).contiguous();
  const int64_t m = x.size(0), k = x.size(1);
  at::Tensor values = at::empty({m, k}, x.options().dtype(at::kFloat));
  at::Tensor sums = at::empty({m, groups}, x.options().dtype(at::kFloat));
  const c10::BFloat16* src = xb.data_ptr<c10::BFloat16>();
  float* dst = values.data_ptr<float>();
  float* sum = sums.data_ptr<float>();
  for (int64_t g = 0; g < m * groups; ++g) {  // k = groups * kGroup: row t's groups follow t - 1's
    Vec8 s = zero8();
    for (int j = 0; j < kGroup; j += 8) {
      const Vec8 v = load8(src + g * kGroup + j);
      store8(dst + g * kGroup + j, v);
      s = add8(s, v);
    }
    sum[g] = hsum8(s);
  }
  return {values, sums};
}

#endif

// y = (x @ W.T) * row_scale(row) + bias for dense weights W [N, K] (fp32, bf16 or int8), the
// activations widened to fp32
template <typename W, typename Scale>
at::Tensor dense_gemv(const at::Tensor& x, const W* w, int64_t n,
                      const c10::optional<at::Tensor>& bias, Scale&& row_scale) {
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  const float* xp = xf.data_ptr<float>();
  at::Tensor out = output_for(x, n), bias_f;
  const float* b = bias_data(bias, bias_f);
  const Output dst = output_of(out);
  const int64_t m = x.size(0), k = x.size(1);
  auto run = [&]<int Rows>() {
    over_rows<Rows>(n, k * static_cast<int64_t>(sizeof(W)), [&](int64_t nb, int64_t ne) {
      over_tiles<kDenseTile, Rows>(m, nb, ne, [&]<int T, int R>(int64_t m0, int64_t n0) {
        float dots[T][R];
        dense_dots<T, R>(w, xp, k, m0, n0, dots);
        store<T, R>(dst, b, m0, n0, dots, row_scale);
      });
    });
  };
  // One activation row reads the weights one row after another: a single sequential stream,
  // which the hardware prefetcher follows best (every fp32 matmul of the default model's step,
  // 1 thread, alternating in one process: 6-13% faster than four rows at once, within 5% of a
  // plain reduction over the same tensors).
  // More activation rows take kRows weight rows at a time, so each activation load serves several.
  if (m == 1) run.template operator()<1>();
  else run.template operator()<kRows>();
  return out;
}

float unscaled(int64_t) { return 1.f; }

}  // namespace

at::Tensor gemv_fp32(const at::Tensor& x, const at::Tensor& weight,
                     const c10::optional<at::Tensor>& bias) {
  check_gemv_args(x, weight, weight.size(1), bias, "gemv_fp32");
  TORCH_CHECK(weight.scalar_type() == at::kFloat, "chatpage::gemv_fp32: weight must be float32");
  return dense_gemv(x, weight.data_ptr<float>(), weight.size(0), bias, unscaled);
}

at::Tensor gemv_bf16(const at::Tensor& x, const at::Tensor& weight,
                     const c10::optional<at::Tensor>& bias) {
  check_gemv_args(x, weight, weight.size(1), bias, "gemv_bf16");
  TORCH_CHECK(weight.scalar_type() == at::kBFloat16,
              "chatpage::gemv_bf16: weight must be bfloat16");
  return dense_gemv(x, weight.data_ptr<c10::BFloat16>(), weight.size(0), bias, unscaled);
}

at::Tensor gemv_int8(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scales,
                     const c10::optional<at::Tensor>& bias) {
  check_gemv_args(x, qweight, qweight.size(1), bias, "gemv_int8");
  check_int8_args(qweight, scales, "gemv_int8");
  const c10::BFloat16* s = scales.data_ptr<c10::BFloat16>();
  return dense_gemv(x, qweight.data_ptr<int8_t>(), qweight.size(0), bias,
                    [s](int64_t col) { return static_cast<float>(s[col]); });
}

at::Tensor gemv_int4(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scales,
                     const at::Tensor& zeros, const c10::optional<at::Tensor>& levels,
                     const c10::optional<at::Tensor>& bias) {
  const int64_t k = q.size(1) * 2;
  check_gemv_args(x, q, k, bias, "gemv_int4");
  check_int4_args(q, scales, zeros, levels, kGroup, "gemv_int4");
  const int64_t n = q.size(0), groups = k / kGroup;
  const Activations act = int4_activations(x, groups);
  at::Tensor out = output_for(x, n), bias_f;
  const float* b = bias_data(bias, bias_f);
  const Output dst = output_of(out);
  Int4Weights wt{q.data_ptr<uint8_t>(),
                 reinterpret_cast<const uint16_t*>(scales.data_ptr<c10::BFloat16>()),
                 reinterpret_cast<const uint16_t*>(zeros.data_ptr<c10::BFloat16>()), k, groups};
  const bool table = int4_levels(levels, wt.levels);
#if CHATPAGE_GEMV_AVX512
  for (int i = 0; i < 32; ++i) wt.level_words[i] = c10::BFloat16(wt.levels[i & 15]).x;
#endif
  const Int4Input* xv = static_cast<const Int4Input*>(act.values.data_ptr());
  const float* sums = act.group_sums.data_ptr<float>();
  auto run = [&]<bool Table>() {
    auto int4_kernel = [&]<int T, int R>(int64_t m0, int64_t n0) {
      float dots[T][R];
      int4_dots<T, R, Table>(wt, xv, sums, m0, n0, dots);
      store<T, R>(dst, b, m0, n0, dots, unscaled);
    };
    over_rows<kInt4Rows>(n, k / 2, [&](int64_t nb, int64_t ne) {
      over_tiles<kInt4Tile, kInt4Rows>(x.size(0), nb, ne, int4_kernel);
    });
  };
  if (table) run.template operator()<true>();
  else run.template operator()<false>();
  return out;
}

}  // namespace chatpage::cpu
