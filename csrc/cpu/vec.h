// Eight-lane float vector used by the CPU kernels (and a sixteen-lane one with AVX-512).
//
// With AVX2+FMA (g++ -march=native on any AVX2 machine) Vec8 is one ymm register and every
// helper is one or a few instructions; elsewhere it is a float[8] that the compiler vectorises
// as well as it can. The kernels are written once against this small interface.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define CHATPAGE_AVX2 1
#else
#define CHATPAGE_AVX2 0
#endif

namespace chatpage::cpu {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// exp(x)'s range reduction and degree-6 polynomial (Cephes-style, ~1 ulp on [-87, 88]), shared
// by the vector widths: x is clamped to [kExpLo, kExpHi], n = floor(x log2(e) + 1/2), r = x - n
// ln(2) (ln(2) in two parts), exp(x) = 2^n (1 + r + r^2 P(r)).
namespace exp_poly {
constexpr float kHi = 88.3762626647949f, kLo = -87.3365447505531f;
constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kP[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                         4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
}  // namespace exp_poly

#if CHATPAGE_AVX2

struct Vec8 {
  __m256 v;
};

inline Vec8 zero8() { return {_mm256_setzero_ps()}; }
inline Vec8 splat8(float x) { return {_mm256_set1_ps(x)}; }
inline Vec8 load8(const float* p) { return {_mm256_loadu_ps(p)}; }
inline Vec8 load8(const c10::BFloat16* p) {
  // bf16 is the upper half of an fp32: widen to 32 bits and shift into place.
  __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return {_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16))};
}
#if defined(__F16C__)
inline Vec8 load8(const c10::Half* p) {
  return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))};
}
#else
inline Vec8 load8(const c10::Half* p) {
  alignas(32) float tmp[8];
  for (int i = 0; i < 8; ++i) tmp[i] = static_cast<float>(p[i]);
  return {_mm256_load_ps(tmp)};
}
#endif
inline Vec8 load8(const int8_t* p) {
  const __m128i raw = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(raw))};
}
// The 16 nibbles of 8 bytes as floats: lane j of lo is p[j] & 15, of hi p[j] >> 4.
inline void nibbles8(const uint8_t* p, Vec8& lo, Vec8& hi) {
  const __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  lo = {_mm256_cvtepi32_ps(_mm256_and_si256(bytes, _mm256_set1_epi32(15)))};
  hi = {_mm256_cvtepi32_ps(_mm256_srli_epi32(bytes, 4))};
}
// A table of 16 int8 values (an int4 matrix's levels), looked up by nibble in looked_up8.
struct Table16 {
  __m128i v;
};
inline Table16 load_table16(const int8_t* p) {
  return {_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))};
}
// nibbles8 through a table: lane j of lo is t[p[j] & 15], of hi t[p[j] >> 4] (one pshufb each).
inline void looked_up8(const uint8_t* p, Table16 t, Vec8& lo, Vec8& hi) {
  const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  const __m128i nibble = _mm_set1_epi8(15);
  const __m128i l = _mm_shuffle_epi8(t.v, _mm_and_si128(bytes, nibble));
  const __m128i h = _mm_shuffle_epi8(t.v, _mm_and_si128(_mm_srli_epi16(bytes, 4), nibble));
  lo = {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(l))};
  hi = {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(h))};
}
inline void store8(float* p, Vec8 a) { _mm256_storeu_ps(p, a.v); }
inline Vec8 add8(Vec8 a, Vec8 b) { return {_mm256_add_ps(a.v, b.v)}; }
inline Vec8 sub8(Vec8 a, Vec8 b) { return {_mm256_sub_ps(a.v, b.v)}; }
inline Vec8 mul8(Vec8 a, Vec8 b) { return {_mm256_mul_ps(a.v, b.v)}; }
inline Vec8 div8(Vec8 a, Vec8 b) { return {_mm256_div_ps(a.v, b.v)}; }
inline Vec8 max8(Vec8 a, Vec8 b) { return {_mm256_max_ps(a.v, b.v)}; }
// a * b + c
inline Vec8 fma8(Vec8 a, Vec8 b, Vec8 c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }

// Lanes >= n become `fill` (0 <= n <= 8).
inline Vec8 keep_first8(Vec8 a, int n, float fill) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  __m256 keep = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n), lane));
  return {_mm256_blendv_ps(_mm256_set1_ps(fill), a.v, keep)};
}
// Lanes where lo <= x <= hi keep a, the others become `fill`.
inline Vec8 keep_between8(Vec8 a, Vec8 lo, Vec8 hi, float x, float fill) {
  const __m256 xv = _mm256_set1_ps(x);
  const __m256 keep =
      _mm256_and_ps(_mm256_cmp_ps(lo.v, xv, _CMP_LE_OQ), _mm256_cmp_ps(hi.v, xv, _CMP_GE_OQ));
  return {_mm256_blendv_ps(_mm256_set1_ps(fill), a.v, keep)};
}

inline float hsum8(Vec8 a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a.v), _mm256_extractf128_ps(a.v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float hmax8(Vec8 a) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(a.v), _mm256_extractf128_ps(a.v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Lane i of the result is the sum of the eight lanes of a[i].
inline Vec8 transpose_sum8(const Vec8* a) {
  __m256 t0 = _mm256_hadd_ps(a[0].v, a[1].v);
  __m256 t1 = _mm256_hadd_ps(a[2].v, a[3].v);
  __m256 t2 = _mm256_hadd_ps(a[4].v, a[5].v);
  __m256 t3 = _mm256_hadd_ps(a[6].v, a[7].v);
  __m256 u0 = _mm256_hadd_ps(t0, t1);  // low half: a0..a3 (lanes 0-3), high half: a0..a3 (4-7)
  __m256 u1 = _mm256_hadd_ps(t2, t3);  // the same for a4..a7
  __m256 lo = _mm256_permute2f128_ps(u0, u1, 0x20);
  __m256 hi = _mm256_permute2f128_ps(u0, u1, 0x31);
  return {_mm256_add_ps(lo, hi)};
}

// exp(x) (exp_poly); -inf and anything below the fp32 range give exactly 0.
inline Vec8 exp8(Vec8 a) {
  using namespace exp_poly;
  __m256 x = _mm256_min_ps(a.v, _mm256_set1_ps(kHi));
  __m256 underflow = _mm256_cmp_ps(x, _mm256_set1_ps(kLo), _CMP_LT_OQ);
  // an underflowing lane (a masked logit's -inf among them) is computed as exp(0) and zeroed at
  // the end: at kLo its 2^n * y would be subnormal, and every product with a subnormal result
  // costs a microcode assist (a grammar-masked 49k-logit row sampled ~8x slower)
  x = _mm256_max_ps(_mm256_blendv_ps(x, _mm256_setzero_ps(), underflow), _mm256_set1_ps(kLo));
  __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(kLog2e), _mm256_set1_ps(0.5f)));
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(kLn2Hi), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(kLn2Lo), x);
  __m256 y = _mm256_set1_ps(kP[0]);
  for (int i = 1; i < 6; ++i) y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(kP[i]));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  __m256i n = _mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127));
  __m256 pow2n = _mm256_castsi256_ps(_mm256_slli_epi32(n, 23));
  return {_mm256_andnot_ps(underflow, _mm256_mul_ps(y, pow2n))};
}

#else  // portable fallback

struct Vec8 {
  float v[8];
};

inline Vec8 splat8(float x) {
  Vec8 r;
  for (int i = 0; i < 8; ++i) r.v[i] = x;
  return r;
}
inline Vec8 zero8() { return splat8(0.0f); }
template <typename T>
inline Vec8 load8(const T* p) {
  Vec8 r;
  for (int i = 0; i < 8; ++i) r.v[i] = static_cast<float>(p[i]);
  return r;
}
inline void nibbles8(const uint8_t* p, Vec8& lo, Vec8& hi) {
  for (int i = 0; i < 8; ++i) {
    lo.v[i] = static_cast<float>(p[i] & 15);
    hi.v[i] = static_cast<float>(p[i] >> 4);
  }
}
struct Table16 {
  int8_t v[16];
};
inline Table16 load_table16(const int8_t* p) {
  Table16 t;
  std::memcpy(t.v, p, sizeof(t.v));
  return t;
}
inline void looked_up8(const uint8_t* p, const Table16& t, Vec8& lo, Vec8& hi) {
  for (int i = 0; i < 8; ++i) {
    lo.v[i] = static_cast<float>(t.v[p[i] & 15]);
    hi.v[i] = static_cast<float>(t.v[p[i] >> 4]);
  }
}
inline void store8(float* p, Vec8 a) { std::memcpy(p, a.v, sizeof(a.v)); }
#define CHATPAGE_LANEWISE(name, expr)        \
  inline Vec8 name(Vec8 a, Vec8 b) {         \
    Vec8 r;                                  \
    for (int i = 0; i < 8; ++i) r.v[i] = expr; \
    return r;                                \
  }
CHATPAGE_LANEWISE(add8, a.v[i] + b.v[i])
CHATPAGE_LANEWISE(sub8, a.v[i] - b.v[i])
CHATPAGE_LANEWISE(mul8, a.v[i] * b.v[i])
CHATPAGE_LANEWISE(div8, a.v[i] / b.v[i])
CHATPAGE_LANEWISE(max8, a.v[i] > b.v[i] ? a.v[i] : b.v[i])
#undef CHATPAGE_LANEWISE
inline Vec8 fma8(Vec8 a, Vec8 b, Vec8 c) {
  Vec8 r;
  for (int i = 0; i < 8; ++i) r.v[i] = std::fma(a.v[i], b.v[i], c.v[i]);
  return r;
}
inline Vec8 keep_first8(Vec8 a, int n, float fill) {
  for (int i = n; i < 8; ++i) a.v[i] = fill;
  return a;
}
inline Vec8 keep_between8(Vec8 a, Vec8 lo, Vec8 hi, float x, float fill) {
  for (int i = 0; i < 8; ++i) a.v[i] = lo.v[i] <= x && x <= hi.v[i] ? a.v[i] : fill;
  return a;
}
inline float hsum8(Vec8 a) {
  float s = 0.0f;
  for (float x : a.v) s += x;
  return s;
}
inline float hmax8(Vec8 a) {
  float m = a.v[0];
  for (float x : a.v) m = x > m ? x : m;
  return m;
}
inline Vec8 transpose_sum8(const Vec8* a) {
  Vec8 r;
  for (int i = 0; i < 8; ++i) r.v[i] = hsum8(a[i]);
  return r;
}
inline Vec8 exp8(Vec8 a) {
  Vec8 r;
  for (int i = 0; i < 8; ++i) r.v[i] = std::exp(a.v[i]);
  return r;
}

#endif

#if defined(__AVX512F__) && defined(__AVX512DQ__)
#define CHATPAGE_AVX512 1

// Sixteen lanes (one zmm register), for the kernels written against a lanes type (attention:
// Lanes8 there forwards to Vec8's helpers); one AVX-512 instruction or a few each.
struct Lanes16 {
  using V = __m512;
  static constexpr int kWidth = 16;
  static V zero() { return _mm512_setzero_ps(); }
  static V splat(float x) { return _mm512_set1_ps(x); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V load(const c10::BFloat16* p) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
  }
  static V load(const c10::Half* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static V load(const int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static void store(float* p, V a) { _mm512_storeu_ps(p, a); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V max(V a, V b) { return _mm512_max_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  // Lanes >= n become `fill` (0 <= n <= 16).
  static V keep_first(V a, int n, float fill) {
    return _mm512_mask_blend_ps(static_cast<__mmask16>((1u << n) - 1u), _mm512_set1_ps(fill), a);
  }
  // Lanes where lo <= x <= hi keep a, the others become `fill`.
  static V keep_between(V a, V lo, V hi, float x, float fill) {
    const V xv = _mm512_set1_ps(x);
    const __mmask16 keep = _mm512_cmp_ps_mask(lo, xv, _CMP_LE_OQ) &
                           _mm512_cmp_ps_mask(hi, xv, _CMP_GE_OQ);
    return _mm512_mask_blend_ps(keep, _mm512_set1_ps(fill), a);
  }
  static float hsum(V a) { return _mm512_reduce_add_ps(a); }
  static float hmax(V a) { return _mm512_reduce_max_ps(a); }

  // Lane i of the result is op over the sixteen lanes of a[i] (op: add or max): pairs of vectors
  // are combined within 128-bit lanes (floats, then pairs of floats), then across them (two lane
  // shuffles). The first eight vectors and the last eight reduce apart (half_reduce) until the
  // last step (join), so a caller can hold eight at a time.
  template <typename Op>
  static V half_reduce(const V* a, Op op) {
    V b[4], c[2];
    for (int i = 0; i < 4; ++i) {
      b[i] = op(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
    }
    for (int i = 0; i < 2; ++i) {
      const __m512d x = _mm512_castps_pd(b[2 * i]), y = _mm512_castps_pd(b[2 * i + 1]);
      c[i] = op(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    return op(_mm512_shuffle_f32x4(c[0], c[1], 0x88), _mm512_shuffle_f32x4(c[0], c[1], 0xDD));
  }
  template <typename Op>
  static V join(V first, V last, Op op) {
    return op(_mm512_shuffle_f32x4(first, last, 0x88), _mm512_shuffle_f32x4(first, last, 0xDD));
  }
  template <typename Op>
  static V transpose_reduce(const V* a, Op op) {
    return join(half_reduce(a, op), half_reduce(a + 8, op), op);
  }
  static V transpose_sum(const V* a) { return transpose_reduce(a, _mm512_add_ps); }
  static V transpose_max(const V* a) { return transpose_reduce(a, _mm512_max_ps); }

  // exp(x) (exp_poly), as exp8.
  static V exp(V a) {
    using namespace exp_poly;
    V x = _mm512_min_ps(a, _mm512_set1_ps(kHi));
    const __mmask16 underflow = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kLo), _CMP_LT_OQ);
    // (an underflowing lane as exp(0), zeroed at the end: no subnormal products, as exp8)
    x = _mm512_max_ps(_mm512_mask_blend_ps(underflow, x, _mm512_setzero_ps()),
                      _mm512_set1_ps(kLo));
    const V fx = _mm512_roundscale_ps(
        _mm512_fmadd_ps(x, _mm512_set1_ps(kLog2e), _mm512_set1_ps(0.5f)),
        _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(kLn2Hi), x);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(kLn2Lo), x);
    V y = _mm512_set1_ps(kP[0]);
    for (int i = 1; i < 6; ++i) y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(kP[i]));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
    const __m512i n = _mm512_add_epi32(_mm512_cvttps_epi32(fx), _mm512_set1_epi32(127));
    const V pow2n = _mm512_castsi512_ps(_mm512_slli_epi32(n, 23));
    return _mm512_maskz_mul_ps(static_cast<__mmask16>(~underflow), y, pow2n);
  }
};

#else
#define CHATPAGE_AVX512 0
#endif

// Scalar conversion used for tails and single elements.
inline float to_float(float x) { return x; }
inline float to_float(int8_t x) { return static_cast<float>(x); }
inline float to_float(c10::BFloat16 x) { return static_cast<float>(x); }
inline float to_float(c10::Half x) { return static_cast<float>(x); }

}  // namespace chatpage::cpu
