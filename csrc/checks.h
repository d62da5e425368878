// Argument checks shared by the CPU and CUDA implementations of the chatpage ops.
//
// They mirror what the torch reference (chatpage/engine/model/attention.py) accepts, so that a bad call
// fails with a readable message instead of reading out of bounds.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>

namespace chatpage {

// Geometry of one call to paged_attention, read off the tensors.
struct AttentionShape {
  int64_t num_tokens;    // T: rows of query/out
  int64_t num_q_heads;   // Hq
  int64_t num_kv_heads;  // Hkv
  int64_t head_dim;      // D
  int64_t num_blocks;    // blocks in the cache pool
  int64_t block_size;    // tokens per block
  int64_t num_seqs;      // S
  int64_t max_blocks;    // columns of block_tables
};

// An int8 cache's row (one token's one KV head) is head_dim int8 values, then their fp16 scale
// (chatpage/engine/model/attention.py's quantize_kv): this many bytes past the values.
constexpr int64_t kInt8ScaleBytes = 2;

// The head_dim a cache holds: its last dim, less an int8 cache's scale bytes.
inline int64_t cache_head_dim(const at::Tensor& cache) {
  return cache.size(3) - (cache.scalar_type() == at::kChar ? kInt8ScaleBytes : 0);
}

inline void check_cache_pair(const at::Tensor& k_cache, const at::Tensor& v_cache) {
  TORCH_CHECK(k_cache.dim() == 4, "chatpage: k_cache must be [num_blocks, block_size, kv_heads, head_dim]");
  TORCH_CHECK(k_cache.sizes() == v_cache.sizes(), "chatpage: k_cache and v_cache shapes differ");
  TORCH_CHECK(k_cache.scalar_type() == v_cache.scalar_type(), "chatpage: k_cache and v_cache dtypes differ");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "chatpage: caches must be contiguous");
  TORCH_CHECK(k_cache.device() == v_cache.device(), "chatpage: caches on different devices");
}

inline AttentionShape check_attention_args(const at::Tensor& out, const at::Tensor& query,
                                           const at::Tensor& k_cache, const at::Tensor& v_cache,
                                           const at::Tensor& block_tables,
                                           const at::Tensor& seq_lens,
                                           const at::Tensor& query_start_loc) {
  check_cache_pair(k_cache, v_cache);
  TORCH_CHECK(query.dim() == 3, "chatpage: query must be [tokens, q_heads, head_dim]");
  TORCH_CHECK(out.sizes() == query.sizes(), "chatpage: out and query shapes differ");
  AttentionShape s;
  s.num_tokens = query.size(0);
  s.num_q_heads = query.size(1);
  s.head_dim = query.size(2);
  s.num_blocks = k_cache.size(0);
  s.block_size = k_cache.size(1);
  s.num_kv_heads = k_cache.size(2);
  TORCH_CHECK(cache_head_dim(k_cache) == s.head_dim, "chatpage: query and cache head_dim differ");
  TORCH_CHECK(s.num_kv_heads > 0 && s.num_q_heads % s.num_kv_heads == 0,
              "chatpage: q_heads must be a multiple of kv_heads");
  TORCH_CHECK(block_tables.dim() == 2, "chatpage: block_tables must be [seqs, max_blocks]");
  TORCH_CHECK(seq_lens.dim() == 1 && query_start_loc.dim() == 1,
              "chatpage: seq_lens and query_start_loc must be 1-d");
  s.num_seqs = seq_lens.size(0);
  s.max_blocks = block_tables.size(1);
  TORCH_CHECK(block_tables.size(0) >= s.num_seqs, "chatpage: block_tables has fewer rows than seq_lens");
  TORCH_CHECK(query_start_loc.size(0) == s.num_seqs + 1,
              "chatpage: query_start_loc must have num_seqs + 1 entries");
  for (const at::Tensor* t : {&block_tables, &seq_lens, &query_start_loc}) {
    TORCH_CHECK(t->scalar_type() == at::kInt || t->scalar_type() == at::kLong,
                "chatpage: index tensors must be int32 or int64");
  }
  return s;
}

// src_to_dst / mapping: [N, 2] integer pairs.
inline void check_pairs(const at::Tensor& pairs) {
  TORCH_CHECK(pairs.dim() == 2 && pairs.size(1) == 2, "chatpage: block mapping must be [N, 2]");
  TORCH_CHECK(pairs.scalar_type() == at::kInt || pairs.scalar_type() == at::kLong,
              "chatpage: block mapping must be int32 or int64");
}

inline void check_write_kv_args(const at::Tensor& key, const at::Tensor& value,
                                const at::Tensor& k_cache, const at::Tensor& v_cache,
                                const at::Tensor& slot_mapping) {
  check_cache_pair(k_cache, v_cache);
  TORCH_CHECK(key.dim() == 3 && key.sizes() == value.sizes(), "chatpage: key/value must be [tokens, kv_heads, head_dim]");
  TORCH_CHECK(key.size(1) == k_cache.size(2) && key.size(2) == cache_head_dim(k_cache),
              "chatpage: key/value heads or head_dim do not match the cache");
  TORCH_CHECK(slot_mapping.dim() == 1 && slot_mapping.size(0) == key.size(0),
              "chatpage: slot_mapping must have one entry per token");
  TORCH_CHECK(slot_mapping.scalar_type() == at::kInt || slot_mapping.scalar_type() == at::kLong,
              "chatpage: slot_mapping must be int32 or int64");
}

inline void check_swap_args(const at::Tensor& src, const at::Tensor& dst, const at::Tensor& mapping) {
  check_pairs(mapping);
  TORCH_CHECK(src.dim() >= 1 && src.sizes().slice(1) == dst.sizes().slice(1),
              "chatpage: swap_blocks pools have different block shapes");
  TORCH_CHECK(src.scalar_type() == dst.scalar_type(), "chatpage: swap_blocks pools have different dtypes");
  TORCH_CHECK(src.is_contiguous() && dst.is_contiguous(), "chatpage: swap_blocks pools must be contiguous");
}

// The values of the index tensors, which the kernels trust: every sequence's queries fit in its
// length and in the query rows, its block-table row is wide enough, and every block id it reads is
// in the pool (with a sliding window, from the block of its first query's earliest key on: the
// entries before it are not read). Reads the (small) index tensors on the host, wherever they live.
inline void check_attention_indices(const AttentionShape& s, const at::Tensor& block_tables,
                                    const at::Tensor& seq_lens, const at::Tensor& query_start_loc,
                                    int64_t window) {
  const at::Tensor tables = block_tables.to(at::kCPU).to(at::kLong).contiguous();
  const at::Tensor lens_t = seq_lens.to(at::kCPU).to(at::kLong).contiguous();
  const at::Tensor starts_t = query_start_loc.to(at::kCPU).to(at::kLong).contiguous();
  const int64_t* tab = tables.data_ptr<int64_t>();
  const int64_t* lens = lens_t.data_ptr<int64_t>();
  const int64_t* starts = starts_t.data_ptr<int64_t>();
  TORCH_CHECK(starts[0] >= 0 && starts[s.num_seqs] <= s.num_tokens,
              "chatpage: query_start_loc outside the query rows");
  for (int64_t i = 0; i < s.num_seqs; ++i) {
    const int64_t q_len = starts[i + 1] - starts[i];
    TORCH_CHECK(q_len >= 0 && lens[i] >= q_len, "chatpage: sequence ", i, " has ", q_len,
                " queries but seq_len ", lens[i]);
    if (q_len == 0) continue;
    const int64_t nblk = (lens[i] + s.block_size - 1) / s.block_size;
    TORCH_CHECK(nblk <= s.max_blocks, "chatpage: block_tables too narrow for sequence ", i);
    const int64_t first_key = window > 0 ? std::max<int64_t>(0, lens[i] - q_len - window + 1) : 0;
    for (int64_t b = first_key / s.block_size; b < nblk; ++b) {
      const int64_t blk = tab[i * s.max_blocks + b];
      TORCH_CHECK(blk >= 0 && blk < s.num_blocks, "chatpage: block id ", blk, " out of range");
    }
  }
}

// Every slot of slot_mapping is negative (not stored) or inside the cache.
inline void check_slots(const at::Tensor& slot_mapping, const at::Tensor& k_cache) {
  const at::Tensor slots = slot_mapping.to(at::kCPU).to(at::kLong).contiguous();
  const int64_t* slot = slots.data_ptr<int64_t>();
  const int64_t num_slots = k_cache.size(0) * k_cache.size(1);
  for (int64_t t = 0; t < slots.numel(); ++t) {
    TORCH_CHECK(slot[t] < num_slots, "chatpage: slot ", slot[t], " beyond the cache (", num_slots,
                " slots)");
  }
}

// Bounds check for block ids read from a host-side [N, 2] mapping.
inline void check_block_ids(const int64_t* pairs, int64_t n, int64_t src_blocks, int64_t dst_blocks) {
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(pairs[2 * i] >= 0 && pairs[2 * i] < src_blocks, "chatpage: source block ", pairs[2 * i],
                " out of range [0, ", src_blocks, ")");
    TORCH_CHECK(pairs[2 * i + 1] >= 0 && pairs[2 * i + 1] < dst_blocks, "chatpage: destination block ",
                pairs[2 * i + 1], " out of range [0, ", dst_blocks, ")");
  }
}

// The fused decode-step ops (reference: chatpage/engine/model/fused.py); each backend checks the device.
inline void check_rows(const at::Tensor& t, int64_t rows, int64_t cols, const char* what) {
  TORCH_CHECK(t.dim() >= 2 && t.size(0) == rows && t.numel() == rows * cols,
              "chatpage: ", what, " must hold ", rows, " rows of ", cols, " values, got ", t.sizes());
  TORCH_CHECK(t.is_contiguous(), "chatpage: ", what, " must be contiguous");
}

inline void check_add_rms_norm_args(const at::Tensor& hidden, const c10::optional<at::Tensor>& delta,
                                    const at::Tensor& weight, const at::Tensor& out) {
  TORCH_CHECK(hidden.dim() == 2 && hidden.scalar_type() == at::kFloat && hidden.is_contiguous(),
              "chatpage::add_rms_norm: hidden must be a contiguous float32 [rows, size] tensor");
  const int64_t rows = hidden.size(0), n = hidden.size(1);
  TORCH_CHECK(weight.scalar_type() == at::kFloat && weight.is_contiguous() && weight.numel() == n,
              "chatpage::add_rms_norm: weight must be float32 with ", n, " values");
  check_rows(out, rows, n, "add_rms_norm's out");
  if (delta.has_value()) check_rows(*delta, rows, n, "add_rms_norm's delta");
}

inline void check_rope_qkv_args(const at::Tensor& qkv, const at::Tensor& positions,
                                const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& q,
                                const at::Tensor& k, const at::Tensor& v) {
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
}

inline void check_silu_mul_args(const at::Tensor& gate_up, const at::Tensor& out) {
  TORCH_CHECK(out.dim() == 2, "chatpage::silu_mul: out must be [rows, size]");
  const int64_t rows = out.size(0), n = out.size(1);
  check_rows(gate_up, rows, 2 * n, "silu_mul's gate_up");
  check_rows(out, rows, n, "silu_mul's out");
}

// The few-row matmuls: x [M, K] float32 or bfloat16, weight [N, *] with K inputs, bias [N].
inline void check_gemv_args(const at::Tensor& x, const at::Tensor& weight, int64_t k,
                            const c10::optional<at::Tensor>& bias, const char* op) {
  TORCH_CHECK(x.dim() == 2 && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "chatpage::", op, ": x must be a float32 or bfloat16 [rows, inputs] tensor");
  TORCH_CHECK(weight.dim() == 2 && weight.is_contiguous(), "chatpage::", op,
              ": the weight must be a contiguous 2-d tensor");
  TORCH_CHECK(x.size(1) == k, "chatpage::", op, ": x has ", x.size(1), " inputs, the weight ", k);
  TORCH_CHECK(!bias.has_value() || bias->numel() == weight.size(0), "chatpage::", op,
              ": bias must have one value per output row");
  TORCH_CHECK(x.device().is_cpu() && weight.device().is_cpu(), "chatpage::", op,
              ": every tensor must be on the CPU");
}

// An int8 matrix [N, K] with one bf16 scale per output row.
inline void check_int8_args(const at::Tensor& qweight, const at::Tensor& scales, const char* op) {
  TORCH_CHECK(qweight.scalar_type() == at::kChar, "chatpage::", op, ": qweight must be int8");
  TORCH_CHECK(scales.scalar_type() == at::kBFloat16 && scales.is_contiguous() &&
                  scales.numel() == qweight.size(0),
              "chatpage::", op, ": scales must be bfloat16 with one value per output row");
}

// An int4 matrix in the GEMV's layout: q [N, K/2] uint8, scales and zeros [N, K/group] bf16, and
// optionally its 16 levels (int8).
inline void check_int4_args(const at::Tensor& q, const at::Tensor& scales,
                            const at::Tensor& zeros, const c10::optional<at::Tensor>& levels,
                            int64_t group, const char* op) {
  TORCH_CHECK(!levels.has_value() || (levels->scalar_type() == at::kChar &&
                                      levels->is_contiguous() && levels->numel() == 16 &&
                                      levels->device().is_cpu()),
              "chatpage::", op, ": levels must be 16 contiguous int8 values on the CPU");
  TORCH_CHECK(q.scalar_type() == at::kByte, "chatpage::", op, ": q must be uint8");
  const int64_t n = q.size(0), k = q.size(1) * 2;
  TORCH_CHECK(k % group == 0, "chatpage::", op, ": inputs must be a multiple of ", group);
  for (const at::Tensor* t : {&scales, &zeros})
    TORCH_CHECK(t->scalar_type() == at::kBFloat16 && t->is_contiguous() && t->dim() == 2 &&
                    t->size(0) == n && t->size(1) == k / group,
                "chatpage::", op, ": scales and zeros must be contiguous bfloat16 [", n, ", ",
                k / group, "]");
}

}  // namespace chatpage
