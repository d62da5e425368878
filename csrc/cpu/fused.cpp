// The decode step's small per-layer ops, fused: residual add + RMSNorm, RoPE + QKV split, SwiGLU.
//
// At batch 1 each of these is a few hundred floats; what costs is launching ~10 torch ops per
// layer for them (allocation, dispatch, dtype casts), not the arithmetic. Each kernel does one pass
// over its rows, reads bf16 or fp32 and writes bf16 or fp32, and accumulates in fp32. The torch
// reference they must match is chatpage/engine/fused.py.
#include "checks.h"
#include "cpu/ops_cpu.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <cmath>

namespace chatpage::cpu {
namespace {

constexpr int64_t kRowGrain = 16;  // rows per task: one row is far too little work to split

inline float to_f(float x) { return x; }
inline float to_f(c10::BFloat16 x) { return static_cast<float>(x); }

template <typename T>
inline T from_f(float x) {
  return static_cast<T>(x);
}

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

void check_rows(const at::Tensor& t, int64_t rows, int64_t cols, const char* what) {
  TORCH_CHECK(t.device().is_cpu(), "chatpage: ", what, " must be on the CPU");
  TORCH_CHECK(t.dim() >= 2 && t.size(0) == rows && t.numel() == rows * cols,
              "chatpage: ", what, " must hold ", rows, " rows of ", cols, " values, got ", t.sizes());
  TORCH_CHECK(t.is_contiguous(), "chatpage: ", what, " must be contiguous");
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
        for (int64_t i = 0; i < n; ++i) {
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
  TORCH_CHECK(hidden.dim() == 2 && hidden.scalar_type() == at::kFloat && hidden.is_contiguous(),
              "chatpage::add_rms_norm: hidden must be a contiguous float32 [rows, size] tensor");
  const int64_t rows = hidden.size(0), n = hidden.size(1);
  TORCH_CHECK(weight.scalar_type() == at::kFloat && weight.is_contiguous() && weight.numel() == n,
              "chatpage::add_rms_norm: weight must be float32 with ", n, " values");
  check_rows(out, rows, n, "add_rms_norm's out");
  if (delta.has_value()) check_rows(*delta, rows, n, "add_rms_norm's delta");
  const at::ScalarType dt = delta.has_value() ? delta->scalar_type() : at::kFloat;
  dispatch2(dt, out.scalar_type(), "add_rms_norm", AddRmsNorm{hidden, delta, weight, out, eps});
}

void rope_qkv(const at::Tensor& qkv, const at::Tensor& positions, const at::Tensor& cos,
              const at::Tensor& sin, const at::Tensor& q, const at::Tensor& k,
              const at::Tensor& v) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.sizes() == k.sizes() && k.size(2) == q.size(2),
              "chatpage::rope_qkv: q must be [rows, q_heads, dim], k and v [rows, kv_heads, dim]");
  TORCH_CHECK(q.size(2) % 2 == 0, "chatpage::rope_qkv: head dim must be even");
  for (const at::Tensor* t : {&q, &k, &v, &cos, &sin})
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous(),
                "chatpage::rope_qkv: q, k, v, cos and sin must be contiguous float32");
  const int64_t rows = qkv.size(0), dim = q.size(2);
  check_rows(qkv, rows, (q.size(1) + 2 * k.size(1)) * dim, "rope_qkv's qkv");
  TORCH_CHECK(q.size(0) == rows && k.size(0) == rows, "chatpage::rope_qkv: row counts differ");
  TORCH_CHECK(cos.dim() == 2 && cos.size(1) == dim && sin.sizes() == cos.sizes(),
              "chatpage::rope_qkv: cos and sin must be [positions, head dim]");
  TORCH_CHECK(positions.scalar_type() == at::kLong && positions.is_contiguous() &&
                  positions.numel() == rows,
              "chatpage::rope_qkv: positions must be int64 with one per row");
  dispatch2(qkv.scalar_type(), at::kFloat, "rope_qkv", RopeQkv{qkv, positions, cos, sin, q, k, v});
}

void silu_mul(const at::Tensor& gate_up, const at::Tensor& out) {
  TORCH_CHECK(out.dim() == 2, "chatpage::silu_mul: out must be [rows, size]");
  const int64_t rows = out.size(0), n = out.size(1);
  check_rows(gate_up, rows, 2 * n, "silu_mul's gate_up");
  check_rows(out, rows, n, "silu_mul's out");
  dispatch2(gate_up.scalar_type(), out.scalar_type(), "silu_mul", SiluMul{gate_up, out});
}

}  // namespace chatpage::cpu
