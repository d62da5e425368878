// ggml's tensor types (GGUF blocks) dequantized to fp32, straight into the caller's tensor.
//
// chatpage/engine/load/dequant.py is the reference: the same steps in the same order, so the values are
// bit-identical with it and with gguf-py's gguf.quants (tests/engine/test_dequant.py). Each block is read
// once and its values written once, over torch's threads: the torch reference makes a temporary
// tensor per step, which is what a fp32 start of a GGUF spent its seconds on.
#include <ATen/Parallel.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>

#include "ops_cpu.h"

// a * b + c stays two roundings, as in the reference (no fused multiply-adds)
#pragma GCC optimize("fp-contract=off")

namespace chatpage::cpu {
namespace {

constexpr int QK_K = 256;
constexpr float IQ4_LEVELS[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                  1,    13,   25,  38,  53,  69,  89,  113};

inline float half_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

// The 4-bit value j (0..31) of 16 packed bytes: the low nibbles first, then the high ones.
inline int nibble(const uint8_t* qs, int j) {
  return j < 16 ? qs[j] & 0x0F : qs[j - 16] >> 4;
}

void f32(const uint8_t* b, float* y) { std::memcpy(y, b, 4); }

void f16(const uint8_t* b, float* y) { y[0] = half_at(b); }

void bf16(const uint8_t* b, float* y) {
  uint32_t bits = static_cast<uint32_t>(b[0] | (b[1] << 8)) << 16;
  std::memcpy(y, &bits, 4);
}

void q4_0(const uint8_t* b, float* y) {
  const float d = half_at(b);
  for (int j = 0; j < 32; ++j) y[j] = d * static_cast<float>(nibble(b + 2, j) - 8);
}

void q4_1(const uint8_t* b, float* y) {
  const float d = half_at(b), m = half_at(b + 2);
  for (int j = 0; j < 32; ++j) y[j] = d * static_cast<float>(nibble(b + 4, j)) + m;
}

// Q5_0's and Q5_1's 5-bit value j: the nibble, and bit j of the little-endian uint32 at qh.
inline int q5(const uint8_t* qh, const uint8_t* qs, int j) {
  return nibble(qs, j) | (((qh[j / 8] >> (j % 8)) & 1) << 4);
}

void q5_0(const uint8_t* b, float* y) {
  const float d = half_at(b);
  for (int j = 0; j < 32; ++j) y[j] = d * static_cast<float>(q5(b + 2, b + 6, j) - 16);
}

void q5_1(const uint8_t* b, float* y) {
  const float d = half_at(b), m = half_at(b + 2);
  for (int j = 0; j < 32; ++j) y[j] = d * static_cast<float>(q5(b + 4, b + 8, j)) + m;
}

void q8_0(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const auto* qs = reinterpret_cast<const int8_t*>(b + 2);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(qs[j]) * d;
}

// Value i of 2-bit fields packed as ggml's K-quants pack them: groups of 32 bytes, each giving
// its bits 0-1 for 32 values, then bits 2-3, 4-5, 6-7.
inline int crumb(const uint8_t* q, int i) {
  const int group = i / 128, shift = (i % 128) / 32 * 2;
  return (q[group * 32 + i % 32] >> shift) & 3;
}

// Value i of 4-bit fields in groups of ``width`` bytes: a group's low nibbles, then its high ones.
inline int nibble_k(const uint8_t* q, int i, int width) {
  const int group = i / (2 * width), rest = i % (2 * width);
  return (q[group * width + rest % width] >> (rest / width * 4)) & 0x0F;
}

// Bit ``i / 32`` of byte ``i % 32`` (the high bits of Q3_K and Q5_K).
inline int bit_k(const uint8_t* q, int i) { return (q[i % 32] >> (i / 32)) & 1; }

void q2_k(const uint8_t* b, float* y) {
  const float d = half_at(b + 80), dmin = half_at(b + 82);
  for (int s = 0; s < 16; ++s) {
    const float dl = d * static_cast<float>(b[s] & 0x0F);
    const float ml = dmin * static_cast<float>(b[s] >> 4);
    for (int j = 0; j < 16; ++j) {
      const int i = s * 16 + j;
      y[i] = dl * static_cast<float>(crumb(b + 16, i)) - ml;
    }
  }
}

void q3_k(const uint8_t* b, float* y) {
  const uint8_t* packed = b + 96;
  const float d = half_at(b + 108);
  for (int s = 0; s < 16; ++s) {
    const int low = (packed[s % 8] >> (s / 8 * 4)) & 0x0F;
    const int high = (packed[8 + s % 4] >> (s / 4 * 2)) & 3;
    const float dl = d * static_cast<float>(static_cast<int8_t>(low | (high << 4)) - 32);
    for (int j = 0; j < 16; ++j) {
      const int i = s * 16 + j;
      const int q = crumb(b + 32, i) - ((bit_k(b, i) ^ 1) << 2);
      y[i] = dl * static_cast<float>(q);
    }
  }
}

// Q4_K's and Q5_K's eight 6-bit scales and mins from their 12 packed bytes.
inline void scale_min_k4(const uint8_t* p, int s, int* sc, int* mn) {
  if (s < 4) {
    *sc = p[s] & 0x3F;
    *mn = p[s + 4] & 0x3F;
  } else {
    *sc = (p[s + 4] & 0x0F) | ((p[s - 4] >> 2) & 0x30);
    *mn = (p[s + 4] >> 4) | ((p[s] >> 2) & 0x30);
  }
}

template <bool FIVE>
void q45_k(const uint8_t* b, float* y) {
  const float d = half_at(b), dmin = half_at(b + 2);
  const uint8_t* qs = b + (FIVE ? 48 : 16);
  for (int s = 0; s < 8; ++s) {
    int sc, mn;
    scale_min_k4(b + 4, s, &sc, &mn);
    const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(mn);
    for (int j = 0; j < 32; ++j) {
      const int i = s * 32 + j;
      int q = nibble_k(qs, i, 32);
      if (FIVE) q |= bit_k(b + 16, i) << 4;
      y[i] = dl * static_cast<float>(q) - ml;
    }
  }
}

void q6_k(const uint8_t* b, float* y) {
  const float d = half_at(b + 208);
  const auto* scales = reinterpret_cast<const int8_t*>(b + 192);
  for (int s = 0; s < 16; ++s) {
    const float dl = d * static_cast<float>(scales[s]);
    for (int j = 0; j < 16; ++j) {
      const int i = s * 16 + j;
      const int q = nibble_k(b, i, 64) | (crumb(b + 128, i) << 4);
      y[i] = dl * static_cast<float>(static_cast<int8_t>(q) - 32);
    }
  }
}

void iq4_nl(const uint8_t* b, float* y) {
  const float d = half_at(b);
  for (int j = 0; j < 32; ++j) y[j] = d * IQ4_LEVELS[nibble(b + 2, j)];
}

void iq4_xs(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const int high_bits = b[2] | (b[3] << 8);
  for (int s = 0; s < 8; ++s) {
    const int low = (b[4 + s / 2] >> (s % 2 * 4)) & 0x0F;
    const int high = (high_bits >> (2 * s)) & 3;
    const float dl = d * static_cast<float>(static_cast<int8_t>(low | (high << 4)) - 32);
    for (int j = 0; j < 32; ++j) y[s * 32 + j] = dl * IQ4_LEVELS[nibble(b + 8 + s * 16, j)];
  }
}

struct Type {
  void (*block)(const uint8_t*, float*);
  int64_t values, bytes;
};

// ggml type id -> its block's decoder (chatpage/engine/load/gguf_file.py's TENSOR_TYPES)
bool type_of(int64_t id, Type* t) {
  switch (id) {
    case 0: *t = {f32, 1, 4}; return true;
    case 1: *t = {f16, 1, 2}; return true;
    case 30: *t = {bf16, 1, 2}; return true;
    case 2: *t = {q4_0, 32, 18}; return true;
    case 3: *t = {q4_1, 32, 20}; return true;
    case 6: *t = {q5_0, 32, 22}; return true;
    case 7: *t = {q5_1, 32, 24}; return true;
    case 8: *t = {q8_0, 32, 34}; return true;
    case 10: *t = {q2_k, QK_K, 84}; return true;
    case 11: *t = {q3_k, QK_K, 110}; return true;
    case 12: *t = {q45_k<false>, QK_K, 144}; return true;
    case 13: *t = {q45_k<true>, QK_K, 176}; return true;
    case 14: *t = {q6_k, QK_K, 210}; return true;
    case 20: *t = {iq4_nl, 32, 18}; return true;
    case 23: *t = {iq4_xs, QK_K, 136}; return true;
    default: return false;
  }
}

}  // namespace

void dequantize_gguf(const at::Tensor& blocks, int64_t type_id, const at::Tensor& out,
                     const c10::optional<at::Tensor>& row_order) {
  Type t;
  TORCH_CHECK(type_of(type_id, &t), "dequantize_gguf: unknown ggml type ", type_id);
  TORCH_CHECK(blocks.scalar_type() == at::kByte && blocks.is_contiguous(),
              "dequantize_gguf: blocks must be contiguous uint8");
  TORCH_CHECK(out.scalar_type() == at::kFloat && out.is_contiguous(),
              "dequantize_gguf: out must be contiguous fp32");
  const int64_t n = blocks.numel() / t.bytes;
  TORCH_CHECK(blocks.numel() == n * t.bytes && out.numel() == n * t.values,
              "dequantize_gguf: ", blocks.numel(), " bytes of type ", type_id, " do not make ",
              out.numel(), " values");
  const uint8_t* src = blocks.data_ptr<uint8_t>();
  float* dst = out.data_ptr<float>();
  // block i of the result comes from block order(i) of the file: itself, or with row_order the
  // same block of the file's row row_order[i / row blocks] (llama.cpp's Q/K rows put back)
  int64_t row_blocks = n;
  const int64_t* rows = nullptr;
  if (row_order.has_value()) {
    const at::Tensor& r = *row_order;
    TORCH_CHECK(r.scalar_type() == at::kLong && r.is_contiguous() && r.numel() > 0 &&
                    n % r.numel() == 0,
                "dequantize_gguf: row_order must be contiguous int64 dividing the blocks in rows");
    row_blocks = n / r.numel();
    rows = r.data_ptr<int64_t>();
    for (int64_t i = 0; i < r.numel(); ++i)
      TORCH_CHECK(rows[i] >= 0 && rows[i] < r.numel(), "dequantize_gguf: row ", rows[i],
                  " out of range");
  }
  // a thread per million values at most: a small tensor in one thread, since on a busy machine
  // every parallel region waits for its slowest thread to be scheduled
  const int64_t grain = (int64_t{1} << 20) / t.values;
  at::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t from = rows ? rows[i / row_blocks] * row_blocks + i % row_blocks : i;
      t.block(src + from * t.bytes, dst + i * t.values);
    }
  });
}

}  // namespace chatpage::cpu
