// What the kernels on Intel AMX's tiles share (gemm.cpp, gemm_q8.cpp, attention.cpp): a tile
// configuration and its load, and a 16 x 16 transpose of 32-bit lanes (the pairs of bf16 values
// AMX's B operand takes, VNNI).
#pragma once

#include <cstdint>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace chatpage::cpu {

// An AMX tile configuration (palette 1: rows and bytes per row of each of the 8 tiles), loaded
// with load_tile_config by each thread before its tiles are used.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

#if defined(__AMX_TILE__)
inline void load_tile_config(const TileConfig& config) {
  // GCC (12) drops the stores that filled `config` as dead without this: it does not see
  // ldtilecfg read them
  asm volatile("" : : "r"(&config) : "memory");
  _tile_loadconfig(&config);
}

// Every tile 16 rows of 64 bytes.
inline void configure_full_tiles() {
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.colsb[t] = 64;
    config.rows[t] = 16;
  }
  load_tile_config(config);
}
#endif

#if defined(__AVX512F__)
// r[i] lane j -> r[j] lane i, for 16 vectors of 16 32-bit lanes: pairs of lanes interleaved, then
// pairs of pairs, then 128-bit quarters twice over.
inline void transpose16(__m512i (&r)[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  // u[4 i + c], quarter q: lane 4 q + c of rows 4 i .. 4 i + 3
  for (int i = 0; i < 16; i += 4) {
    u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i even = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x88);  // quarters 0, 2 of each
    const __m512i odd = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xDD);   // quarters 1, 3
    const __m512i even2 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x88);
    const __m512i odd2 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xDD);
    r[c] = _mm512_shuffle_i32x4(even, even2, 0x88);
    r[4 + c] = _mm512_shuffle_i32x4(odd, odd2, 0x88);
    r[8 + c] = _mm512_shuffle_i32x4(even, even2, 0xDD);
    r[12 + c] = _mm512_shuffle_i32x4(odd, odd2, 0xDD);
  }
}
#endif

}  // namespace chatpage::cpu
