// KV-cache maintenance for CUDA: write_kv, copy_blocks, swap_blocks.
#include "cuda/device_math.cuh"
#include "cuda/kernels.h"

#include <cuda_runtime.h>

namespace chatpage::cuda {
namespace {

constexpr int kThreads = 128;

// One CTA per token; elements are moved as same-sized integers (no dtype conversion here).
template <typename E>
__global__ void write_kv_kernel(const E* key, const E* value, int64_t ks0, int64_t ks1,
                                int64_t vs0, int64_t vs1, E* k_cache, E* v_cache,
                                const int64_t* slot_mapping, int heads, int head_dim) {
  const int64_t t = blockIdx.x;
  const int64_t slot = slot_mapping[t];
  if (slot < 0) return;
  const int row = heads * head_dim;
  E* kd = k_cache + slot * row;
  E* vd = v_cache + slot * row;
  for (int i = threadIdx.x; i < row; i += kThreads) {
    const int h = i / head_dim, d = i % head_dim;
    kd[i] = key[t * ks0 + h * ks1 + d];
    vd[i] = value[t * vs0 + h * vs1 + d];
  }
}

// One CTA per token, one warp per head row at a time: fp32 rows quantized into an int8 cache
// (attention.py's quantize_kv: scale = max |x| / 127 rounded to fp16, q = round(x / scale) with
// an IEEE division, so the same bytes as the reference), the scale's two bytes after the values.
__global__ void write_kv_int8_kernel(const float* key, const float* value, int64_t ks0,
                                     int64_t ks1, int64_t vs0, int64_t vs1, int8_t* k_cache,
                                     int8_t* v_cache, const int64_t* slot_mapping, int heads,
                                     int head_dim) {
  const int64_t t = blockIdx.x;
  const int64_t slot = slot_mapping[t];
  if (slot < 0) return;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, row = head_dim + 2;
  for (int r = warp; r < 2 * heads; r += kThreads / 32) {
    const int h = r % heads;
    const bool is_v = r >= heads;
    const float* x = is_v ? value + t * vs0 + h * vs1 : key + t * ks0 + h * ks1;
    int8_t* dst = (is_v ? v_cache : k_cache) + (slot * heads + h) * row;
    float amax = 0.0f;
    for (int d = lane; d < head_dim; d += 32) amax = fmaxf(amax, fabsf(x[d]));
    amax = warp_max(amax);
    const __half half = __float2half_rn(amax / 127.0f);
    const float scale = __half2float(half);
    for (int d = lane; d < head_dim; d += 32) {
      const float q = scale > 0.0f ? rintf(__fdiv_rn(x[d], scale)) : 0.0f;
      dst[d] = static_cast<int8_t>(fminf(fmaxf(q, -127.0f), 127.0f));
    }
    if (lane == 0) *reinterpret_cast<__half*>(dst + head_dim) = half;
  }
}

// grid (pair, cache): block `dst` of the cache becomes a copy of block `src`.
__global__ void copy_blocks_kernel(const int64_t* cache_ptrs, const int64_t* block_bytes,
                                   const int64_t* pairs) {
  const int64_t pair = blockIdx.x, cache = blockIdx.y;
  char* base = reinterpret_cast<char*>(cache_ptrs[cache]);
  const int64_t bytes = block_bytes[cache];
  const char* src = base + pairs[2 * pair] * bytes;
  char* dst = base + pairs[2 * pair + 1] * bytes;
  const bool wide = bytes % 16 == 0 && reinterpret_cast<uintptr_t>(base) % 16 == 0;
  if (wide) {
    const int4* s = reinterpret_cast<const int4*>(src);
    int4* d = reinterpret_cast<int4*>(dst);
    for (int64_t i = threadIdx.x; i < bytes / 16; i += blockDim.x) d[i] = s[i];
  } else {
    for (int64_t i = threadIdx.x; i < bytes; i += blockDim.x) dst[i] = src[i];
  }
}

template <typename E>
cudaError_t launch_write_kv(const void* key, const void* value, int64_t ks0, int64_t ks1,
                            int64_t vs0, int64_t vs1, void* k_cache, void* v_cache,
                            const int64_t* slots, int num_tokens, int heads, int head_dim,
                            cudaStream_t stream) {
  write_kv_kernel<E><<<num_tokens, kThreads, 0, stream>>>(
      static_cast<const E*>(key), static_cast<const E*>(value), ks0, ks1, vs0, vs1,
      static_cast<E*>(k_cache), static_cast<E*>(v_cache), slots, heads, head_dim);
  return cudaGetLastError();
}

}  // namespace

int write_kv(const void* key, const void* value, int64_t k_row_stride, int64_t k_head_stride,
             int64_t v_row_stride, int64_t v_head_stride, void* k_cache, void* v_cache,
             const int64_t* slot_mapping, int num_tokens, int heads, int head_dim, DType dtype,
             void* stream) {
  if (num_tokens == 0) return cudaSuccess;
  auto st = static_cast<cudaStream_t>(stream);
  if (dtype == DType::kInt8) {
    write_kv_int8_kernel<<<num_tokens, kThreads, 0, st>>>(
        static_cast<const float*>(key), static_cast<const float*>(value), k_row_stride,
        k_head_stride, v_row_stride, v_head_stride, static_cast<int8_t*>(k_cache),
        static_cast<int8_t*>(v_cache), slot_mapping, heads, head_dim);
    return cudaGetLastError();
  }
  if (dtype == DType::kFloat32) {
    return launch_write_kv<uint32_t>(key, value, k_row_stride, k_head_stride, v_row_stride,
                                     v_head_stride, k_cache, v_cache, slot_mapping, num_tokens,
                                     heads, head_dim, st);
  }
  return launch_write_kv<uint16_t>(key, value, k_row_stride, k_head_stride, v_row_stride,
                                   v_head_stride, k_cache, v_cache, slot_mapping, num_tokens, heads,
                                   head_dim, st);
}

int copy_blocks(const int64_t* cache_ptrs, const int64_t* block_bytes, int num_caches,
                const int64_t* pairs, int num_pairs, void* stream) {
  if (num_caches == 0 || num_pairs == 0) return cudaSuccess;
  copy_blocks_kernel<<<dim3(num_pairs, num_caches), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      cache_ptrs, block_bytes, pairs);
  return cudaGetLastError();
}

int swap_blocks(const void* src, void* dst, int64_t block_bytes, const int64_t* host_pairs,
                int num_pairs, bool dst_is_host, void* stream) {
  auto st = static_cast<cudaStream_t>(stream);
  const char* s = static_cast<const char*>(src);
  char* d = static_cast<char*>(dst);
  for (int i = 0; i < num_pairs; ++i) {
    const cudaError_t err =
        cudaMemcpyAsync(d + host_pairs[2 * i + 1] * block_bytes, s + host_pairs[2 * i] * block_bytes,
                        block_bytes, cudaMemcpyDefault, st);
    if (err != cudaSuccess) return err;
  }
  return dst_is_host ? cudaStreamSynchronize(st) : cudaSuccess;
}

}  // namespace chatpage::cuda
