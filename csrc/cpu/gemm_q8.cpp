// Matmuls of many rows against int4 and int8 weights with the activations quantized to int8, in
// blocks of 32 inputs, and the products summed in integers by AVX-512 VNNI (vpdpbusd: 64 u8 x s8
// products into 16 int32 sums per instruction, about 4x the multiply-adds per second of fp32 FMAs
// on a Zen 4 core). llama.cpp's way (its Q8 activation blocks) on the weights as the GEMVs store
// them; chatpage/engine/model/gemv.py's quantize_q8 and reference_q8_int4 / reference_q8_int8 are the
// specification: the kernel sums in another order, nothing else differs.
//
// The activations: each block of 32 inputs of a row becomes 32 int8 levels qa = round(x * 127 /
// amax) and its scale d = amax / 127 (amax the block's largest |x|); their sum S = sum qa is kept
// too. The weights are the unsigned operand: an int4 level q (0..15), or levels[q] + 128 for a
// matrix with a table of its own, or an int8 weight + 128, so for one block of one output
//   sum_i w_i x_i = d * (scale * sum_i u_i qa_i + (zero - c * scale) * S)
// with c = 8, 128 or 128 (int8: scale 1 and zero 0 per block, the row's scale applied at the end).
//
// Each task takes a block of 32 weight rows laid out for it: for each block of 32 inputs, vectors
// of 16 rows x 4 consecutive inputs (a row's 4 bytes are one int32 lane), so one vpdpbusd
// multiplies 16 rows by 4 inputs of one activation row, broadcast from memory. Then every
// activation row runs against it, 4 at a time: a 4 x 32 tile of int32 sums per block of inputs,
// turned into floats and scaled into 4 x 32 fp32 sums. Blocks of weight rows are split among
// threads with at::parallel_for.
//
// The layout is made once at load where it can be (a q8 pack: every task's layout one after
// another, for a matrix of whole 32-row tasks; engine/model/weights.py's q8_packs): laying out 32 rows
// per call (transposes, the scales' conversion) cost the default model's 30 layers about 11 ms of
// a step at any row count on 1 thread, more than the whole product at 1-4 rows. With packs the
// q8 GEMM is the fastest kernel there at every row count, batch 1 included (int4, 1 thread, the
// 30 layers each over its own weights: 1 row 5.1 ms by the GEMV, 10.0 by the q8 GEMM laying out
// per call, 3.2 packed; 8 rows 22.4 / 14.5 / 8.1; 64 rows - / 53.8 / 48.5). The unpacked entry
// points lay each task out per call into a buffer that stays in L1/L2; both run the same code on
// the same bytes, so they give the same bits.
//
// With AMX (a Xeon of Sapphire Rapids on) a call of at least kAmxFrom activation rows takes the
// same products on AMX's int8 tiles instead (amx_task_product): the same int32 sums, scaled in
// the same order, so the same bits as the VNNI tiles (a row's result does not depend on the row
// count: exact speculative decoding). Only the multiplications move to the tiles; the scaling of
// every block's sums stays on AVX-512 and is most of the time left (the default model's int4
// layers, 1 thread: 1.25x the VNNI tiles at 32 rows, 1.4x at 64, level at 8-16).
//
// On an AVX2 CPU (no AVX-512: the Zen 2/3 EPYCs of this project's machines) the same packs and
// the same activation blocks go through maddubs and madd (vpmaddubsw: 32 u8 x s8 products into 16
// saturating int16 pair sums, vpmaddwd to widen them), a quarter of a task (8 rows, one 256-bit
// vector of the layout) at a time. maddubs saturates, so the operands are kept small enough:
// int4's nibbles (0..15) go in as they are and sum in int16 over a whole block; int8 weights and a
// table's levels go in signed, by the sign trick (|w| against the activation with w's sign), which
// needs no + 128 and no c. int4 matrices take them there at every row count (about 2.5 integer
// instructions for 32 multiply-adds against 4 FMAs: 1.7x the fp32-FMA GEMM of gemm.cpp at 8-128
// rows); int8's, a madd after every maddubs and two passes, lose to it (weights.py's Q8_FORMATS).
#include "checks.h"
#include "cpu/amx.h"
#include "cpu/matmul.h"
#include "cpu/ops_cpu.h"
#include "cpu/vec.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstring>

// Which q8 kernels the build has: AVX-512 VNNI's (512), or AVX2's (256: maddubs and madd on an
// AVX2 CPU without AVX-512; the AVX-VNNI of some AVX2 CPUs is not used), or none.
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define CHATPAGE_Q8 512
#include <immintrin.h>
// and AMX's int8 tiles where the build has them (amx_task_product)
#if defined(__AMX_TILE__) && defined(__AMX_INT8__)
#define CHATPAGE_Q8_AMX 1
#endif
#elif CHATPAGE_AVX2
#define CHATPAGE_Q8 256
#endif

namespace chatpage::cpu {

#if defined(CHATPAGE_Q8)
namespace {

constexpr int kBlock = 32;             // inputs per activation block (and per int4 group)
constexpr int kLanes = 16;             // weight rows per 64-byte vector of a layout
constexpr int kRowsPerTask = 32;       // weight rows per laid-out block: two vectors
constexpr int kTile = 4;               // activation rows per pass over a block
constexpr int64_t kSlice = 256;        // activation rows quantized per pass over the weights
constexpr int64_t kTaskMacs = 1 << 18;  // multiply-adds below which a task is not split
// activation rows below which quantizing is not split (a 32-row decode step's rows on both
// threads: with 32 the second thread waited for the first, ~3% of the step)
constexpr int64_t kQuantizeGrain = 16;
// int8 weights take their activations in two passes (x ~ d1 q1 + d2 q2, about 16 bits): with one,
// perplexity on a Q8_0 file re-encoded in int8 rose 2.0% over fp32 against 1.0% before the q8
// GEMMs; int4's own rounding is coarser than one pass's (+0.6% on the default model)
constexpr int kInt8Passes = 2;

// The activations of `rows` rows quantized per block (gemv.py's quantize_q8), in `passes` passes
// (the second quantizes what the first left over): qa [rows, passes * blocks * 32] int8 (zero past
// k), d and d * S [rows, passes * blocks]; pass p's block b is block p * blocks + b of a row.
struct Q8Rows {
  const int8_t* qa;
  const float* d;
  const float* ds;
  int64_t blocks;  // of the weights
  int passes;
  int64_t row_blocks() const { return blocks * passes; }
};

#if CHATPAGE_Q8 == 512
template <typename X>
inline __m512 load16(const X* p, __mmask16 mask);
template <>
inline __m512 load16(const float* p, __mmask16 mask) {
  return _mm512_maskz_loadu_ps(mask, p);
}
template <>
inline __m512 load16(const c10::BFloat16* p, __mmask16 mask) {
  const __m256i bits = _mm256_maskz_loadu_epi16(mask, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

inline __mmask16 lanes_below(int64_t count) {
  return count >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << std::max<int64_t>(count, 0)) - 1);
}

// One block of 32 values (lo, hi) as int8 levels at out, their scale and scale * sum; returns
// them dequantized in lo, hi (what the next pass subtracts).
inline void quantize_block(__m512& lo, __m512& hi, int8_t* out, float& d, float& ds) {
  const __m512 sign = _mm512_set1_ps(-0.f);
  const float amax = _mm512_reduce_max_ps(
      _mm512_max_ps(_mm512_andnot_ps(sign, lo), _mm512_andnot_ps(sign, hi)));
  const float inv = amax > 0.f ? 127.f / amax : 0.f;
  const __m512 scale = _mm512_set1_ps(inv);
  // round half to even, as torch.round does (the default rounding mode)
  const __m512i qlo = _mm512_cvtps_epi32(_mm512_mul_ps(lo, scale));
  const __m512i qhi = _mm512_cvtps_epi32(_mm512_mul_ps(hi, scale));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm512_cvtepi32_epi8(qlo));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16), _mm512_cvtepi32_epi8(qhi));
  d = amax / 127.f;
  ds = d * static_cast<float>(_mm512_reduce_add_epi32(_mm512_add_epi32(qlo, qhi)));
  const __m512 dv = _mm512_set1_ps(d);
  lo = _mm512_mul_ps(_mm512_cvtepi32_ps(qlo), dv);
  hi = _mm512_mul_ps(_mm512_cvtepi32_ps(qhi), dv);
}

// quantize_block of 16 consecutive blocks (512 values at x) with their maxima and sums taken
// across the blocks at once (transposed reductions, one division per 16 blocks), instead of a
// horizontal max, a scalar division and a horizontal sum per block in one latency chain: the
// same bits; 1024 bf16 rows of 576 into 32 outputs, 2 threads of a Zen 4: 303 -> 228 us, and a
// 1024-token prefill step of the default model 505 -> 469 ms.
template <typename X>
inline void quantize_16_blocks(const X* x, int8_t* out, float* d, float* ds) {
  const __m512 sign = _mm512_set1_ps(-0.f);
  __m512 acc[16];
  for (int b = 0; b < 16; ++b) {
    const __m512 lo = load16(x + b * kBlock, 0xFFFF), hi = load16(x + b * kBlock + 16, 0xFFFF);
    acc[b] = _mm512_max_ps(_mm512_andnot_ps(sign, lo), _mm512_andnot_ps(sign, hi));
  }
  const __m512 amax = Lanes16::transpose_max(acc);
  const __mmask16 nonzero = _mm512_cmp_ps_mask(amax, _mm512_setzero_ps(), _CMP_GT_OQ);
  const __m512 inv = _mm512_maskz_div_ps(nonzero, _mm512_set1_ps(127.f), amax);
  const __m512 dv = _mm512_div_ps(amax, _mm512_set1_ps(127.f));
  for (int b = 0; b < 16; ++b) {
    const __m512 scale = _mm512_permutexvar_ps(_mm512_set1_epi32(b), inv);
    const __m512 lo = load16(x + b * kBlock, 0xFFFF), hi = load16(x + b * kBlock + 16, 0xFFFF);
    const __m512i qlo = _mm512_cvtps_epi32(_mm512_mul_ps(lo, scale));
    const __m512i qhi = _mm512_cvtps_epi32(_mm512_mul_ps(hi, scale));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + b * kBlock), _mm512_cvtepi32_epi8(qlo));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + b * kBlock + 16), _mm512_cvtepi32_epi8(qhi));
    acc[b] = _mm512_cvtepi32_ps(_mm512_add_epi32(qlo, qhi));  // exact: |sum| <= 127 * 32
  }
  _mm512_storeu_ps(d, dv);
  _mm512_storeu_ps(ds, _mm512_mul_ps(dv, Lanes16::transpose_sum(acc)));
}

template <typename X>
void quantize_rows(const X* x, int64_t rows, int64_t k, const Q8Rows& a, int8_t* qa, float* d,
                   float* ds) {
  const int64_t nb = a.row_blocks();
  if (a.passes == 1 && k % kBlock == 0) {  // rows of whole blocks: one run of rows * nb blocks
    const int64_t total = rows * nb;
    int64_t b = 0;
    for (; b + 16 <= total; b += 16)
      quantize_16_blocks(x + b * kBlock, qa + b * kBlock, d + b, ds + b);
    for (; b < total; ++b) {
      __m512 lo = load16(x + b * kBlock, 0xFFFF), hi = load16(x + b * kBlock + 16, 0xFFFF);
      quantize_block(lo, hi, qa + b * kBlock, d[b], ds[b]);
    }
    return;
  }
  for (int64_t t = 0; t < rows; ++t) {
    const X* row = x + t * k;
    for (int64_t b = 0; b < a.blocks; ++b) {
      const int64_t i = b * kBlock;
      __m512 lo = load16(row + i, lanes_below(k - i));
      __m512 hi = load16(row + i + 16, lanes_below(k - i - 16));
      for (int p = 0; p < a.passes; ++p) {
        const int64_t at = t * nb + p * a.blocks + b;
        __m512 lo_p = lo, hi_p = hi;
        quantize_block(lo_p, hi_p, qa + at * kBlock, d[at], ds[at]);
        lo = _mm512_sub_ps(lo, lo_p);
        hi = _mm512_sub_ps(hi, hi_p);
      }
    }
  }
}

// Four vectors of 16 rows from 16 bytes of each row (row r at src + r * stride; rows from `valid`
// on read as zero): vector j holds the rows' int32 lane j (bytes 4j..4j+3), row r in lane r.
// Rows i, i + 4, i + 8, i + 12 are loaded into the four 128-bit lanes of one register, and a 4 x 4
// transpose of int32s inside each 128-bit lane finishes it.
inline void transpose_rows(const uint8_t* src, int64_t stride, int valid, __m512i (&out)[4]) {
  alignas(16) static const uint8_t none[16] = {};
  __m512i a[4];
  for (int i = 0; i < 4; ++i) {
    auto row = [&](int r) {
      return _mm_loadu_si128(reinterpret_cast<const __m128i*>(r < valid ? src + r * stride : none));
    };
    __m512i v = _mm512_castsi128_si512(row(i));
    v = _mm512_inserti32x4(v, row(i + 4), 1);
    v = _mm512_inserti32x4(v, row(i + 8), 2);
    a[i] = _mm512_inserti32x4(v, row(i + 12), 3);
  }
  const __m512i t0 = _mm512_unpacklo_epi32(a[0], a[1]), t1 = _mm512_unpackhi_epi32(a[0], a[1]);
  const __m512i t2 = _mm512_unpacklo_epi32(a[2], a[3]), t3 = _mm512_unpackhi_epi32(a[2], a[3]);
  out[0] = _mm512_unpacklo_epi64(t0, t2);
  out[1] = _mm512_unpackhi_epi64(t0, t2);
  out[2] = _mm512_unpacklo_epi64(t1, t3);
  out[3] = _mm512_unpackhi_epi64(t1, t3);
}

// transpose_rows' four vectors stored at out, out + 64, ... (their bytes + 128 where `flip`)
inline void transposed_rows(const uint8_t* src, int64_t stride, int valid, bool flip,
                            uint8_t* out) {
  __m512i quads[4];
  transpose_rows(src, stride, valid, quads);
  const __m512i bits = _mm512_set1_epi8(static_cast<char>(flip ? 0x80 : 0));
  for (int j = 0; j < 4; ++j) _mm512_storeu_si512(out + j * 64, _mm512_xor_si512(quads[j], bits));
}

#else  // AVX2

// Up to 8 values at p (`count` of them; the lanes past it zero) as floats.
inline __m256 load8_below(const float* p, int64_t count) {
  if (count >= 8) return _mm256_loadu_ps(p);
  alignas(32) float tmp[8] = {};
  for (int64_t i = 0; i < count; ++i) tmp[i] = p[i];
  return _mm256_load_ps(tmp);
}
inline __m256 load8_below(const c10::BFloat16* p, int64_t count) {
  if (count >= 8) return load8(p).v;
  alignas(32) float tmp[8] = {};
  for (int64_t i = 0; i < count; ++i) tmp[i] = static_cast<float>(p[i]);
  return _mm256_load_ps(tmp);
}

inline int32_t hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

// One block of 32 values (four vectors of 8) as int8 levels at out, their scale and scale * sum;
// returns them dequantized in v (what the next pass subtracts).
inline void quantize_block(__m256 (&v)[4], int8_t* out, float& d, float& ds) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  __m256 most = _mm256_andnot_ps(sign, v[0]);
  for (int i = 1; i < 4; ++i) most = _mm256_max_ps(most, _mm256_andnot_ps(sign, v[i]));
  const float amax = hmax8({most});
  const __m256 scale = _mm256_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
  __m256i q[4];
  // round half to even, as torch.round does (the default rounding mode)
  for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], scale));
  // the packs work inside 128-bit lanes: the bytes come out as dwords 0, 2, 4, 6, 1, 3, 5, 7 of
  // the block, which one permutation puts back in order (|q| <= 127: nothing saturates)
  const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]),
                                           _mm256_packs_epi32(q[2], q[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out),
                      _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  d = amax / 127.f;
  const __m256i sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
  ds = d * static_cast<float>(hsum_epi32(sum));
  const __m256 dv = _mm256_set1_ps(d);
  for (int i = 0; i < 4; ++i) v[i] = _mm256_mul_ps(_mm256_cvtepi32_ps(q[i]), dv);
}

template <typename X>
void quantize_rows(const X* x, int64_t rows, int64_t k, const Q8Rows& a, int8_t* qa, float* d,
                   float* ds) {
  const int64_t nb = a.row_blocks();
  for (int64_t t = 0; t < rows; ++t) {
    const X* row = x + t * k;
    for (int64_t b = 0; b < a.blocks; ++b) {
      const int64_t i = b * kBlock;
      __m256 v[4];
      for (int c = 0; c < 4; ++c) v[c] = load8_below(row + i + 8 * c, k - i - 8 * c);
      for (int p = 0; p < a.passes; ++p) {
        const int64_t at = t * nb + p * a.blocks + b;
        __m256 part[4] = {v[0], v[1], v[2], v[3]};
        quantize_block(part, qa + at * kBlock, d[at], ds[at]);
        for (int c = 0; c < 4; ++c) v[c] = _mm256_sub_ps(v[c], part[c]);
      }
    }
  }
}

// The layout's four 64-byte vectors from 16 bytes of each of 16 rows (as the AVX-512 transpose
// lays them out; their bytes + 128 where `flip`): each 32-byte half (rows 0-7, rows 8-15) in one
// register, rows i and i + 4 in its two 128-bit lanes, then a 4 x 4 transpose of int32s inside
// each lane.
inline void transposed_rows(const uint8_t* src, int64_t stride, int valid, bool flip,
                            uint8_t* out) {
  alignas(16) static const uint8_t none[16] = {};
  const __m256i bits = _mm256_set1_epi8(static_cast<char>(flip ? 0x80 : 0));
  auto row = [&](int r) {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(r < valid ? src + r * stride : none));
  };
  for (int g = 0; g < 2; ++g) {
    __m256i a[4];
    for (int i = 0; i < 4; ++i)
      a[i] = _mm256_inserti128_si256(_mm256_castsi128_si256(row(8 * g + i)), row(8 * g + i + 4), 1);
    const __m256i t0 = _mm256_unpacklo_epi32(a[0], a[1]), t1 = _mm256_unpackhi_epi32(a[0], a[1]);
    const __m256i t2 = _mm256_unpacklo_epi32(a[2], a[3]), t3 = _mm256_unpackhi_epi32(a[2], a[3]);
    const __m256i quads[4] = {_mm256_unpacklo_epi64(t0, t2), _mm256_unpackhi_epi64(t0, t2),
                              _mm256_unpacklo_epi64(t1, t3), _mm256_unpackhi_epi64(t1, t3)};
    for (int j = 0; j < 4; ++j)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j * 64 + g * 32),
                          _mm256_xor_si256(quads[j], bits));
  }
}

#endif

// One task's 32 weight rows laid out, block of 32 inputs after block, kTaskBlock<Int4> bytes each:
// int4: 2 halves (rows 0-15, 16-31) x 4 vectors, vector j holding each row's bytes 4j..4j+3
// (inputs 4j.. in the low nibbles, 16 + 4j.. in the high ones), then the halves' 16 scales and
// their 16 zeros (bf16); int8: 2 halves x 8 vectors, vector j holding inputs 4j..4j+3 (+128).
// A pack (q8_pack_int4 / q8_pack_int8) is every task's layout one after another, made once at
// load; the kernels on unpacked weights lay out each task per call into a buffer.
template <bool Int4>
constexpr int64_t kTaskBlock = Int4 ? 2 * 4 * 64 + 2 * 2 * 32 : 2 * 8 * 64;
constexpr int64_t kScalesAt = 2 * 4 * 64;  // int4: offset of the scales in a task's block
constexpr int64_t kZerosAt = kScalesAt + 2 * 32;

template <bool Int4>
constexpr int kVectors = Int4 ? 4 : 8;

// Asks for the bytes [p, p + bytes) in L2 at once (prefetcht1: many lines at a time into L1
// stall its miss buffers): a task's rows lie in one region, which its layout reads 16 rows at a
// time, too many streams for the hardware's prefetch (with it the layout of the default model's
// layers takes 2/3 of the time).
inline void prefetch(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t i = 0; i < bytes; i += 64) _mm_prefetch(c + i, _MM_HINT_T1);
}

// Lays out weight rows [n0, n0 + valid) of an int4 matrix (q [N, K/2], byte j of a group: input
// j low, j + 16 high; scales and zeros [N, K/32]) as one task at out (rows from valid on: zero).
void lay_out_int4(const uint8_t* q, const c10::BFloat16* scales, const c10::BFloat16* zeros,
                  int64_t k, int64_t n0, int valid, uint8_t* out) {
  const int64_t blocks = k / kBlock, stride = k / 2;
  prefetch(q + n0 * stride, valid * stride);
  prefetch(scales + n0 * blocks, valid * blocks * 2);
  prefetch(zeros + n0 * blocks, valid * blocks * 2);
  for (int half = 0; half < 2; ++half) {
    const int rows = std::clamp(valid - half * kLanes, 0, kLanes);
    const uint8_t* base = q + (n0 + half * kLanes) * stride;
    for (int64_t b = 0; b < blocks; ++b) {
      uint8_t* at = out + b * kTaskBlock<true>;
      transposed_rows(base + b * 16, stride, rows, false, at + half * 4 * 64);
      c10::BFloat16* sc = reinterpret_cast<c10::BFloat16*>(at + kScalesAt) + half * kLanes;
      c10::BFloat16* ze = reinterpret_cast<c10::BFloat16*>(at + kZerosAt) + half * kLanes;
      for (int r = 0; r < kLanes; ++r) {
        const int64_t row = (n0 + half * kLanes + r) * blocks + b;
        sc[r] = r < rows ? scales[row] : c10::BFloat16(0.f);
        ze[r] = r < rows ? zeros[row] : c10::BFloat16(0.f);
      }
    }
  }
}

// The same for an int8 matrix (q [N, blocks * 32]): the bytes + 128 (sign bit flipped).
void lay_out_int8(const int8_t* q, int64_t blocks, int64_t n0, int valid, uint8_t* out) {
  const int64_t k = blocks * kBlock;
  const uint8_t* bytes = reinterpret_cast<const uint8_t*>(q);
  prefetch(bytes + n0 * k, valid * k);
  for (int half = 0; half < 2; ++half) {
    const int rows = std::clamp(valid - half * kLanes, 0, kLanes);
    const uint8_t* base = bytes + (n0 + half * kLanes) * k;
    for (int64_t b = 0; b < blocks; ++b) {
      uint8_t* at = out + b * kTaskBlock<false> + half * 8 * 64;
      for (int part = 0; part < 2; ++part)
        transposed_rows(base + b * kBlock + part * 16, k, rows, true, at + part * 4 * 64);
    }
  }
}

// fn.template operator()<C>() for the C in 1..kTile that equals c
template <typename Fn>
void with_tile(int c, Fn&& fn) {
  switch (c) {
    case 1: fn.template operator()<1>(); break;
    case 2: fn.template operator()<2>(); break;
    case 3: fn.template operator()<3>(); break;
    default: fn.template operator()<4>(); break;
  }
}

#if CHATPAGE_Q8 == 512

inline __m512 widen_bf16(const uint8_t* p) {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

// The 16-lane unsigned operands of a task's block, half h, vector pair j: int4's nibbles (through
// the table when the matrix has one), int8's bytes as laid out; and int4's scale and offset
// (zero - c * scale, c = 8, or 128 with a table) of that half.
template <bool Int4>
struct Operands {
  __m512i mask = _mm512_set1_epi8(0x0F);
  __m512i table{};  // levels + 128, in each 128-bit lane
  __m512 c = _mm512_set1_ps(8.f);
  bool own = false;
  inline void pair(const uint8_t* block, int h, int j, __m512i& lo, __m512i& hi) const {
    const uint8_t* w = block + h * kVectors<Int4> * 64;
    if constexpr (Int4) {
      const __m512i v = _mm512_loadu_si512(w + j * 64);
      lo = _mm512_and_si512(v, mask);
      hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
      if (own) {
        lo = _mm512_shuffle_epi8(table, lo);
        hi = _mm512_shuffle_epi8(table, hi);
      }
    } else {
      lo = _mm512_loadu_si512(w + j * 64);
      hi = _mm512_loadu_si512(w + (j + 4) * 64);
    }
  }
  inline void scale_offset(const uint8_t* block, int h, __m512& scale, __m512& offset) const {
    scale = widen_bf16(block + kScalesAt + h * 32);
    offset = _mm512_fnmadd_ps(c, scale, widen_bf16(block + kZerosAt + h * 32));
  }
};

// acc + one block's int32 sums of an activation row with 16 weight rows, in fp32: times the
// block's d (int4: and the rows' scale), plus d * S times int4's offsets. The VNNI tiles and the
// AMX ones (amx_task_product) both add their blocks through it, so they give the same bits.
template <bool Int4>
inline __m512 add_block(__m512 acc, __m512i sums, float d, float ds, __m512 scale, __m512 offset) {
  const __m512 f = _mm512_cvtepi32_ps(sums), dv = _mm512_set1_ps(d);
  if constexpr (!Int4) return _mm512_fmadd_ps(f, dv, acc);
  acc = _mm512_fmadd_ps(f, _mm512_mul_ps(scale, dv), acc);
  return _mm512_fmadd_ps(offset, _mm512_set1_ps(ds), acc);
}

// Activation rows [t0, t0 + T) against one task's laid-out 32 rows: acc[t][h] = the fp32 sums of
// row t with rows h * 16 + lane, before the row scale (int8) and the bias.
template <bool Int4, int T>
inline void tile(const Q8Rows& a, int64_t t0, const uint8_t* task, const Operands<Int4>& ops,
                 __m512 (&acc)[T][2]) {
  for (int t = 0; t < T; ++t) acc[t][0] = acc[t][1] = _mm512_setzero_ps();
  const int64_t nb = a.row_blocks();
  for (int64_t ab = 0; ab < nb; ++ab) {
    const int64_t b = ab % a.blocks;  // the weights' block of activation block ab
    const uint8_t* block = task + b * kTaskBlock<Int4>;
    __m512i sums[T][2];
    for (int t = 0; t < T; ++t) sums[t][0] = sums[t][1] = _mm512_setzero_si512();
    const int8_t* qa = a.qa + (t0 * nb + ab) * kBlock;
    for (int j = 0; j < 4; ++j) {
      __m512i lo[2], hi[2];
      for (int h = 0; h < 2; ++h) ops.pair(block, h, j, lo[h], hi[h]);
      for (int t = 0; t < T; ++t) {
        const int8_t* row = qa + t * nb * kBlock;
        int32_t first, second;
        std::memcpy(&first, row + 4 * j, 4);
        std::memcpy(&second, row + 16 + 4 * j, 4);
        const __m512i x0 = _mm512_set1_epi32(first), x1 = _mm512_set1_epi32(second);
        for (int h = 0; h < 2; ++h) {
          sums[t][h] = _mm512_dpbusd_epi32(sums[t][h], lo[h], x0);
          sums[t][h] = _mm512_dpbusd_epi32(sums[t][h], hi[h], x1);
        }
      }
    }
    __m512 scale[2] = {}, offset[2] = {};
    if constexpr (Int4) {
      for (int h = 0; h < 2; ++h) ops.scale_offset(block, h, scale[h], offset[h]);
    }
    for (int t = 0; t < T; ++t) {
      const int64_t at = (t0 + t) * nb + ab;
      for (int h = 0; h < 2; ++h)
        acc[t][h] = add_block<Int4>(acc[t][h], sums[t][h], a.d[at], a.ds[at], scale[h], offset[h]);
    }
  }
}

inline void store16(const Output& out, int64_t at, __m512 y, __mmask16 mask) {
  if (out.f32) _mm512_mask_storeu_ps(out.f32 + at, mask, y);
  else _mm256_mask_storeu_epi16(out.bf16 + at, mask, (__m256i)_mm512_cvtneps_pbh(y));
}

// Activation rows [0, m) of the slice against one task's laid-out rows (columns n0.., `valid` of
// them), stored at rows m0..: y = sums * scale + offset (int8: the sums less the + 128 of the
// weights, 128 * the sum of the row's blocks' d * S).
template <bool Int4>
inline void finish_row(const Output& dst, __m512 y, int h, float sum_ds, const float* scale,
                       const float* offset, int64_t at, int valid) {
  if constexpr (!Int4) y = _mm512_sub_ps(y, _mm512_set1_ps(128.f * sum_ds));
  y = _mm512_fmadd_ps(y, _mm512_load_ps(scale + h * kLanes), _mm512_load_ps(offset + h * kLanes));
  store16(dst, at + h * kLanes, y, lanes_below(valid - h * kLanes));
}

template <bool Int4>
void task_product(const Q8Rows& a, int64_t m0, int64_t m, int64_t n, int64_t n0, int valid,
                  const uint8_t* laid, const Operands<Int4>& ops, const float* scale,
                  const float* offset, const float* sum_ds, const Output& dst) {
  for (int64_t t0 = 0; t0 < m; t0 += kTile) {
    with_tile(static_cast<int>(std::min<int64_t>(kTile, m - t0)), [&]<int T>() {
      __m512 acc[T][2];
      tile<Int4, T>(a, t0, laid, ops, acc);
      for (int t = 0; t < T; ++t)
        for (int h = 0; h < 2; ++h)
          finish_row<Int4>(dst, acc[t][h], h, sum_ds[t0 + t], scale, offset,
                           (m0 + t0 + t) * n + n0, valid);
    });
  }
}

#if CHATPAGE_Q8_AMX
// The same product on AMX's tiles (Sapphire Rapids on): tdpbsud multiplies a tile of 16
// activation rows x 64 signed bytes by one of 16 rows of unsigned bytes x 4 inputs into 16 x 16
// int32 sums, 16 times the multiply-adds of a vpdpbusd. A block's 32 inputs fill half a tile row
// (the scales are per block of 32, so every block's sums are taken out of the tiles and scaled on
// their own): A is 16 rows of the quantized activations as they lie (a row's blocks are its
// `nb` * 32 bytes), B a half of the task's block, whose layout is already B's (row j: the 16
// weight rows' inputs 4j..4j+3; int4's nibbles are spread to bytes first, once per task). The
// int32 sums are the VNNI tiles' exactly, and they are scaled by add_block in the same order, so
// both paths give the same bits and a row's result does not depend on which one the call's row
// count picks. 32 activation rows at a time: each block's four products (two activation tiles
// by the two weight halves) are issued together, then stored and scaled.
constexpr int64_t kAmxFrom = 16;  // activation rows from which a call takes the tiles
constexpr int64_t kHalfBlock = kBlock / 4 * 64;  // bytes of a B tile: 8 rows of 64

// Tiles 0-3: sums (activation tile i, weight half h: tile 2 i + h); 4-5: two activation tiles
// (16 rows x 32 inputs); 6-7: the two weight halves (8 rows of 16 weight rows x 4 inputs).
void configure_q8_tiles() {
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.colsb[t] = 64;
    config.rows[t] = 16;
  }
  config.colsb[4] = config.colsb[5] = kBlock;
  config.rows[6] = config.rows[7] = kBlock / 4;
  load_tile_config(config);
}

// Activation rows [0, m) of the slice (its qa padded with zero rows to a multiple of 16) against
// one task's laid-out rows: task_product's result. spread: room for the task's int4 weights as
// bytes (blocks x 2 halves of kHalfBlock).
template <bool Int4>
void amx_task_product(const Q8Rows& a, int64_t m0, int64_t m, int64_t n, int64_t n0, int valid,
                      const uint8_t* laid, const Operands<Int4>& ops, const float* scale,
                      const float* offset, const float* sum_ds, const Output& dst,
                      uint8_t* spread) {
  const int64_t nb = a.row_blocks(), stride = nb * kBlock;
  if constexpr (Int4) {
    for (int64_t b = 0; b < a.blocks; ++b)
      for (int h = 0; h < 2; ++h)
        for (int j = 0; j < 4; ++j) {
          __m512i lo, hi;
          ops.pair(laid + b * kTaskBlock<Int4>, h, j, lo, hi);
          uint8_t* at = spread + (2 * b + h) * kHalfBlock;
          _mm512_store_si512(at + j * 64, lo);
          _mm512_store_si512(at + (4 + j) * 64, hi);
        }
  }
  alignas(64) int32_t sums[4][16][16];
  __m512 acc[32][2];
  for (int64_t t0 = 0; t0 < m; t0 += 32) {
    const int rows = static_cast<int>(std::min<int64_t>(32, m - t0));
    const bool two = rows > 16;
    for (int t = 0; t < rows; ++t) acc[t][0] = acc[t][1] = _mm512_setzero_ps();
    for (int64_t ab = 0; ab < nb; ++ab) {
      const int64_t b = ab % a.blocks;
      const uint8_t* block = laid + b * kTaskBlock<Int4>;
      const uint8_t* w = Int4 ? spread + 2 * b * kHalfBlock : block;
      const int8_t* x = a.qa + (t0 * nb + ab) * kBlock;
      _tile_loadd(6, w, 64);
      _tile_loadd(7, w + kHalfBlock, 64);
      _tile_loadd(4, x, stride);
      _tile_zero(0);
      _tile_zero(1);
      _tile_dpbsud(0, 4, 6);
      _tile_dpbsud(1, 4, 7);
      if (two) {
        _tile_loadd(5, x + 16 * stride, stride);
        _tile_zero(2);
        _tile_zero(3);
        _tile_dpbsud(2, 5, 6);
        _tile_dpbsud(3, 5, 7);
      }
      _tile_stored(0, sums[0], 64);
      _tile_stored(1, sums[1], 64);
      if (two) {
        _tile_stored(2, sums[2], 64);
        _tile_stored(3, sums[3], 64);
      }
      __m512 sc[2] = {}, off[2] = {};
      if constexpr (Int4) {
        for (int h = 0; h < 2; ++h) ops.scale_offset(block, h, sc[h], off[h]);
      }
      for (int t = 0; t < rows; ++t) {
        const int64_t at = (t0 + t) * nb + ab;
        for (int h = 0; h < 2; ++h) {
          const __m512i s = _mm512_load_si512(sums[2 * (t / 16) + h][t % 16]);
          acc[t][h] = add_block<Int4>(acc[t][h], s, a.d[at], a.ds[at], sc[h], off[h]);
        }
      }
    }
    for (int t = 0; t < rows; ++t)
      for (int h = 0; h < 2; ++h)
        finish_row<Int4>(dst, acc[t][h], h, sum_ds[t0 + t], scale, offset,
                         (m0 + t0 + t) * n + n0, valid);
  }
}
#endif

Operands<true> int4_operands(const c10::optional<at::Tensor>& levels) {
  Operands<true> ops;
  int8_t table_bytes[16];
  ops.own = int4_levels(levels, table_bytes);
  alignas(16) uint8_t shifted[16];
  for (int i = 0; i < 16; ++i) shifted[i] = static_cast<uint8_t>(table_bytes[i] + 128);
  ops.table = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(shifted)));
  ops.c = _mm512_set1_ps(ops.own ? 128.f : 8.f);
  return ops;
}

#else  // AVX2

inline __m256 widen_bf16(const uint8_t* p) {
  const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}

// The operands of a task's block for one quarter q of its rows (8q..8q+7: the first or second 32
// bytes of half q / 2's vectors), vector pair j: int4's nibbles (0..15: maddubs' unsigned operand
// as they are), or the signed bytes of a table's levels or of int8 weights (as laid out, less
// 128), which maddubs takes through the sign trick (see tile); and int4's scale and offset (zero -
// c * scale: c = 8, or 0 with a table, whose levels are multiplied as they are).
template <bool Int4>
struct Operands {
  __m256i mask = _mm256_set1_epi8(0x0F);
  __m256i table{};  // the matrix's own levels, in each 128-bit lane
  __m256 c = _mm256_set1_ps(8.f);
  bool own = false;
  bool signed_weights() const { return !Int4 || own; }
  inline void pair(const uint8_t* block, int q, int j, __m256i& lo, __m256i& hi) const {
    const uint8_t* w = block + (q / 2) * kVectors<Int4> * 64 + (q % 2) * 32;
    if constexpr (Int4) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + j * 64));
      lo = _mm256_and_si256(v, mask);
      hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
      if (own) {
        lo = _mm256_shuffle_epi8(table, lo);
        hi = _mm256_shuffle_epi8(table, hi);
      }
    } else {
      const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
      lo = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + j * 64)), flip);
      hi = _mm256_xor_si256(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + (j + 4) * 64)), flip);
    }
  }
  inline void scale_offset(const uint8_t* block, int q, __m256& scale, __m256& offset) const {
    scale = widen_bf16(block + kScalesAt + q * 16);
    offset = _mm256_fnmadd_ps(c, scale, widen_bf16(block + kZerosAt + q * 16));
  }
};

inline __m256i broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// Activation rows [t0, t0 + T) against quarter q of one task's laid-out rows: acc[t] = the fp32
// sums of row t with rows 8q + lane, before the row scale (int8) and the bias. maddubs multiplies
// unsigned by signed bytes into saturating int16 pairs: int4's nibbles times the levels (<= 2 * 15
// * 127 a pair) sum in int16 over a whole block (<= 16 * 15 * 127 < 2^15) and are widened once by
// madd; signed weights go in as |w| (<= 128) against the activations with w's sign (<= 127), <=
// 32512 a pair, each pair widened at once.
template <bool Int4, bool Signed, int T>
inline void tile(const Q8Rows& a, int64_t t0, const uint8_t* task, int q,
                 const Operands<Int4>& ops, __m256 (&acc)[T]) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  const int64_t nb = a.row_blocks();
  for (int64_t ab = 0; ab < nb; ++ab) {
    const uint8_t* block = task + (ab % a.blocks) * kTaskBlock<Int4>;
    const int8_t* qa = a.qa + (t0 * nb + ab) * kBlock;
    __m256i sums[T];
    for (int t = 0; t < T; ++t) sums[t] = _mm256_setzero_si256();
    for (int j = 0; j < 4; ++j) {
      __m256i lo, hi;
      ops.pair(block, q, j, lo, hi);
      if constexpr (Signed) {
        const __m256i abs_lo = _mm256_abs_epi8(lo), abs_hi = _mm256_abs_epi8(hi);
        for (int t = 0; t < T; ++t) {
          const int8_t* row = qa + t * nb * kBlock;
          const __m256i x0 = _mm256_sign_epi8(broadcast4(row + 4 * j), lo);
          const __m256i x1 = _mm256_sign_epi8(broadcast4(row + 16 + 4 * j), hi);
          const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(abs_lo, x0), ones);
          const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(abs_hi, x1), ones);
          sums[t] = _mm256_add_epi32(sums[t], _mm256_add_epi32(p0, p1));
        }
      } else {
        for (int t = 0; t < T; ++t) {
          const int8_t* row = qa + t * nb * kBlock;
          const __m256i p0 = _mm256_maddubs_epi16(lo, broadcast4(row + 4 * j));
          const __m256i p1 = _mm256_maddubs_epi16(hi, broadcast4(row + 16 + 4 * j));
          sums[t] = _mm256_add_epi16(sums[t], _mm256_add_epi16(p0, p1));
        }
      }
    }
    if constexpr (!Signed) {
      for (int t = 0; t < T; ++t) sums[t] = _mm256_madd_epi16(sums[t], ones);
    }
    __m256 scale, offset;
    if constexpr (Int4) ops.scale_offset(block, q, scale, offset);
    for (int t = 0; t < T; ++t) {
      const int64_t at = (t0 + t) * nb + ab;
      const __m256 d = _mm256_set1_ps(a.d[at]);
      const __m256 f = _mm256_cvtepi32_ps(sums[t]);
      if constexpr (Int4) {
        acc[t] = _mm256_fmadd_ps(f, _mm256_mul_ps(scale, d), acc[t]);
        acc[t] = _mm256_fmadd_ps(offset, _mm256_set1_ps(a.ds[at]), acc[t]);
      } else {
        acc[t] = _mm256_fmadd_ps(f, d, acc[t]);
      }
    }
  }
}

// The first `count` (at most 8) lanes of y at out's element `at`.
inline void store_lanes8(const Output& out, int64_t at, __m256 y, int count) {
  if (out.f32 && count >= 8) return _mm256_storeu_ps(out.f32 + at, y);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, y);
  for (int i = 0; i < std::min(count, 8); ++i) {
    if (out.f32) out.f32[at + i] = lanes[i];
    else out.bf16[at + i] = static_cast<c10::BFloat16>(lanes[i]);
  }
}

// Activation rows [0, m) of the slice against one task's laid-out rows (columns n0.., `valid` of
// them), a quarter of 8 rows at a time, stored at rows m0..: y = sums * scale + offset (the
// weights were taken signed: no + 128 to take back).
template <bool Int4>
void task_product(const Q8Rows& a, int64_t m0, int64_t m, int64_t n, int64_t n0, int valid,
                  const uint8_t* laid, const Operands<Int4>& ops, const float* scale,
                  const float* offset, const float*, const Output& dst) {
  for (int q = 0; q * 8 < valid; ++q) {
    for (int64_t t0 = 0; t0 < m; t0 += kTile) {
      with_tile(static_cast<int>(std::min<int64_t>(kTile, m - t0)), [&]<int T>() {
        __m256 acc[T];
        if (ops.signed_weights()) tile<Int4, true, T>(a, t0, laid, q, ops, acc);
        else tile<Int4, false, T>(a, t0, laid, q, ops, acc);
        for (int t = 0; t < T; ++t) {
          const __m256 y = _mm256_fmadd_ps(acc[t], _mm256_load_ps(scale + q * 8),
                                           _mm256_load_ps(offset + q * 8));
          store_lanes8(dst, (m0 + t0 + t) * n + n0 + q * 8, y, valid - q * 8);
        }
      });
    }
  }
}

Operands<true> int4_operands(const c10::optional<at::Tensor>& levels) {
  Operands<true> ops;
  alignas(16) int8_t table_bytes[16];
  ops.own = int4_levels(levels, table_bytes);
  ops.table = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(table_bytes)));
  ops.c = _mm256_set1_ps(ops.own ? 0.f : 8.f);
  return ops;
}

#endif

// y = x @ W.T (* row scale) + bias for x's rows [m0, m0 + m) (quantized in `a`), every output row;
// task_at(task, buffer) is one task's layout (a pack's, or laid out into the 64-byte aligned
// buffer of kTaskBlock<Int4> * blocks bytes that each thread has where `lays_out`); scale(row)
// the int8 row scale.
template <bool Int4, typename TaskAt, typename RowScale>
void q8_rows(const Q8Rows& a, int64_t m0, int64_t m, int64_t n, const float* bias,
             const Output& dst, const Operands<Int4>& ops, const TaskAt& task_at,
             bool lays_out, const RowScale& row_scale, const float* sum_ds) {
  const int64_t tasks = (n + kRowsPerTask - 1) / kRowsPerTask;
  const int64_t k = a.blocks * kBlock;
  const int64_t grain = std::max<int64_t>(1, kTaskMacs / std::max<int64_t>(1, kRowsPerTask * k * m));
  struct alignas(64) Line {
    uint8_t bytes[64];
  };
#if CHATPAGE_Q8_AMX
  const bool tiles = m >= kAmxFrom && gemm_amx();
#endif
  at::parallel_for(0, tasks, grain, [&](int64_t first, int64_t last) {
    std::vector<Line> buffer(lays_out ? a.blocks * kTaskBlock<Int4> / 64 : 0);
#if CHATPAGE_Q8_AMX
    std::vector<Line> spread(tiles && Int4 ? a.blocks * 2 * kHalfBlock / 64 : 0);
    if (tiles) configure_q8_tiles();
#endif
    for (int64_t task = first; task < last; ++task) {
      const int64_t n0 = task * kRowsPerTask;
      const int valid = static_cast<int>(std::min<int64_t>(kRowsPerTask, n - n0));
      const uint8_t* laid = task_at(task, reinterpret_cast<uint8_t*>(buffer.data()));
      alignas(64) float scale[kRowsPerTask], offset[kRowsPerTask];
      for (int r = 0; r < kRowsPerTask; ++r) {
        scale[r] = r < valid ? row_scale(n0 + r) : 0.f;
        offset[r] = r < valid && bias ? bias[n0 + r] : 0.f;
      }
#if CHATPAGE_Q8_AMX
      if (tiles) {
        amx_task_product<Int4>(a, m0, m, n, n0, valid, laid, ops, scale, offset, sum_ds, dst,
                               reinterpret_cast<uint8_t*>(spread.data()));
        continue;
      }
#endif
      task_product<Int4>(a, m0, m, n, n0, valid, laid, ops, scale, offset, sum_ds, dst);
    }
#if CHATPAGE_Q8_AMX
    if (tiles) _tile_release();
#endif
  });
}

// Quantizes x's rows a slice at a time (in `passes` passes) and runs each slice against every
// weight row.
template <bool Int4, typename TaskAt, typename RowScale>
at::Tensor q8_gemm(const at::Tensor& x_in, int64_t n, int64_t k, int passes,
                   const c10::optional<at::Tensor>& bias, const Operands<Int4>& ops,
                   const TaskAt& task_at, bool lays_out, const RowScale& row_scale) {
  const at::Tensor x = x_in.contiguous();
  const int64_t m = x.size(0), blocks = (k + kBlock - 1) / kBlock, nb = blocks * passes;
  at::Tensor out = output_for(x, n), bias_f;
  const float* b = bias_data(bias, bias_f);
  const Output dst = output_of(out);
  const int64_t slice = std::min(m, kSlice);
  // AMX's tiles read 16 rows at a time: the rows up to the next multiple of 16 are read too (and
  // their sums left out), so they are there and zero
  const int64_t padded = (slice + 15) / 16 * 16;
  const at::Tensor qa = at::empty({padded, nb * kBlock}, x.options().dtype(at::kChar));
  std::memset(qa.data_ptr<int8_t>() + slice * nb * kBlock, 0, (padded - slice) * nb * kBlock);
  const at::Tensor scales = at::empty({2 * slice * nb + slice}, x.options().dtype(at::kFloat));
  float* d = scales.data_ptr<float>();
  float* ds = d + slice * nb;
  float* sum_ds = ds + slice * nb;  // per row: the sum over its blocks of d * S
  const Q8Rows a{qa.data_ptr<int8_t>(), d, ds, blocks, passes};
  for (int64_t m0 = 0; m0 < m; m0 += kSlice) {
    const int64_t rows = std::min(kSlice, m - m0);
    // rows quantized by every thread (one thread alone took ~4% of a prefill-heavy run)
    at::parallel_for(0, rows, kQuantizeGrain, [&](int64_t first, int64_t last) {
      const int64_t at = (m0 + first) * k;
      int8_t* q = qa.data_ptr<int8_t>() + first * nb * kBlock;
      if (x.scalar_type() == at::kFloat)
        quantize_rows(x.data_ptr<float>() + at, last - first, k, a, q, d + first * nb,
                      ds + first * nb);
      else
        quantize_rows(x.data_ptr<c10::BFloat16>() + at, last - first, k, a, q, d + first * nb,
                      ds + first * nb);
      for (int64_t t = first; t < last; ++t) {
        float sum = 0.f;
        for (int64_t g = 0; g < nb; ++g) sum += ds[t * nb + g];
        sum_ds[t] = sum;
      }
    });
    q8_rows<Int4>(a, m0, rows, n, b, dst, ops, task_at, lays_out, row_scale, sum_ds);
  }
  return out;
}

// An int8 matrix's rows as whole blocks of 32 (zero weights past K: the padded activations are
// zero there too); the layout reads 16 bytes at a time.
at::Tensor whole_blocks(const at::Tensor& qweight) {
  const int64_t k = qweight.size(1), blocks = (k + kBlock - 1) / kBlock;
  return k % kBlock ? at::constant_pad_nd(qweight, {0, blocks * kBlock - k}) : qweight;
}

// A pack's task `task` (kTaskBlock<Int4> * blocks bytes each; a thread's tasks are one run of
// consecutive bytes, which the hardware's prefetch follows)
template <bool Int4>
auto packed_tasks(const at::Tensor& pack, int64_t blocks) {
  const uint8_t* base = pack.data_ptr<uint8_t>();
  const int64_t bytes = blocks * kTaskBlock<Int4>;
  return [=](int64_t task, uint8_t*) { return base + task * bytes; };
}

}  // namespace
#endif

bool gemm_q8() {
#if defined(CHATPAGE_Q8)
  return true;
#else
  return false;
#endif
}

at::Tensor gemm_q8_int8(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scales,
                        const c10::optional<at::Tensor>& bias) {
  check_gemv_args(x, qweight, qweight.size(1), bias, "gemm_q8_int8");
  check_int8_args(qweight, scales, "gemm_q8_int8");
#if defined(CHATPAGE_Q8)
  const int64_t n = qweight.size(0), k = qweight.size(1), blocks = (k + kBlock - 1) / kBlock;
  const at::Tensor whole = whole_blocks(qweight);
  const int8_t* q = whole.data_ptr<int8_t>();
  const c10::BFloat16* s = scales.data_ptr<c10::BFloat16>();
  return q8_gemm<false>(
      x, n, k, kInt8Passes, bias, Operands<false>{},
      [=](int64_t task, uint8_t* buffer) {
        const int64_t n0 = task * kRowsPerTask;
        lay_out_int8(q, blocks, n0, static_cast<int>(std::min<int64_t>(kRowsPerTask, n - n0)),
                     buffer);
        return const_cast<const uint8_t*>(buffer);
      },
      true, [s](int64_t row) { return static_cast<float>(s[row]); });
#else
  TORCH_CHECK(false, "chatpage::gemm_q8_int8: this build has no q8 GEMMs (no AVX2: see gemm_q8())");
#endif
}

at::Tensor gemm_q8_int4(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scales,
                        const at::Tensor& zeros, const c10::optional<at::Tensor>& levels,
                        const c10::optional<at::Tensor>& bias) {
  const int64_t k = q.size(1) * 2;
  check_gemv_args(x, q, k, bias, "gemm_q8_int4");
  check_int4_args(q, scales, zeros, levels, 32, "gemm_q8_int4");
#if defined(CHATPAGE_Q8)
  const int64_t n = q.size(0);
  const uint8_t* qp = q.data_ptr<uint8_t>();
  const c10::BFloat16* sp = scales.data_ptr<c10::BFloat16>();
  const c10::BFloat16* zp = zeros.data_ptr<c10::BFloat16>();
  return q8_gemm<true>(
      x, n, k, 1, bias, int4_operands(levels),
      [=](int64_t task, uint8_t* buffer) {
        const int64_t n0 = task * kRowsPerTask;
        lay_out_int4(qp, sp, zp, k, n0, static_cast<int>(std::min<int64_t>(kRowsPerTask, n - n0)),
                     buffer);
        return const_cast<const uint8_t*>(buffer);
      },
      true, [](int64_t) { return 1.f; });
#else
  TORCH_CHECK(false, "chatpage::gemm_q8_int4: this build has no q8 GEMMs (no AVX2: see gemm_q8())");
#endif
}

// The packs: every task's layout made once (a matrix of whole tasks: N a multiple of 32), as
// uint8 [N, blocks * 20] (int4: per row and block 16 bytes of nibbles and a bf16 scale and zero)
// or [N, blocks * 32] (int8); the same bytes as the unpacked weights, in the kernels' order.
namespace {
void check_whole_tasks(int64_t n, const char* op) {
  TORCH_CHECK(n % 32 == 0, "chatpage::", op, ": the matrix has ", n,
              " rows; a pack takes a multiple of 32 (use the unpacked q8 GEMM)");
}
}  // namespace

at::Tensor q8_pack_int4(const at::Tensor& q, const at::Tensor& scales, const at::Tensor& zeros) {
  check_int4_args(q, scales, zeros, c10::nullopt, 32, "q8_pack_int4");
  TORCH_CHECK(q.dim() == 2 && q.is_contiguous() && q.device().is_cpu(),
              "chatpage::q8_pack_int4: q must be a contiguous 2-d tensor on the CPU");
  const int64_t n = q.size(0), k = q.size(1) * 2, blocks = k / 32;
  check_whole_tasks(n, "q8_pack_int4");
  at::Tensor pack = at::empty({n, blocks * 20}, q.options());
#if defined(CHATPAGE_Q8)
  const uint8_t* qp = q.data_ptr<uint8_t>();
  const c10::BFloat16* sp = scales.data_ptr<c10::BFloat16>();
  const c10::BFloat16* zp = zeros.data_ptr<c10::BFloat16>();
  uint8_t* out = pack.data_ptr<uint8_t>();
  at::parallel_for(0, n / kRowsPerTask, 1, [&](int64_t first, int64_t last) {
    for (int64_t task = first; task < last; ++task)
      lay_out_int4(qp, sp, zp, k, task * kRowsPerTask, kRowsPerTask,
                   out + task * blocks * kTaskBlock<true>);
  });
  return pack;
#else
  TORCH_CHECK(false, "chatpage::q8_pack_int4: this build has no q8 GEMMs (no AVX2: see gemm_q8())");
#endif
}

at::Tensor q8_pack_int8(const at::Tensor& qweight) {
  TORCH_CHECK(qweight.dim() == 2 && qweight.is_contiguous() && qweight.device().is_cpu() &&
                  qweight.scalar_type() == at::kChar,
              "chatpage::q8_pack_int8: qweight must be a contiguous 2-d int8 tensor on the CPU");
  const int64_t n = qweight.size(0), blocks = (qweight.size(1) + 31) / 32;
  check_whole_tasks(n, "q8_pack_int8");
  at::Tensor pack = at::empty({n, blocks * 32}, qweight.options().dtype(at::kByte));
#if defined(CHATPAGE_Q8)
  const at::Tensor whole = whole_blocks(qweight);
  const int8_t* q = whole.data_ptr<int8_t>();
  uint8_t* out = pack.data_ptr<uint8_t>();
  at::parallel_for(0, n / kRowsPerTask, 1, [&](int64_t first, int64_t last) {
    for (int64_t task = first; task < last; ++task)
      lay_out_int8(q, blocks, task * kRowsPerTask, kRowsPerTask,
                   out + task * blocks * kTaskBlock<false>);
  });
  return pack;
#else
  TORCH_CHECK(false, "chatpage::q8_pack_int8: this build has no q8 GEMMs (no AVX2: see gemm_q8())");
#endif
}

at::Tensor gemm_q8_int8_packed(const at::Tensor& x, const at::Tensor& pack,
                               const at::Tensor& scales, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(pack.scalar_type() == at::kByte && pack.dim() == 2 && pack.size(1) % 32 == 0,
              "chatpage::gemm_q8_int8_packed: pack must be q8_pack_int8's uint8 [N, blocks * 32]");
  const int64_t n = pack.size(0), blocks = pack.size(1) / 32, k = x.size(1);
  check_gemv_args(x, pack, k, bias, "gemm_q8_int8_packed");
  TORCH_CHECK((k + 31) / 32 == blocks, "chatpage::gemm_q8_int8_packed: x has ", k,
              " inputs, the pack ", blocks, " blocks of 32");
  TORCH_CHECK(scales.scalar_type() == at::kBFloat16 && scales.is_contiguous() &&
                  scales.numel() == n,
              "chatpage::gemm_q8_int8_packed: scales must be bfloat16 with one value per row");
  check_whole_tasks(n, "gemm_q8_int8_packed");
#if defined(CHATPAGE_Q8)
  const c10::BFloat16* s = scales.data_ptr<c10::BFloat16>();
  return q8_gemm<false>(x, n, k, kInt8Passes, bias, Operands<false>{},
                        packed_tasks<false>(pack, blocks), false,
                        [s](int64_t row) { return static_cast<float>(s[row]); });
#else
  TORCH_CHECK(false, "chatpage::gemm_q8_int8_packed: this build has no q8 GEMMs (no AVX2)");
#endif
}

at::Tensor gemm_q8_int4_packed(const at::Tensor& x, const at::Tensor& pack,
                               const c10::optional<at::Tensor>& levels,
                               const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(pack.scalar_type() == at::kByte && pack.dim() == 2 && pack.size(1) % 20 == 0,
              "chatpage::gemm_q8_int4_packed: pack must be q8_pack_int4's uint8 [N, blocks * 20]");
  const int64_t n = pack.size(0), blocks = pack.size(1) / 20, k = blocks * 32;
  check_gemv_args(x, pack, k, bias, "gemm_q8_int4_packed");
  TORCH_CHECK(!levels.has_value() || (levels->scalar_type() == at::kChar &&
                                      levels->is_contiguous() && levels->numel() == 16),
              "chatpage::gemm_q8_int4_packed: levels must be 16 contiguous int8 values");
  check_whole_tasks(n, "gemm_q8_int4_packed");
#if defined(CHATPAGE_Q8)
  return q8_gemm<true>(x, n, k, 1, bias, int4_operands(levels), packed_tasks<true>(pack, blocks),
                       false, [](int64_t) { return 1.f; });
#else
  TORCH_CHECK(false, "chatpage::gemm_q8_int4_packed: this build has no q8 GEMMs (no AVX2)");
#endif
}

}  // namespace chatpage::cpu
