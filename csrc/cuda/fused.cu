// The decode step's small per-layer ops for CUDA: residual add + RMSNorm, RoPE + QKV split, SwiGLU.
//
// The same ops as csrc/cpu/fused.cpp, with chatpage/engine/model/fused.py as their reference: each reads
// fp32, fp16 or bf16, accumulates in fp32 and writes its output dtype, in one kernel launch where
// torch would launch several. Rows are contiguous; one CTA per row (a decode step has few rows).
#include "cuda/device_math.cuh"
#include "cuda/kernels.h"

#include <cuda_runtime.h>

#include <cassert>

namespace chatpage::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// Calls fn(T{}) with T the C++ type of `t`.
template <typename Fn>
int with_type(DType t, Fn&& fn) {
  switch (t) {
    case DType::kFloat32: return fn(float{});
    case DType::kFloat16: return fn(__half{});
    case DType::kBFloat16: return fn(__nv_bfloat16{});
    case DType::kInt8: break;  // (the fused ops take no int8 tensors)
  }
  return cudaErrorInvalidValue;
}

// The sum of x over the CTA, returned to every thread.
__device__ float block_sum(float x) {
  __shared__ float partial[kWarps];
  x = warp_sum(x);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = x;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < kWarps; ++w) total += partial[w];
  return total;
}

// hidden[r] += delta[r] (when given); out[r] = weight * hidden[r] / rms(hidden[r]).
template <typename D, typename O>
__global__ void add_rms_norm_kernel(float* hidden, const D* delta, const float* weight, float eps,
                                    O* out, int n) {
  float* h = hidden + static_cast<int64_t>(blockIdx.x) * n;
  O* o = out + static_cast<int64_t>(blockIdx.x) * n;
  float squares = 0.f;
  for (int i = threadIdx.x; i < n; i += kThreads) {
    float x = h[i];
    if (delta != nullptr) {
      x += to_float(delta[static_cast<int64_t>(blockIdx.x) * n + i]);
      h[i] = x;
    }
    squares += x * x;
  }
  const float inv = rsqrtf(block_sum(squares) / static_cast<float>(n) + eps);
  for (int i = threadIdx.x; i < n; i += kThreads) o[i] = from_float<O>(weight[i] * (h[i] * inv));
}

// Row r of qkv is [q heads | k heads | v heads] x dim; q and k are rotated (rotate-half) by the
// tables' row positions[r], v is copied.
template <typename I>
__global__ void rope_qkv_kernel(const I* qkv, const int64_t* positions, const float* cos,
                                const float* sin, int64_t max_pos, float* q, float* k, float* v,
                                int q_heads, int kv_heads, int dim) {
  const int64_t r = blockIdx.x;
  const int64_t pos = positions[r];
  assert(pos >= 0 && pos < max_pos);  // like torch's device-side index check
  const int half = dim / 2;
  const I* x = qkv + r * (q_heads + 2 * kv_heads) * dim;
  const float* c = cos + pos * dim;
  const float* s = sin + pos * dim;
  for (int i = threadIdx.x; i < (q_heads + kv_heads) * half; i += kThreads) {
    const int head = i / half, j = i % half;
    const float a = to_float(x[head * dim + j]), b = to_float(x[head * dim + j + half]);
    float* dst = head < q_heads ? q + (r * q_heads + head) * dim
                                : k + (r * kv_heads + head - q_heads) * dim;
    dst[j] = a * c[j] - b * s[j];
    dst[j + half] = b * c[j + half] + a * s[j + half];
  }
  const I* vs = x + (q_heads + kv_heads) * dim;
  for (int i = threadIdx.x; i < kv_heads * dim; i += kThreads) v[r * kv_heads * dim + i] = to_float(vs[i]);
}

// out[r] = silu(gate[r]) * up[r] for gate_up[r] = [gate | up].
template <typename I, typename O>
__global__ void silu_mul_kernel(const I* gate_up, O* out, int n) {
  const I* g = gate_up + static_cast<int64_t>(blockIdx.x) * 2 * n;
  O* o = out + static_cast<int64_t>(blockIdx.x) * n;
  for (int i = threadIdx.x; i < n; i += kThreads) {
    const float gv = to_float(g[i]);
    o[i] = from_float<O>(gv / (1.f + __expf(-gv)) * to_float(g[n + i]));
  }
}

}  // namespace

int add_rms_norm(float* hidden, const void* delta, DType delta_dtype, const float* weight,
                 float eps, void* out, DType out_dtype, int rows, int n, void* stream) {
  if (rows == 0) return cudaSuccess;
  auto st = static_cast<cudaStream_t>(stream);
  return with_type(delta_dtype, [&](auto d) {
    using D = decltype(d);
    return with_type(out_dtype, [&](auto o) {
      using O = decltype(o);
      add_rms_norm_kernel<D, O><<<rows, kThreads, 0, st>>>(
          hidden, static_cast<const D*>(delta), weight, eps, static_cast<O*>(out), n);
      return static_cast<int>(cudaGetLastError());
    });
  });
}

int rope_qkv(const void* qkv, DType qkv_dtype, const int64_t* positions, const float* cos,
             const float* sin, int64_t max_pos, float* q, float* k, float* v, int rows,
             int q_heads, int kv_heads, int head_dim, void* stream) {
  if (rows == 0) return cudaSuccess;
  auto st = static_cast<cudaStream_t>(stream);
  return with_type(qkv_dtype, [&](auto i) {
    using I = decltype(i);
    rope_qkv_kernel<I><<<rows, kThreads, 0, st>>>(static_cast<const I*>(qkv), positions, cos, sin,
                                                  max_pos, q, k, v, q_heads, kv_heads, head_dim);
    return static_cast<int>(cudaGetLastError());
  });
}

int silu_mul(const void* gate_up, DType in_dtype, void* out, DType out_dtype, int rows, int n,
             void* stream) {
  if (rows == 0) return cudaSuccess;
  auto st = static_cast<cudaStream_t>(stream);
  return with_type(in_dtype, [&](auto i) {
    using I = decltype(i);
    return with_type(out_dtype, [&](auto o) {
      using O = decltype(o);
      silu_mul_kernel<I, O><<<rows, kThreads, 0, st>>>(static_cast<const I*>(gate_up),
                                                        static_cast<O*>(out), n);
      return static_cast<int>(cudaGetLastError());
    });
  });
}

}  // namespace chatpage::cuda
