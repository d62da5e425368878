// What the matmul kernels (csrc/cpu/gemv.cpp, csrc/cpu/gemm.cpp) share: their [M, N] output in
// x's dtype, the bias in fp32, an int4 matrix's levels and the store of a tile of finished dot
// products.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>

namespace chatpage::cpu {

// Where a call writes its [M, N] result: fp32 or bf16.
struct Output {
  float* f32;
  c10::BFloat16* bf16;
  int64_t n;
};

inline Output output_of(const at::Tensor& out) {
  const bool f32 = out.scalar_type() == at::kFloat;
  return {f32 ? out.data_ptr<float>() : nullptr, f32 ? nullptr : out.data_ptr<c10::BFloat16>(),
          out.size(1)};
}

// out[m0 + t, n0 + r] = dots[t][r] * row_scale(n0 + r) + bias[n0 + r]
template <int T, int R, typename Scale>
void store(const Output& out, const float* bias, int64_t m0, int64_t n0, const float (*dots)[R],
           Scale&& row_scale) {
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r) {
      const int64_t col = n0 + r, at = (m0 + t) * out.n + col;
      const float y = dots[t][r] * row_scale(col) + (bias ? bias[col] : 0.f);
      if (out.f32) out.f32[at] = y;
      else out.bf16[at] = static_cast<c10::BFloat16>(y);
    }
}

// The 16 levels of an int4 matrix (checks.h's check_int4_args has checked them): its own table
// when it has one (true), else q - 8 (false).
inline bool int4_levels(const c10::optional<at::Tensor>& levels, int8_t (&out)[16]) {
  for (int i = 0; i < 16; ++i)
    out[i] = levels.has_value() ? levels->data_ptr<int8_t>()[i] : static_cast<int8_t>(i - 8);
  return levels.has_value();
}

inline at::Tensor output_for(const at::Tensor& x, int64_t n) {
  return at::empty({x.size(0), n}, x.options());
}

inline const float* bias_data(const c10::optional<at::Tensor>& bias, at::Tensor& holder) {
  if (!bias.has_value()) return nullptr;
  holder = bias->to(at::kFloat).contiguous();
  return holder.data_ptr<float>();
}

}  // namespace chatpage::cpu
