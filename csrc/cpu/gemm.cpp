// Matmuls of many activation rows (a batch's decode rows, a prefill chunk) against bf16, int8 and
// int4 weights: y [M, N] = x [M, K] @ W.T, in fp32.
//
// Past a few rows a matmul is bound by multiply-adds, not by reading the weights, and torch's
// quantized CPU kernels fall far behind a plain fp32 GEMM there (chatpage/engine/model/weights.py has
// the numbers). Here each task takes a block of R weight rows, decodes it once into fp32 in a
// buffer that stays in L1 (R K floats: 14 KB for K = 576 at R = 6), and runs every activation row
// against it, T rows at a time: a T x R tile of dot products over K in registers, T + R vector
// loads for T R fused multiply-adds, the sums folded into one vector per activation row at the
// end. So the weights are read and decoded once per call (per 64 activation rows: more would
// push the activations out of L2), and the FMA units do the rest; a long K runs in chunks of 768
// so that a chunk of the block and of a tile stay in L1 together. Blocks of weight rows are
// split among threads with at::parallel_for.
//
// The layouts are the GEMVs' (csrc/cpu/gemv.cpp; chatpage/engine/model/gemv.py's reference_* functions
// are the specification of both): bf16 [N, K]; int8 [N, K] with one bf16 scale per row, applied
// to the finished sums; int4 q [N, K/2] uint8 in groups of 32 inputs (byte j holds input j in its
// low nibble, j + 16 in its high one), w = (q - 8) * scale + zero, or levels[q] * scale + zero for
// a matrix with 16 int8 levels of its own (looked up with vpermps, or vec.h's pshufb), whose
// activations are rounded to bf16 first as the reference does. The vectors are AVX-512's 16
// lanes where the build has AVX-512F, else vec.h's eight (AVX2 + FMA, or portable loops).
#include "checks.h"
#include "cpu/amx.h"
#include "cpu/matmul.h"
#include "cpu/ops_cpu.h"
#include "cpu/vec.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#if defined(__AMX_TILE__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace chatpage::cpu {
namespace {

constexpr int kGroup = 32;                  // int4 inputs per scale/zero pair
constexpr int64_t kTaskMacs = 1 << 18;      // multiply-adds below which a task is not split
constexpr int64_t kChunk = 768;             // inputs per pass over a decoded block
constexpr int64_t kMaxRows = 64;            // activation rows per pass over the weights

#if defined(__AVX512F__)
// 16 fp32 lanes; a tile of 4 activation rows by 6 weight rows keeps 24 accumulators, the 4
// activation vectors and one of weights in the 32 registers (with 3 x 8 the compiler reads each
// weight vector three times from memory instead, and the loads become the bottleneck).
struct Lanes {
  using V = __m512;
  static constexpr int kWidth = 16, kTile = 4;
  static V zero() { return _mm512_setzero_ps(); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static Vec8 fold(V a) {
    const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
    return {_mm256_add_ps(_mm512_castps512_ps256(a), hi)};
  }
};
#else
// vec.h's eight lanes; 2 x 6 accumulators, 2 activation vectors and one of weights fit AVX2's 16
// registers.
struct Lanes {
  using V = Vec8;
  static constexpr int kWidth = 8, kTile = 2;
  static V zero() { return zero8(); }
  static V load(const float* p) { return load8(p); }
  static V fma(V a, V b, V c) { return fma8(a, b, c); }
  static Vec8 fold(V a) { return a; }
};
#endif

constexpr int kWidth = Lanes::kWidth;
constexpr int kRows = 6;  // weight rows per block (at most 8: their sums fold into one Vec8)

// fn.template operator()<C>() for the C in 1..Max that equals c
template <int Max, typename Fn>
void with_count(int c, Fn&& fn) {
  [&]<int... I>(std::integer_sequence<int, I...>) {
    ((c == I + 1 ? fn.template operator()<I + 1>() : void()), ...);
  }(std::make_integer_sequence<int, Max>{});
}

// Lane r of sums[t] = sum over i < len of x[t * stride + i] * w[r * stride + i] for r < R, zero
// beyond (len a multiple of kWidth)
template <int T, int R>
void tile_dots(const float* x, const float* w, int64_t stride, int64_t len, Vec8 (&sums)[T]) {
  using V = Lanes::V;
  V acc[T][R];
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r) acc[t][r] = Lanes::zero();
  for (int64_t i = 0; i < len; i += kWidth) {
    V xv[T];
    for (int t = 0; t < T; ++t) xv[t] = Lanes::load(x + t * stride + i);
    for (int r = 0; r < R; ++r) {
      const V wv = Lanes::load(w + r * stride + i);
      for (int t = 0; t < T; ++t) acc[t][r] = Lanes::fma(wv, xv[t], acc[t][r]);
    }
  }
  for (int t = 0; t < T; ++t) {
    Vec8 folded[8];
    for (int r = 0; r < 8; ++r) folded[r] = r < R ? Lanes::fold(acc[t][r]) : zero8();
    sums[t] = transpose_sum8(folded);
  }
}

// Writes the first `count` lanes of y to p (fp32, or rounded to bf16 as torch rounds).
void store_row(float* p, Vec8 y, int count) {
  alignas(32) float lanes[8];
  store8(lanes, y);
  std::copy(lanes, lanes + count, p);
}

void store_row(c10::BFloat16* p, Vec8 y, int count) {
#if defined(__AVX512BF16__) && defined(__AVX512VL__)
  const __m128i bits = (__m128i)_mm256_cvtneps_pbh(y.v);
  _mm_mask_storeu_epi16(p, static_cast<__mmask8>((1u << count) - 1), bits);
#else
  alignas(32) float lanes[8];
  store8(lanes, y);
  for (int r = 0; r < count; ++r) p[r] = static_cast<c10::BFloat16>(lanes[r]);
#endif
}

// An int4 matrix's 16 levels as decode_int4_group looks them up: AVX-512's 16 fp32 lanes, or
// vec.h's table of bytes.
#if defined(__AVX512F__)
using LevelTable = __m512;
inline LevelTable level_table(const int8_t* levels) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(levels));
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes));
}
#else
using LevelTable = Table16;
inline LevelTable level_table(const int8_t* levels) { return load_table16(levels); }
#endif

#if defined(__AVX512F__)
// The 32 weights of one int4 group as two vectors of 16 (inputs 0-15 in lo, 16-31 in hi):
// (q - 8) * scale + zero, as the reference computes them; with a `Table`, levels[q] * scale + zero.
template <bool Table>
inline void int4_group16(const uint8_t* src, float scale, float zero, LevelTable table, __m512& lo,
                         __m512& hi) {
  const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
  const __m512 s = _mm512_set1_ps(scale), z = _mm512_set1_ps(zero);
  if constexpr (Table) {  // vpermps reads an index's low four bits: the low nibble as it is
    lo = _mm512_permutexvar_ps(bytes, table);
    hi = _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), table);
  } else {
    const __m512i eight = _mm512_set1_epi32(8), nibble = _mm512_set1_epi32(15);
    lo = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_and_si512(bytes, nibble), eight));
    hi = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_srli_epi32(bytes, 4), eight));
  }
  lo = _mm512_fmadd_ps(lo, s, z);
  hi = _mm512_fmadd_ps(hi, s, z);
}
#endif

// The 32 weights of one int4 group: (q - 8) * scale + zero, as the reference computes them; with
// a `Table`, levels[q] * scale + zero.
template <bool Table>
inline void decode_int4_group(const uint8_t* src, float scale, float zero, LevelTable table,
                              float* dst) {
#if defined(__AVX512F__)
  __m512 lo, hi;
  int4_group16<Table>(src, scale, zero, table, lo, hi);
  _mm512_storeu_ps(dst, lo);
  _mm512_storeu_ps(dst + kGroup / 2, hi);
#else
  const Vec8 eight = splat8(8.f), s = splat8(scale), z = splat8(zero);
  for (int half = 0; half < 2; ++half) {  // bytes 0-7: inputs 0-7 and 16-23; 8-15: 8-15, 24-31
    Vec8 lo, hi;
    if constexpr (Table) {
      looked_up8(src + 8 * half, table, lo, hi);
    } else {
      nibbles8(src + 8 * half, lo, hi);
      lo = sub8(lo, eight);
      hi = sub8(hi, eight);
    }
    store8(dst + 8 * half, fma8(lo, s, z));
    store8(dst + kGroup / 2 + 8 * half, fma8(hi, s, z));
  }
#endif
}

// One weight row widened to k floats (bf16: exactly; int8: the levels, unscaled).
template <typename W>
void widen_row(const W* src, int64_t k, float* dst) {
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) store8(dst + i, load8(src + i));
  for (; i < k; ++i) dst[i] = to_float(src[i]);
}

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
// The same as bf16, for AMX's tiles: int4 groups and int8 levels converted in registers, bf16
// rows copied (int8 levels are exact in bf16; int4's decoded weights are rounded to bf16).
template <bool Table>
inline void decode_int4_group(const uint8_t* src, float scale, float zero, LevelTable table,
                              c10::BFloat16* dst) {
  __m512 lo, hi;
  int4_group16<Table>(src, scale, zero, table, lo, hi);
  const __m512bh both = _mm512_cvtne2ps_pbh(hi, lo);  // inputs 0-15 in the low half
  _mm512_storeu_si512(dst, (__m512i)both);
}

inline void widen_row(const c10::BFloat16* src, int64_t k, c10::BFloat16* dst) {
  std::memcpy(dst, src, k * sizeof(c10::BFloat16));
}

inline void widen_row(const int8_t* src, int64_t k, c10::BFloat16* dst) {
  int64_t i = 0;
  for (; i + 32 <= k; i += 32) {
    const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(bytes)));
    const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(bytes, 1)));
    _mm512_storeu_si512(dst + i, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
  }
  for (; i < k; ++i) dst[i] = c10::BFloat16(static_cast<float>(src[i]));
}
#endif

// Rows [m_begin, m_end) of y = (x @ W.T) * row_scale(row) + bias: xp holds the fp32 activations
// (rows of kp floats, zero beyond k), decode(row, dst) writes weight row `row` as k floats.
template <typename Decode, typename Scale>
void gemm_rows(const float* xp, int64_t m_begin, int64_t m_end, int64_t n, int64_t k, int64_t kp,
               const float* bias, const Output& dst, const Decode& decode, const Scale& row_scale) {
  constexpr int T = Lanes::kTile;
  const int64_t m = m_end - m_begin;
  // K in chunks of at most kChunk: a chunk of the decoded block and of a tile's activations
  // together stay in L1 (the down projection's 1536 inputs would not)
  const int64_t chunks = (kp + kChunk - 1) / kChunk;
  const int64_t chunk = (kp / chunks + kWidth - 1) / kWidth * kWidth;
  const int64_t blocks = (n + kRows - 1) / kRows;
  const int64_t grain = std::max<int64_t>(1, kTaskMacs / std::max<int64_t>(1, kRows * k * m));
  at::parallel_for(0, blocks, grain, [&](int64_t first, int64_t last) {
    std::vector<float> w(kRows * kp, 0.f);  // the decoded block; the padding stays zero
    std::vector<Vec8> sums(m);              // lane r of row t: its dot with weight row n0 + r
    for (int64_t blk = first; blk < last; ++blk) {
      const int64_t n0 = blk * kRows;
      const int rows = static_cast<int>(std::min<int64_t>(kRows, n - n0));
      alignas(32) float scale[8] = {}, offset[8] = {};
      for (int r = 0; r < rows; ++r) {
        decode(n0 + r, w.data() + r * kp);
        scale[r] = row_scale(n0 + r);
        offset[r] = bias ? bias[n0 + r] : 0.f;
      }
      with_count<kRows>(rows, [&]<int R>() {
        for (int64_t c0 = 0; c0 < kp; c0 += chunk) {
          const int64_t len = std::min(chunk, kp - c0);
          auto tile = [&]<int Tc>(int64_t t0) {
            Vec8 part[Tc];
            tile_dots<Tc, R>(xp + (m_begin + t0) * kp + c0, w.data() + c0, kp, len, part);
            for (int t = 0; t < Tc; ++t) sums[t0 + t] = c0 ? add8(sums[t0 + t], part[t]) : part[t];
          };
          int64_t t0 = 0;
          for (; t0 + T <= m; t0 += T) tile.template operator()<T>(t0);
          if constexpr (T > 1)
            if (t0 < m)
              with_count<T - 1>(static_cast<int>(m - t0),
                                [&]<int Tc>() { tile.template operator()<Tc>(t0); });
        }
      });
      const Vec8 scale8 = load8(scale), offset8 = load8(offset);
      for (int64_t t = 0; t < m; ++t) {
        const Vec8 y = fma8(sums[t], scale8, offset8);
        const int64_t at = (m_begin + t) * n + n0;
        if (dst.f32) store_row(dst.f32 + at, y, rows);
        else store_row(dst.bf16 + at, y, rows);
      }
    }
  });
}

// row_scale of the weights with no scale per row (bf16, int4): the products decoded_linear may take
struct Unscaled {
  float operator()(int64_t) const { return 1.f; }
};

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
// Intel AMX (Sapphire Rapids on): eight tile registers of 16 rows x 64 bytes, and tdpbf16ps, a
// 16 x 16 x 32 bf16 product summed into fp32 per instruction (about 8x the multiply-adds per
// second of fp32 FMAs on this core; torch's oneDNN bf16 matmul measured 276 GMAC/s at 64 rows
// against sgemm's ~55). The weights are the A operand: a block of kAmxRows weight rows is decoded
// once into bf16 rows in a 64-byte aligned buffer that stays in L1/L2 (int4 groups and int8 rows
// converted in registers; int4's decoded weights rounded to bf16 are the one difference from the
// reference, bf16 and int8 levels are exact), so its tiles load as they lie. The activations are the B
// operand, which AMX takes as pairs of inputs (VNNI): they are packed once per call, 16 rows by
// 16 pairs per tile. Each pass runs two weight tiles against two activation tiles over the whole
// K, four accumulator tiles of 16 x 16 sums, stored and scaled at the end.
constexpr int kAmxRows = 32;       // weight rows per block: two A tiles
constexpr int kAmxK = 32;          // inputs per tile row (64 bytes of bf16)
// activations packed per pass over the weights (each pass decodes every weight row again): as
// many rows as fit this many bytes, which stay in L2 while every weight block reads them
constexpr int64_t kAmxSliceBytes = 1 << 20;

// Linux grants a process AMX's tile state only on request (arch_prctl ARCH_REQ_XCOMP_PERM for
// XFEATURE_XTILEDATA, Linux 5.16 on); without it the first tile instruction faults.
bool amx_granted() {
  static const bool granted = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  return granted;
}

// Tiles 0-3: the sums (weight tile i of the block against activation tile j: tile 2 j + i);
// 4-5: weight rows 0-15 and 16-31 of the block; 6-7: two activation tiles (configure_full_tiles).

// xp[((mt * ktiles + kt) * 16 + p) * 16 + r] = inputs 2p and 2p + 1 of tile kt of activation row
// 16 mt + r (bf16 pairs as 32-bit lanes), zero past m rows: a 16 x 16 transpose per tile of x
// (bf16 [m, ktiles * kAmxK], zero past its k inputs).
void pack_activations(const c10::BFloat16* x, int64_t m, int64_t ktiles, uint32_t* xp) {
  const int64_t mtiles = (m + 15) / 16, kp = ktiles * kAmxK;
  for (int64_t mt = 0; mt < mtiles; ++mt)
    for (int64_t kt = 0; kt < ktiles; ++kt) {
      __m512i r[16];
      for (int64_t i = 0; i < 16; ++i) {
        const int64_t row = mt * 16 + i;
        r[i] = row < m ? _mm512_loadu_si512(x + row * kp + kt * kAmxK) : _mm512_setzero_si512();
      }
      transpose16(r);
      uint32_t* dst = xp + (mt * ktiles + kt) * 256;
      for (int p = 0; p < 16; ++p) _mm512_storeu_si512(dst + p * 16, r[p]);
    }
}

// Rows [m_begin, m_begin + m) of y = (x @ W.T) * row_scale(row) + bias on AMX tiles, from the
// activations packed by pack_activations; decode(row, dst) writes weight row `row` as k bf16
// values.
template <typename Decode, typename Scale>
void amx_rows(const uint32_t* xp, int64_t m_begin, int64_t m, int64_t n, int64_t k,
              int64_t ktiles, const float* bias, const Output& dst, const Decode& decode,
              const Scale& row_scale) {
  const int64_t kp = ktiles * kAmxK, mtiles = (m + 15) / 16;
  const int64_t blocks = (n + kAmxRows - 1) / kAmxRows;
  const int64_t grain = std::max<int64_t>(1, kTaskMacs / std::max<int64_t>(1, kAmxRows * k * m));
  at::parallel_for(0, blocks, grain, [&](int64_t first, int64_t last) {
    configure_full_tiles();
    // the block's rows in bf16, the padding past k zero; 64-byte aligned (torch's allocator), as
    // is xp: a tile row that straddles two cache lines loads at half the speed or less
    const at::Tensor block = at::zeros({kAmxRows * kp}, at::kBFloat16);
    c10::BFloat16* w = block.data_ptr<c10::BFloat16>();
    alignas(64) float sums[4][16][16];
    for (int64_t blk = first; blk < last; ++blk) {
      const int64_t n0 = blk * kAmxRows;
      const int rows = static_cast<int>(std::min<int64_t>(kAmxRows, n - n0));
      float scale[kAmxRows] = {}, offset[kAmxRows] = {};
      for (int r = 0; r < kAmxRows; ++r) {
        c10::BFloat16* out = w + r * kp;
        if (r >= rows) {
          std::fill(out, out + kp, c10::BFloat16(0.f));
          continue;
        }
        decode(n0 + r, out);
        scale[r] = row_scale(n0 + r);
        offset[r] = bias ? bias[n0 + r] : 0.f;
      }
      const int64_t stride = kp * 2;  // bytes between weight rows of the block
      for (int64_t mt = 0; mt < mtiles; mt += 2) {
        const bool two = mt + 1 < mtiles;
        const uint32_t* a = xp + mt * ktiles * 256;
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int64_t kt = 0; kt < ktiles; ++kt) {
          _tile_loadd(4, w + kt * kAmxK, stride);
          _tile_loadd(5, w + 16 * kp + kt * kAmxK, stride);
          _tile_loadd(6, a + kt * 256, 64);
          _tile_dpbf16ps(0, 4, 6);
          _tile_dpbf16ps(1, 5, 6);
          if (two) {
            _tile_loadd(7, a + (ktiles + kt) * 256, 64);
            _tile_dpbf16ps(2, 4, 7);
            _tile_dpbf16ps(3, 5, 7);
          }
        }
        _tile_stored(0, sums[0], 64);
        _tile_stored(1, sums[1], 64);
        _tile_stored(2, sums[2], 64);
        _tile_stored(3, sums[3], 64);
        // sums[2 j + i][r][c]: weight row 16 i + r of the block against activation row
        // 16 (mt + j) + c; transposed, row c holds the 16 outputs of activation row c
        for (int j = 0; j < (two ? 2 : 1); ++j) {
          const int64_t t0 = (mt + j) * 16, count = std::min<int64_t>(16, m - t0);
          for (int i = 0; i < 2 && 16 * i < rows; ++i) {
            __m512i r[16];
            for (int c = 0; c < 16; ++c) r[c] = _mm512_load_si512(sums[2 * j + i][c]);
            transpose16(r);
            const __m512 sc = _mm512_loadu_ps(scale + 16 * i), off = _mm512_loadu_ps(offset + 16 * i);
            const __mmask16 keep = static_cast<__mmask16>((1u << std::min(16, rows - 16 * i)) - 1);
            for (int64_t c = 0; c < count; ++c) {
              const __m512 y = _mm512_fmadd_ps(_mm512_castsi512_ps(r[c]), sc, off);
              const int64_t at = (m_begin + t0 + c) * n + n0 + 16 * i;
              if (dst.f32) _mm512_mask_storeu_ps(dst.f32 + at, keep, y);
              else _mm256_mask_storeu_epi16(dst.bf16 + at, keep, (__m256i)_mm512_cvtneps_pbh(y));
            }
          }
        }
      }
    }
    _tile_release();
  });
}

// From this many bf16 activation rows on, a product with no row scale (bf16 and int4 weights)
// decodes its whole weight matrix into bf16 once and hands the matmul to torch's own bf16 kernel
// (oneDNN's, on the same AMX tiles), whose blocking of the whole product keeps the tiles fed
// better than amx_rows's passes (docs/kernels.md, "Prefill matmuls": amx_rows / decode + oneDNN
// on the default model's matrices, 2 threads: 0.91 at 256 rows, 1.17 at 384, 1.24 at 1024). The
// decoded weights are the ones amx_rows multiplies (bf16-rounded int4 levels), summed in fp32 in
// oneDNN's order; a bias is rounded to bf16 first, as torch's bf16 linear takes it.
constexpr int64_t kOneDnnRows = 384;

// (`dense`: the weights' own bf16 matrix, taken as it is instead of a decoded copy)
template <typename Decode>
at::Tensor decoded_linear(const at::Tensor& x, int64_t n, const c10::optional<at::Tensor>& bias,
                          const Decode& decode, const at::Tensor* dense) {
  at::Tensor w;
  if (dense) {
    w = *dense;
  } else {
    const int64_t k = x.size(1);
    w = at::empty({n, k}, at::kBFloat16);
    c10::BFloat16* wp = w.data_ptr<c10::BFloat16>();
    at::parallel_for(0, n, kAmxRows, [&](int64_t first, int64_t last) {
      for (int64_t row = first; row < last; ++row) decode(row, wp + row * k);
    });
  }
  c10::optional<at::Tensor> b;
  if (bias.has_value()) b = bias->to(at::kBFloat16);
  return at::linear(x.contiguous(), w, b);
}

// tiled_gemm on AMX: the activations in bf16 (x's own, or x rounded to bf16), packed a slice of
// kAmxSliceBytes of them at a time.
template <typename Decode, typename Scale>
at::Tensor amx_gemm(const at::Tensor& x, int64_t n, const c10::optional<at::Tensor>& bias,
                    const Decode& decode, const Scale& row_scale) {
  const int64_t m = x.size(0), k = x.size(1), ktiles = (k + kAmxK - 1) / kAmxK;
  at::Tensor xb = x.to(at::kBFloat16).contiguous();
  if (ktiles * kAmxK != k) xb = at::constant_pad_nd(xb, {0, ktiles * kAmxK - k});
  at::Tensor out = output_for(x, n), bias_f;
  const float* b = bias_data(bias, bias_f);
  const Output dst = output_of(out);
  // rows a pass: a multiple of 32 (the tile pairs), at least 32
  const int64_t slice = std::max<int64_t>(32, kAmxSliceBytes / (ktiles * kAmxK * 2) / 32 * 32);
  const at::Tensor packed = at::empty({((std::min(m, slice) + 15) / 16) * ktiles * 256}, at::kInt);
  uint32_t* xp = reinterpret_cast<uint32_t*>(packed.data_ptr<int32_t>());
  for (int64_t m0 = 0; m0 < m; m0 += slice) {
    const int64_t rows = std::min(slice, m - m0);
    pack_activations(xb.data_ptr<c10::BFloat16>() + m0 * ktiles * kAmxK, rows, ktiles, xp);
    amx_rows(xp, m0, rows, n, k, ktiles, b, dst, decode, row_scale);
  }
  return out;
}
#endif

// y = (x @ W.T) * row_scale(row) + bias, where decode(row, dst) writes weight row `row` as K
// floats (dst a float*; a c10::BFloat16* on the AMX path); `round_to_bf16`: the activations are
// rounded to bf16 first (int4's specification); `dense`: W itself when it is a bf16 matrix.
template <typename Decode, typename Scale>
at::Tensor tiled_gemm(const at::Tensor& x, int64_t n, const c10::optional<at::Tensor>& bias,
                      bool round_to_bf16, Decode&& decode, Scale&& row_scale,
                      const at::Tensor* dense = nullptr) {
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
  // bf16 products are exact only for bf16 activations: fp32 ones stay on the FMA path, unless the
  // specification rounds them anyway (int4)
  if ((round_to_bf16 || x.scalar_type() == at::kBFloat16) && amx_granted()) {
    if (std::is_same_v<std::decay_t<Scale>, Unscaled> && x.scalar_type() == at::kBFloat16 &&
        x.size(0) >= kOneDnnRows)
      return decoded_linear(x, n, bias, decode, dense);
    return amx_gemm(x, n, bias, decode, row_scale);
  }
#endif
  const int64_t m = x.size(0), k = x.size(1), kp = (k + kWidth - 1) / kWidth * kWidth;
  at::Tensor xf = (round_to_bf16 ? x.to(at::kBFloat16) : x).to(at::kFloat).contiguous();
  if (kp != k) xf = at::constant_pad_nd(xf, {0, kp - k});
  at::Tensor out = output_for(x, n), bias_f;
  const float* b = bias_data(bias, bias_f);
  const Output dst = output_of(out);
  // More rows run in slices whose activations stay in L2; each slice decodes the weights again,
  // which is little next to its kMaxRows multiply-adds per weight.
  for (int64_t m0 = 0; m0 < m; m0 += kMaxRows)
    gemm_rows(xf.data_ptr<float>(), m0, std::min(m, m0 + kMaxRows), n, k, kp, b, dst, decode,
              row_scale);
  return out;
}

}  // namespace

bool gemm_amx() {
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
  return amx_granted();
#else
  return false;
#endif
}

at::Tensor gemm_bf16(const at::Tensor& x, const at::Tensor& weight,
                     const c10::optional<at::Tensor>& bias) {
  check_gemv_args(x, weight, weight.size(1), bias, "gemm_bf16");
  TORCH_CHECK(weight.scalar_type() == at::kBFloat16,
              "chatpage::gemm_bf16: weight must be bfloat16");
  const c10::BFloat16* w = weight.data_ptr<c10::BFloat16>();
  const int64_t k = weight.size(1);
  return tiled_gemm(x, weight.size(0), bias, false,
                    [w, k](int64_t row, auto* out) { widen_row(w + row * k, k, out); }, Unscaled{},
                    &weight);
}

at::Tensor gemm_int8(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scales,
                     const c10::optional<at::Tensor>& bias) {
  check_gemv_args(x, qweight, qweight.size(1), bias, "gemm_int8");
  check_int8_args(qweight, scales, "gemm_int8");
  const int8_t* q = qweight.data_ptr<int8_t>();
  const c10::BFloat16* s = scales.data_ptr<c10::BFloat16>();
  const int64_t k = qweight.size(1);
  return tiled_gemm(
      x, qweight.size(0), bias, false,
      [q, k](int64_t row, auto* out) { widen_row(q + row * k, k, out); },
      [s](int64_t col) { return static_cast<float>(s[col]); });
}

at::Tensor gemm_int4(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scales,
                     const at::Tensor& zeros, const c10::optional<at::Tensor>& levels,
                     const c10::optional<at::Tensor>& bias) {
  const int64_t k = q.size(1) * 2;
  check_gemv_args(x, q, k, bias, "gemm_int4");
  check_int4_args(q, scales, zeros, levels, kGroup, "gemm_int4");
  const int64_t groups = k / kGroup;
  const uint8_t* qp = q.data_ptr<uint8_t>();
  const c10::BFloat16* sp = scales.data_ptr<c10::BFloat16>();
  const c10::BFloat16* zp = zeros.data_ptr<c10::BFloat16>();
  int8_t table_bytes[16];
  const bool own = int4_levels(levels, table_bytes);
  auto run = [&]<bool Table>() {
    return tiled_gemm(x, q.size(0), bias, true, [=](int64_t row, auto* out) {
      // the row's pointers in locals: the vector stores may alias anything, the closure included
      const LevelTable table = level_table(table_bytes);
      const uint8_t* src = qp + row * (k / 2);
      const c10::BFloat16* scale = sp + row * groups;
      const c10::BFloat16* zero = zp + row * groups;
      for (int64_t g = 0; g < groups; ++g)
        decode_int4_group<Table>(src + g * (kGroup / 2), static_cast<float>(scale[g]),
                                 static_cast<float>(zero[g]), table, out + g * kGroup);
    }, Unscaled{});
  };
  return own ? run.template operator()<true>() : run.template operator()<false>();
}

}  // namespace chatpage::cpu
