// fp32 weights quantized into the packed formats of chatpage/engine/model/weights.py, in one pass.
//
// quantize_int4: weights.quantize_int4 followed by gemv.pack_int4 (the GEMV's nibble layout);
// quantize_int8: weights.quantize_int8. The same float steps in the same order as those torch
// references (bf16 rounding to nearest even, rounding half to even, no fused multiply-adds), so the
// packed bytes are identical (tests/kernels/test_quantize_native.py). The references make a temporary
// tensor per step over the whole matrix, which was most of a GGUF's first packing.
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "ops_cpu.h"

// a * b + c stays two roundings, as in the references
#pragma GCC optimize("fp-contract=off")

namespace chatpage::cpu {
namespace {

constexpr int64_t GROUP = 32;  // weights.INT4_GROUP
constexpr int64_t HALF = GROUP / 2;
// a thread per million weights at most (as in csrc/cpu/dequant.cpp)
constexpr int64_t GRAIN = int64_t{1} << 20;

void check_weight(const at::Tensor& w, const char* op) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kFloat && w.is_contiguous() &&
                  w.device().is_cpu(),
              op, ": weight must be a contiguous 2-D fp32 CPU tensor");
}

void check_out(const at::Tensor& t, at::ScalarType type, int64_t rows, int64_t cols,
               const char* op, const char* what) {
  TORCH_CHECK(t.scalar_type() == type && t.is_contiguous() && t.numel() == rows * cols, op, ": ",
              what, " must be contiguous [", rows, ", ", cols, "] of ", type);
}

inline float bf16_round(float x) { return static_cast<float>(c10::BFloat16(x)); }

}  // namespace

void quantize_int4(const at::Tensor& w, const at::Tensor& q4, const at::Tensor& scales,
                   const at::Tensor& zeros) {
  check_weight(w, "quantize_int4");
  const int64_t n = w.size(0), k = w.size(1);
  TORCH_CHECK(k % GROUP == 0, "quantize_int4: input size ", k, " is not a multiple of ", GROUP);
  const int64_t groups = k / GROUP;
  check_out(q4, at::kByte, n, k / 2, "quantize_int4", "q4");
  check_out(scales, at::kBFloat16, n, groups, "quantize_int4", "scales");
  check_out(zeros, at::kBFloat16, n, groups, "quantize_int4", "zeros");
  const float* src = w.data_ptr<float>();
  uint8_t* dst = q4.data_ptr<uint8_t>();
  auto* sc = scales.data_ptr<at::BFloat16>();
  auto* zr = zeros.data_ptr<at::BFloat16>();
  at::parallel_for(0, n * groups, GRAIN / GROUP, [&](int64_t b, int64_t e) {
    for (int64_t g = b; g < e; ++g) {
      const float* x = src + g * GROUP;
      float lo = x[0], hi = x[0];
      for (int64_t j = 1; j < GROUP; ++j) {
        lo = std::min(lo, x[j]);
        hi = std::max(hi, x[j]);
      }
      const float scale = bf16_round(std::max((hi - lo) / 15.0f, 1e-8f));
      const float zero = bf16_round(lo + 8.0f * scale);
      const float base = zero - 8.0f * scale;
      uint8_t level[GROUP];
      for (int64_t j = 0; j < GROUP; ++j) {
        const float q = std::nearbyint((x[j] - base) / scale);
        level[j] = static_cast<uint8_t>(std::min(std::max(q, 0.0f), 15.0f));
      }
      uint8_t* out = dst + g * HALF;
      for (int64_t j = 0; j < HALF; ++j) out[j] = level[j] | (level[j + HALF] << 4);
      sc[g] = c10::BFloat16(scale);
      zr[g] = c10::BFloat16(zero);
    }
  });
}

void quantize_int8(const at::Tensor& w, const at::Tensor& q, const at::Tensor& scales) {
  check_weight(w, "quantize_int8");
  const int64_t n = w.size(0), k = w.size(1);
  check_out(q, at::kChar, n, k, "quantize_int8", "q");
  check_out(scales, at::kBFloat16, n, 1, "quantize_int8", "scales");
  const float* src = w.data_ptr<float>();
  int8_t* dst = q.data_ptr<int8_t>();
  auto* sc = scales.data_ptr<at::BFloat16>();
  at::parallel_for(0, n, std::max<int64_t>(1, GRAIN / std::max<int64_t>(k, 1)),
                   [&](int64_t b, int64_t e) {
                     for (int64_t r = b; r < e; ++r) {
                       const float* x = src + r * k;
                       float amax = 0.0f;
                       for (int64_t j = 0; j < k; ++j) amax = std::max(amax, std::fabs(x[j]));
                       const float scale = bf16_round(std::max(amax / 127.0f, 1e-12f));
                       for (int64_t j = 0; j < k; ++j) {
                         const float v = std::nearbyint(x[j] / scale);
                         dst[r * k + j] = static_cast<int8_t>(std::min(std::max(v, -127.0f), 127.0f));
                       }
                       sc[r] = c10::BFloat16(scale);
                     }
                   });
}

}  // namespace chatpage::cpu
