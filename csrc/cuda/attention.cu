// Paged attention for CUDA (fp32, fp16, bf16 and int8 caches; fp32 accumulation). An int8 row's
// scale (after its values) multiplies its key's dot product and its value's weight.
//
// One thread block (CTA) per (query row, KV head, group of that head's query heads, context
// partition). It walks its keys in chunks of kChunk: scores for the chunk go to shared memory
// (8 lanes per key, the key read once for all query heads of the CTA), an online-softmax step
// rescales the running state, and each thread accumulates its share of the output elements over
// the chunk's values. With one partition the CTA writes the output; with several (split-K, for long
// contexts when rows x heads alone cannot fill the GPU) it writes its unnormalised partial result
// and reduce_partitions_kernel merges them. With a sliding window a row's keys start at
// position - window + 1: partitions wholly before that exit at once, and no earlier block is read.
#include "cuda/device_math.cuh"
#include "cuda/kernels.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <type_traits>

namespace chatpage::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = 256;            // keys per softmax step
constexpr int kLanesPerKey = 8;        // lanes that share one key's dot products
constexpr int kKeysPerPass = kThreads / kLanesPerKey;
constexpr int kMaxHeadDim = 256;
constexpr int kMaxPerLane = kMaxHeadDim / kLanesPerKey;
constexpr int kMaxHeadsPerCta = 16;
constexpr int kMaxElemsPerThread = 16;  // heads_per_cta * head_dim <= kThreads * 16
constexpr int kMaxPartitions = 64;

// The sequence owning query row `row` (query_start_loc[s] <= row < query_start_loc[s + 1]), or -1.
__device__ int find_seq(const int32_t* qsl, int num_seqs, int row) {
  if (num_seqs <= 0 || row < qsl[0] || row >= qsl[num_seqs]) return -1;
  int lo = 0, hi = num_seqs;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (qsl[mid] <= row) lo = mid; else hi = mid;
  }
  return lo;
}

// Position of `row` in sequence s: it sees keys up to position.
__device__ __forceinline__ int row_position(const AttentionParams& p, int s, int row) {
  const int q_len = p.query_start_loc[s + 1] - p.query_start_loc[s];
  return p.seq_lens[s] - q_len + (row - p.query_start_loc[s]);
}

// The first key a row of `ctx` keys attends to (its sliding window's, or 0).
__device__ __forceinline__ int first_key(const AttentionParams& p, int ctx) {
  return p.window > 0 ? max(0, ctx - p.window) : 0;
}

struct Launch {
  int heads_per_cta;
  int head_groups;  // CTAs per KV head
  int partition_tokens;
  int num_partitions;
};

template <typename CT, typename IT>
__global__ void __launch_bounds__(kThreads)
    paged_attention_kernel(AttentionParams p, Launch l) {
  extern __shared__ float smem[];
  const int hpc = l.heads_per_cta, D = p.head_dim, bs = p.block_size;
  float* q_s = smem;                    // [hpc][D], pre-scaled
  float* logits = q_s + hpc * D;        // [hpc][kChunk]: scores, then probabilities
  float* m_s = logits + hpc * kChunk;   // running max per head
  float* l_s = m_s + hpc;               // running sum per head
  float* alpha_s = l_s + hpc;           // rescale factor of the current chunk
  float* red = alpha_s + hpc;           // [kThreads] slice reduction
  int* blocks_s = reinterpret_cast<int*>(red + kThreads);  // physical blocks of the chunk

  const int row = blockIdx.x, tid = threadIdx.x;
  const int s = find_seq(p.query_start_loc, p.num_seqs, row);
  if (s < 0) return;
  const int ctx = row_position(p, s, row) + 1;
  const int part_begin = blockIdx.z * l.partition_tokens;
  const int t_begin = max(part_begin, first_key(p, ctx));
  // (clamped to the table's width, so a seq_len beyond it cannot read past the row)
  const int t_end = min(min(ctx, part_begin + l.partition_tokens), p.max_blocks * bs);
  // this partition lies past the row's causal limit or before its window
  if (t_begin >= t_end) return;

  const int group = p.num_q_heads / p.num_kv_heads;
  const int kvh = blockIdx.y / l.head_groups;
  const int g0 = (blockIdx.y % l.head_groups) * hpc;
  const int ng = min(hpc, group - g0);
  const int h0 = kvh * group + g0;  // first query head of this CTA

  const IT* query = static_cast<const IT*>(p.query);
  for (int i = tid; i < ng * D; i += kThreads) {
    const int g = i / D, d = i % D;
    q_s[i] = to_float(query[row * p.q_row_stride + (h0 + g) * p.q_head_stride + d]) * p.scale;
  }
  if (tid < ng) {
    m_s[tid] = -FLT_MAX;
    l_s[tid] = 0.0f;
  }

  // Output elements e = g * D + d. With fewer elements than threads, `slices` groups of threads
  // each take every slices-th key and are summed at the end.
  const int E = ng * D;
  const int slices = E >= kThreads ? 1 : kThreads / E;
  const int slice = E >= kThreads ? 0 : tid / E;
  const bool pv_active = E >= kThreads || tid < slices * E;
  const int e_first = E >= kThreads ? tid : tid % E;
  float acc[kMaxElemsPerThread];
#pragma unroll
  for (int k = 0; k < kMaxElemsPerThread; ++k) acc[k] = 0.0f;

  const CT* k_cache = static_cast<const CT*>(p.k_cache);
  const CT* v_cache = static_cast<const CT*>(p.v_cache);
  const int hs = D + (std::is_same_v<CT, int8_t> ? 2 : 0);  // elements of a head's row
  const int64_t tok_stride = static_cast<int64_t>(p.num_kv_heads) * hs;
  const int64_t blk_stride = tok_stride * bs;
  const int32_t* table = p.block_tables + static_cast<int64_t>(s) * p.max_blocks;
  const int lane = tid % 32, warp = tid / 32;
  const int lane8 = tid % kLanesPerKey, key_slot = tid / kLanesPerKey;
  __syncthreads();

  for (int c0 = t_begin; c0 < t_end; c0 += kChunk) {
    const int n = min(kChunk, t_end - c0);
    const int b_first = c0 / bs;
    const int nb = (c0 + n - 1) / bs - b_first + 1;
    for (int i = tid; i < nb; i += kThreads) blocks_s[i] = table[b_first + i];
    __syncthreads();

    // scores: every key is read once, its slice kept in registers for all ng heads
    for (int base = 0; base < n; base += kKeysPerPass) {
      const int i = base + key_slot;
      const bool valid = i < n;
      float kreg[kMaxPerLane];
      float kscale = 1.0f;
      if (valid) {
        const int t = c0 + i;
        const CT* kp = k_cache + blocks_s[t / bs - b_first] * blk_stride + (t % bs) * tok_stride +
                       kvh * hs;
        kscale = row_scale(kp, D);
#pragma unroll
        for (int j = 0; j < kMaxPerLane; ++j) {
          const int d = lane8 + j * kLanesPerKey;
          kreg[j] = d < D ? to_float(kp[d]) : 0.0f;
        }
      }
      for (int g = 0; g < ng; ++g) {
        float dot = 0.0f;
        if (valid) {
#pragma unroll
          for (int j = 0; j < kMaxPerLane; ++j) {
            const int d = lane8 + j * kLanesPerKey;
            if (d < D) dot += q_s[g * D + d] * kreg[j];
          }
        }
        for (int o = kLanesPerKey / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        if (valid && lane8 == 0) logits[g * kChunk + i] = dot * kscale;
      }
    }
    __syncthreads();

    // online softmax, one warp per head
    for (int g = warp; g < ng; g += kWarps) {
      float* lg = logits + g * kChunk;
      float mx = -FLT_MAX;
      for (int i = lane; i < n; i += 32) mx = fmaxf(mx, lg[i]);
      mx = warp_max(mx);
      const float m_old = m_s[g];
      const float m_new = fmaxf(m_old, mx);
      float sum = 0.0f;
      for (int i = lane; i < n; i += 32) {
        const float e = expf(lg[i] - m_new);
        lg[i] = e;
        sum += e;
      }
      sum = warp_sum(sum);
      if (lane == 0) {
        const float alpha = expf(m_old - m_new);  // 0 on the first chunk (m_old = -FLT_MAX)
        alpha_s[g] = alpha;
        l_s[g] = l_s[g] * alpha + sum;
        m_s[g] = m_new;
      }
    }
    __syncthreads();

    // values: acc[e] = alpha * acc[e] + sum_i p[g][i] * v[i][d]
    if (pv_active) {
#pragma unroll
      for (int k = 0; k < kMaxElemsPerThread; ++k) {
        const int e = e_first + k * kThreads;
        if ((k == 0 || slices == 1) && e < E) {
          const int g = e / D, d = e % D;
          const float* pg = logits + g * kChunk;
          float a = acc[k] * alpha_s[g];
          for (int i = slice; i < n; i += slices) {
            const int t = c0 + i;
            const CT* vp = v_cache + blocks_s[t / bs - b_first] * blk_stride +
                           (t % bs) * tok_stride + kvh * hs;
            a += pg[i] * row_scale(vp, D) * to_float(vp[d]);
          }
          acc[k] = a;
        }
      }
    }
    __syncthreads();  // logits and blocks_s are rewritten by the next chunk
  }

  if (slices > 1) {
    red[tid] = pv_active ? acc[0] : 0.0f;
    __syncthreads();
    if (tid < E) {
      float a = 0.0f;
      for (int sl = 0; sl < slices; ++sl) a += red[sl * E + tid];
      acc[0] = a;
    }
  }
  const int owned = slices > 1 ? (tid < E ? 1 : 0) : kMaxElemsPerThread;
#pragma unroll
  for (int k = 0; k < kMaxElemsPerThread; ++k) {
    const int e = tid + k * kThreads;
    if (k < owned && e < E) {
      const int g = e / D, d = e % D, h = h0 + g;
      if (l.num_partitions == 1) {
        const float sum = l_s[g];
        IT* out = static_cast<IT*>(p.out);
        out[row * p.out_row_stride + h * p.out_head_stride + d] =
            from_float<IT>(sum > 0.0f ? acc[k] / sum : 0.0f);
      } else {
        const int64_t slot =
            (static_cast<int64_t>(row) * p.num_q_heads + h) * l.num_partitions + blockIdx.z;
        const int64_t stats = static_cast<int64_t>(p.num_tokens) * p.num_q_heads * l.num_partitions;
        p.workspace[2 * stats + slot * D + d] = acc[k];
        if (d == 0) {
          p.workspace[slot] = m_s[g];
          p.workspace[stats + slot] = l_s[g];
        }
      }
    }
  }
}

// Merges the partial results of the partitions a row really used.
template <typename IT>
__global__ void __launch_bounds__(kThreads) reduce_partitions_kernel(AttentionParams p, Launch l) {
  const int row = blockIdx.x, h = blockIdx.y;
  const int s = find_seq(p.query_start_loc, p.num_seqs, row);
  if (s < 0) return;
  const int ctx = row_position(p, s, row) + 1;
  const int first = first_key(p, ctx) / l.partition_tokens;
  const int used = min((ctx + l.partition_tokens - 1) / l.partition_tokens, l.num_partitions);
  const int64_t slot0 = (static_cast<int64_t>(row) * p.num_q_heads + h) * l.num_partitions;
  const int64_t stats = static_cast<int64_t>(p.num_tokens) * p.num_q_heads * l.num_partitions;
  const float* m = p.workspace + slot0;
  const float* sums = p.workspace + stats + slot0;
  const float* accs = p.workspace + 2 * stats + slot0 * p.head_dim;

  __shared__ float weight[kMaxPartitions];
  __shared__ float inv_total;
  if (threadIdx.x == 0) {
    float gm = -FLT_MAX;
    for (int i = first; i < used; ++i) gm = fmaxf(gm, m[i]);
    float total = 0.0f;
    for (int i = first; i < used; ++i) {
      weight[i] = expf(m[i] - gm);
      total += sums[i] * weight[i];
    }
    inv_total = total > 0.0f ? 1.0f / total : 0.0f;
  }
  __syncthreads();
  IT* out = static_cast<IT*>(p.out);
  for (int d = threadIdx.x; d < p.head_dim; d += kThreads) {
    float a = 0.0f;
    for (int i = first; i < used; ++i) a += accs[i * p.head_dim + d] * weight[i];
    out[row * p.out_row_stride + h * p.out_head_stride + d] = from_float<IT>(a * inv_total);
  }
}

// Query heads of one GQA group handled by one CTA (bounded by registers and shared memory).
int heads_per_cta(const AttentionParams& p) {
  const int group = p.num_q_heads / p.num_kv_heads;
  return std::min({group, kMaxHeadsPerCta, kThreads * kMaxElemsPerThread / p.head_dim});
}

Launch make_launch(const AttentionParams& p, const AttentionPlan& plan) {
  Launch l;
  const int group = p.num_q_heads / p.num_kv_heads;
  l.heads_per_cta = heads_per_cta(p);
  l.head_groups = (group + l.heads_per_cta - 1) / l.heads_per_cta;
  l.partition_tokens = plan.partition_tokens;
  l.num_partitions = plan.num_partitions;
  return l;
}

size_t shared_bytes(const Launch& l, int head_dim, int block_size) {
  const size_t floats = static_cast<size_t>(l.heads_per_cta) * (head_dim + kChunk + 3) + kThreads;
  const size_t ints = kChunk / block_size + 2;
  return (floats + ints) * sizeof(float);
}

template <typename CT, typename IT>
cudaError_t launch(const AttentionParams& p, const AttentionPlan& plan, cudaStream_t stream) {
  const Launch l = make_launch(p, plan);
  const dim3 grid(p.num_tokens, p.num_kv_heads * l.head_groups, l.num_partitions);
  paged_attention_kernel<CT, IT>
      <<<grid, kThreads, shared_bytes(l, p.head_dim, p.block_size), stream>>>(p, l);
  if (l.num_partitions > 1) {
    reduce_partitions_kernel<IT><<<dim3(p.num_tokens, p.num_q_heads), kThreads, 0, stream>>>(p, l);
  }
  return cudaGetLastError();
}

template <typename CT>
cudaError_t launch_io(const AttentionParams& p, const AttentionPlan& plan, cudaStream_t stream) {
  if (p.io_dtype == DType::kFloat32) return launch<CT, float>(p, plan, stream);
  return launch<CT, CT>(p, plan, stream);
}

}  // namespace

AttentionPlan plan_paged_attention(const AttentionParams& p, int device) {
  AttentionPlan plan{1, kChunk, 0};
  const int max_ctx = p.max_blocks * p.block_size;
  const int chunks = (max_ctx + kChunk - 1) / kChunk;
  plan.partition_tokens = std::max(chunks, 1) * kChunk;
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) sms = 1;
  const int group = p.num_q_heads / p.num_kv_heads;
  const int hpc = heads_per_cta(p);
  const int64_t ctas = static_cast<int64_t>(p.num_tokens) * p.num_kv_heads * ((group + hpc - 1) / hpc);
  if (chunks > 1 && ctas < 2 * static_cast<int64_t>(sms)) {
    // enough partitions for ~2 CTAs per SM, each a whole number of chunks
    const int want = static_cast<int>(
        std::min<int64_t>({(2 * sms + ctas - 1) / ctas, kMaxPartitions, chunks}));
    const int per_part = (chunks + want - 1) / want;
    plan.partition_tokens = per_part * kChunk;
    plan.num_partitions = (chunks + per_part - 1) / per_part;
  }
  if (plan.num_partitions > 1) {
    plan.workspace_floats = static_cast<int64_t>(p.num_tokens) * p.num_q_heads *
                            plan.num_partitions * (p.head_dim + 2);
  }
  return plan;
}

int paged_attention(const AttentionParams& p, const AttentionPlan& plan, void* stream) {
  if (p.num_tokens == 0 || p.num_seqs == 0) return cudaSuccess;
  if (p.head_dim > kMaxHeadDim || p.head_dim <= 0) return cudaErrorInvalidValue;
  auto st = static_cast<cudaStream_t>(stream);
  switch (p.cache_dtype) {
    case DType::kFloat32: return launch<float, float>(p, plan, st);
    case DType::kFloat16: return launch_io<__half>(p, plan, st);
    case DType::kBFloat16: return launch_io<__nv_bfloat16>(p, plan, st);
    case DType::kInt8: return launch<int8_t, float>(p, plan, st);
  }
  return cudaErrorInvalidValue;
}

const char* error_string(int code) { return cudaGetErrorString(static_cast<cudaError_t>(code)); }

}  // namespace chatpage::cuda
