// Device helpers shared by the CUDA kernels: dtype conversions through fp32 and warp reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace chatpage::cuda {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(int8_t x) { return static_cast<float>(x); }

// The scale of a cache row of head_dim values: an int8 row's fp16 scale after its values (the
// row starts at an even byte: head_dim + 2 bytes apart, head_dim even), 1 for other dtypes.
template <typename CT>
__device__ __forceinline__ float row_scale(const CT*, int) {
  return 1.0f;
}
template <>
__device__ __forceinline__ float row_scale<int8_t>(const int8_t* row, int head_dim) {
  return __half2float(*reinterpret_cast<const __half*>(row + head_dim));
}

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

__device__ __forceinline__ float warp_max(float x) {
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float warp_sum(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

}  // namespace chatpage::cuda
