// The decode step's small per-layer ops, fused: residual add + RMSNorm, RoPE + QKV split, SwiGLU.
//
// At batch 1 each of these is a few hundred floats; what costs is launching ~10 torch ops per
// layer for them (allocation, dispatch, dtype casts), not the arithmetic. Each kernel does one pass
// over its rows, reads bf16 or fp32 and writes bf16 or fp32, and accumulates in fp32. The torch
// reference they must match is chatpage/engine/model/fused.py.
#include "checks.h"
#include "cpu/ops_cpu.h"
#include "cpu/vec.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <cmath>
#include <initializer_list>

namespace chatpage::cpu {
namespace {

constexpr int64_t kRowGrain = 16;  // rows per task: one row is far too little work to split

inline float to_f(float x) { return x; }
inline float to_f(c10::BFloat16 x) { return static_cast<float>(x); }

template <typename T>
inline T from_f(float x) {
  return static_cast<T>(x);
}

#if CHATPAGE_AVX512
// Sixteen floats stored as O: bf16 rounded to nearest even as c10::BFloat16 rounds (NaN: 0x7FC0).
inline void store16(float* p, __m512 y) { _mm512_storeu_ps(p, y); }
inline void store16(c10::BFloat16* p, __m512 y) {
  const __m512i bits = _mm512_castps_si512(y);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(
      _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))), 16);
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(y, y, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
}
#endif

// Calls fn.template operator()<A, B>() for the (float | bf16) x (float | bf16) pair of dtypes.
template <typename Fn>
void dispatch2(at::ScalarType a, at::ScalarType b, const char* name, Fn&& fn) {
  auto ok = [](at::ScalarType t) { return t == at::kFloat || t == at::kBFloat16; };
  TORCH_CHECK(ok(a) && ok(b), "chatpage::", name, ": tensors must be float32 or bfloat16, got ", a,
              " and ", b);
  if (a == at::kFloat && b == at::kFloat) fn.template operator()<float, float>();
  else if (a == at::kFloat) fn.template operator()<float, c10::BFloat16>();
  else if (b == at::kFloat) fn.template operator()<c10::BFloat16, float>();
  else fn.template operator()<c10::BFloat16, c10::BFloat16>();
}

void check_on_cpu(std::initializer_list<const at::Tensor*> tensors, const char* op) {
  for (const at::Tensor* t : tensors)
    TORCH_CHECK(t->device().is_cpu(), "chatpage::", op, ": every tensor must be on the CPU");
}

struct AddRmsNorm {
  const at::Tensor& hidden;
  const c10::optional<at::Tensor>& delta;
  const at::Tensor& weight;
  const at::Tensor& out;
  double eps;

  template <typename D, typename O>
  void operator()() const {
    const int64_t rows = hidden.size(0), n = hidden.size(1);
    float* h = hidden.data_ptr<float>();
    const float* w = weight.data_ptr<float>();
    const D* d = delta.has_value() ? delta->data_ptr<D>() : nullptr;
    O* o = out.data_ptr<O>();
    at::parallel_for(0, rows, kRowGrain, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        float* hr = h + r * n;
        float acc[16] = {};
        if (d != nullptr) {
          const D* dr = d + r * n;
          for (int64_t i = 0; i < n; ++i) hr[i] += to_f(dr[i]);
        }
        int64_t i = 0;
        for (; i + 16 <= n; i += 16)
          for (int j = 0; j < 16; ++j) acc[j] += hr[i + j] * hr[i + j];
        for (; i < n; ++i) acc[0] += hr[i] * hr[i];
        float ss = 0.f;
        for (float a : acc) ss += a;
        const float inv = 1.f / std::sqrt(ss / static_cast<float>(n) + static_cast<float>(eps));
        O* orow = o + r * n;
        for (int64_t k = 0; k < n; ++k) orow[k] = from_f<O>(w[k] * (hr[k] * inv));
      }
    });
  }
};

struct RopeQkv {
  const at::Tensor& qkv;
  const at::Tensor& positions;
  const at::Tensor& cos;
  const at::Tensor& sin;
  const at::Tensor& q;
  const at::Tensor& k;
  const at::Tensor& v;

  template <typename I, typename Unused>
  void operator()() const {
    const int64_t rows = qkv.size(0), hq = q.size(1), hkv = k.size(1), dim = q.size(2);
    const int64_t half = dim / 2, width = (hq + 2 * hkv) * dim, max_pos = cos.size(0);
    const I* x = qkv.data_ptr<I>();
    const int64_t* pos = positions.data_ptr<int64_t>();
    const float* cs = cos.data_ptr<float>();
    const float* sn = sin.data_ptr<float>();
    float* qo = q.data_ptr<float>();
    float* ko = k.data_ptr<float>();
    float* vo = v.data_ptr<float>();
    at::parallel_for(0, rows, kRowGrain, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        TORCH_CHECK(pos[r] >= 0 && pos[r] < max_pos, "chatpage::rope_qkv: position ", pos[r],
                    " outside the table of ", max_pos);
        const float* c = cs + pos[r] * dim;
        const float* s = sn + pos[r] * dim;
        const I* xr = x + r * width;
        for (int64_t head = 0; head < hq + hkv; ++head) {
          const I* src = xr + head * dim;
          float* dst = head < hq ? qo + (r * hq + head) * dim : ko + (r * hkv + head - hq) * dim;
          for (int64_t j = 0; j < half; ++j) {
            const float a = to_f(src[j]), bb = to_f(src[j + half]);
            dst[j] = a * c[j] - bb * s[j];
            dst[j + half] = bb * c[j + half] + a * s[j + half];
          }
        }
        const I* vs = xr + (hq + hkv) * dim;
        float* vd = vo + r * hkv * dim;
        for (int64_t j = 0; j < hkv * dim; ++j) vd[j] = to_f(vs[j]);
      }
    });
  }
};

struct SiluMul {
  const at::Tensor& gate_up;
  const at::Tensor& out;

  template <typename I, typename O>
  void operator()() const {
    const int64_t rows = gate_up.size(0), n = out.size(1);
    const I* x = gate_up.data_ptr<I>();
    O* o = out.data_ptr<O>();
    at::parallel_for(0, rows, kRowGrain, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const I* g = x + r * 2 * n;
        const I* u = g + n;
        O* orow = o + r * n;
        int64_t i = 0;
#if CHATPAGE_AVX512
        for (; i + 16 <= n; i += 16) {  // sixteen at a time where the build has AVX-512
          using L = Lanes16;
          const __m512 gv = L::load(g + i);
          const __m512 e = L::exp(L::sub(L::zero(), gv));
          store16(orow + i, _mm512_div_ps(L::mul(gv, L::load(u + i)), L::add(L::splat(1.f), e)));
        }
#endif
        float lanes[8];
        for (; i + 8 <= n; i += 8) {  // silu(g) * u = g * u / (1 + exp(-g)), eight at a time
          const Vec8 gv = load8(g + i);
          const Vec8 e = exp8(sub8(zero8(), gv));
          store8(lanes, div8(mul8(gv, load8(u + i)), add8(splat8(1.f), e)));
          for (int j = 0; j < 8; ++j) orow[i + j] = from_f<O>(lanes[j]);
        }
        for (; i < n; ++i) {
          const float gv = to_f(g[i]);
          orow[i] = from_f<O>(gv / (1.f + std::exp(-gv)) * to_f(u[i]));
        }
      }
    });
  }
};

}  // namespace

void add_rms_norm(const at::Tensor& hidden, const c10::optional<at::Tensor>& delta,
                  const at::Tensor& weight, double eps, const at::Tensor& out) {
  check_add_rms_norm_args(hidden, delta, weight, out);
  check_on_cpu({&hidden, &weight, &out}, "add_rms_norm");
  if (delta.has_value()) check_on_cpu({&*delta}, "add_rms_norm");
  const at::ScalarType dt = delta.has_value() ? delta->scalar_type() : at::kFloat;
  dispatch2(dt, out.scalar_type(), "add_rms_norm", AddRmsNorm{hidden, delta, weight, out, eps});
}

void rope_qkv(const at::Tensor& qkv, const at::Tensor& positions, const at::Tensor& cos,
              const at::Tensor& sin, const at::Tensor& q, const at::Tensor& k,
              const at::Tensor& v) {
  check_rope_qkv_args(qkv, positions, cos, sin, q, k, v);
  check_on_cpu({&qkv, &positions, &cos, &sin, &q, &k, &v}, "rope_qkv");
  dispatch2(qkv.scalar_type(), at::kFloat, "rope_qkv", RopeQkv{qkv, positions, cos, sin, q, k, v});
}

void silu_mul(const at::Tensor& gate_up, const at::Tensor& out) {
  check_silu_mul_args(gate_up, out);
  check_on_cpu({&gate_up, &out}, "silu_mul");
  dispatch2(gate_up.scalar_type(), out.scalar_type(), "silu_mul", SiluMul{gate_up, out});
}

}  // namespace chatpage::cpu
