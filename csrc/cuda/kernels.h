// Launch functions of the CUDA kernels: plain C++ types only, so that the .cu files compile with
// nvcc alone (no torch headers) and torch_binding.cpp needs no CUDA headers to call them.
// Every function returns a cudaError_t as an int (0 = success); error_string() describes it.
// `stream` is a cudaStream_t.
#pragma once

#include <cstdint>

namespace chatpage::cuda {

enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2, kInt8 = 3 };

struct AttentionParams {
  void* out;  // [num_tokens, num_q_heads, head_dim] of io_dtype, unit stride along head_dim
  int64_t out_row_stride, out_head_stride;
  const void* query;  // same layout and dtype as out
  int64_t q_row_stride, q_head_stride;
  // [num_blocks, block_size, num_kv_heads, head_dim] of cache_dtype; an int8 cache's rows are
  // head_dim values then their fp16 scale (head_dim + 2 bytes: attention.py's quantize_kv)
  const void* k_cache;
  const void* v_cache;
  const int32_t* block_tables;  // [num_seqs, max_blocks] contiguous
  const int32_t* seq_lens;      // [num_seqs]
  const int32_t* query_start_loc;  // [num_seqs + 1]
  int num_tokens, num_seqs, num_q_heads, num_kv_heads, head_dim, block_size, max_blocks;
  float scale;
  int window;  // 0: every earlier key; else the query at position p sees keys p - window < j <= p
  DType cache_dtype, io_dtype;  // io_dtype is cache_dtype or kFloat32 (always, for kInt8)
  float* workspace;             // plan.workspace_floats floats when the plan splits the context
};

// How the context is split across thread blocks (split-K); decided from shapes alone.
struct AttentionPlan {
  int num_partitions;    // 1: a single pass writes `out` directly
  int partition_tokens;  // keys per partition
  int64_t workspace_floats;
};

AttentionPlan plan_paged_attention(const AttentionParams& p, int device);
int paged_attention(const AttentionParams& p, const AttentionPlan& plan, void* stream);

// key/value: [num_tokens, heads, head_dim] of the cache dtype with unit stride along head_dim
// (fp32 for an int8 cache, which they are quantized into row by row).
int write_kv(const void* key, const void* value, int64_t k_row_stride, int64_t k_head_stride,
             int64_t v_row_stride, int64_t v_head_stride, void* k_cache, void* v_cache,
             const int64_t* slot_mapping, int num_tokens, int heads, int head_dim, DType dtype,
             void* stream);

// cache_ptrs/block_bytes: one entry per cache; pairs: [num_pairs, 2] (src, dst); all on the device.
int copy_blocks(const int64_t* cache_ptrs, const int64_t* block_bytes, int num_caches,
                const int64_t* pairs, int num_pairs, void* stream);

// host_pairs lives in host memory; src/dst may each be device or host memory. When dst is host
// memory the call waits for the copies to finish.
int swap_blocks(const void* src, void* dst, int64_t block_bytes, const int64_t* host_pairs,
                int num_pairs, bool dst_is_host, void* stream);

// The decode step's fused ops (chatpage/engine/model/fused.py is their reference); every tensor is
// contiguous and on the device. add_rms_norm: hidden [rows, n] fp32, += delta (when not null),
// then out [rows, n] = weight * rmsnorm(hidden). rope_qkv: qkv [rows, (q_heads + 2 kv_heads) *
// head_dim] into fp32 q [rows, q_heads, head_dim], k and v [rows, kv_heads, head_dim], q and k
// rotated by the fp32 cos/sin tables [max_pos, head_dim] at positions [rows]. silu_mul: out
// [rows, n] = silu(gate) * up for gate_up [rows, 2n] = [gate | up].
int add_rms_norm(float* hidden, const void* delta, DType delta_dtype, const float* weight,
                 float eps, void* out, DType out_dtype, int rows, int n, void* stream);
int rope_qkv(const void* qkv, DType qkv_dtype, const int64_t* positions, const float* cos,
             const float* sin, int64_t max_pos, float* q, float* k, float* v, int rows,
             int q_heads, int kv_heads, int head_dim, void* stream);
int silu_mul(const void* gate_up, DType in_dtype, void* out, DType out_dtype, int rows, int n,
             void* stream);

const char* error_string(int code);

}  // namespace chatpage::cuda
