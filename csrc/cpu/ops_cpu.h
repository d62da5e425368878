// CPU implementations of the chatpage ops (registered in csrc/ops.cpp).
#pragma once

#include <ATen/ATen.h>

#include <vector>

namespace chatpage::cpu {

void write_kv(const at::Tensor& key, const at::Tensor& value, const at::Tensor& k_cache,
              const at::Tensor& v_cache, const at::Tensor& slot_mapping);

void paged_attention(const at::Tensor& out, const at::Tensor& query, const at::Tensor& k_cache,
                     const at::Tensor& v_cache, const at::Tensor& block_tables,
                     const at::Tensor& seq_lens, const at::Tensor& query_start_loc, double scale,
                     int64_t window);

void copy_blocks(const std::vector<at::Tensor>& caches, const at::Tensor& src_to_dst);

void swap_blocks(const at::Tensor& src, const at::Tensor& dst, const at::Tensor& mapping);

// csrc/cpu/fused.cpp
void add_rms_norm(const at::Tensor& hidden, const c10::optional<at::Tensor>& delta,
                  const at::Tensor& weight, double eps, const at::Tensor& out);

void rope_qkv(const at::Tensor& qkv, const at::Tensor& positions, const at::Tensor& cos,
              const at::Tensor& sin, const at::Tensor& q, const at::Tensor& k,
              const at::Tensor& v);

void silu_mul(const at::Tensor& gate_up, const at::Tensor& out);

// csrc/cpu/gemv.cpp
at::Tensor gemv_fp32(const at::Tensor& x, const at::Tensor& weight,
                     const c10::optional<at::Tensor>& bias);

at::Tensor gemv_bf16(const at::Tensor& x, const at::Tensor& weight,
                     const c10::optional<at::Tensor>& bias);

at::Tensor gemv_int8(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scales,
                     const c10::optional<at::Tensor>& bias);

at::Tensor gemv_int4(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scales,
                     const at::Tensor& zeros, const c10::optional<at::Tensor>& levels,
                     const c10::optional<at::Tensor>& bias);

// csrc/cpu/gemm.cpp: the same matmuls for many rows (weights as the GEMVs take them); whether
// they run on AMX tiles
bool gemm_amx();
at::Tensor gemm_bf16(const at::Tensor& x, const at::Tensor& weight,
                     const c10::optional<at::Tensor>& bias);

at::Tensor gemm_int8(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scales,
                     const c10::optional<at::Tensor>& bias);

at::Tensor gemm_int4(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scales,
                     const at::Tensor& zeros, const c10::optional<at::Tensor>& levels,
                     const c10::optional<at::Tensor>& bias);

// csrc/cpu/gemm_q8.cpp: the int8 and int4 ones with the activations quantized to int8 blocks and
// summed by AVX-512 VNNI; whether this build has them
bool gemm_q8();
at::Tensor gemm_q8_int8(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scales,
                        const c10::optional<at::Tensor>& bias);

at::Tensor gemm_q8_int4(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scales,
                        const at::Tensor& zeros, const c10::optional<at::Tensor>& levels,
                        const c10::optional<at::Tensor>& bias);
// ... their weights as packs (laid out once) and the same products on packs
at::Tensor q8_pack_int8(const at::Tensor& qweight);
at::Tensor q8_pack_int4(const at::Tensor& q, const at::Tensor& scales, const at::Tensor& zeros);
at::Tensor gemm_q8_int8_packed(const at::Tensor& x, const at::Tensor& pack,
                               const at::Tensor& scales, const c10::optional<at::Tensor>& bias);
at::Tensor gemm_q8_int4_packed(const at::Tensor& x, const at::Tensor& pack,
                               const c10::optional<at::Tensor>& levels,
                               const c10::optional<at::Tensor>& bias);

// csrc/cpu/sample.cpp: a step's picks (greedy, or drawn from the whole vocabulary) and logsumexps
void forbid_tokens(at::Tensor& logits, const at::Tensor& bitmask);
std::tuple<at::Tensor, at::Tensor> sample_rows(const at::Tensor& logits,
                                               const at::Tensor& temperatures,
                                               const at::Tensor& uniforms);

// csrc/cpu/decode.cpp: the decoder layers of a step (weights as the GEMVs above take them; from
// gemm_rows rows on the GEMMs; or q8 packs)
at::Tensor decode_layers(const at::Tensor& hidden, const at::Tensor& positions,
                         const at::Tensor& cos, const at::Tensor& sin, at::TensorList norms,
                         at::TensorList weights, const c10::List<c10::optional<at::Tensor>>& biases,
                         int64_t parts, at::TensorList k_caches, at::TensorList v_caches,
                         const at::Tensor& slot_mapping, const at::Tensor& block_tables,
                         const at::Tensor& seq_lens, const at::Tensor& query_start_loc, double eps,
                         double scale, at::IntArrayRef windows, const at::Tensor& x,
                         const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const at::Tensor& act, const at::Tensor& attn_out,
                         int64_t gemm_rows, bool q8, bool packed);

// csrc/cpu/dequant.cpp: a GGUF tensor's blocks of ggml type type_id -> fp32 out (its rows in
// row_order when given)
void dequantize_gguf(const at::Tensor& blocks, int64_t type_id, const at::Tensor& out,
                     const c10::optional<at::Tensor>& row_order);

// csrc/cpu/quantize.cpp: fp32 weights -> int4 (the GEMV's layout) / int8 per row
void quantize_int4(const at::Tensor& w, const at::Tensor& q4, const at::Tensor& scales,
                   const at::Tensor& zeros);

void quantize_int8(const at::Tensor& w, const at::Tensor& q, const at::Tensor& scales);

}  // namespace chatpage::cpu
