// The decoder layers of a step in one call: every layer's norms, matmuls, RoPE, KV write and
// attention as direct calls of this directory's kernels (a few-row step's; any step's where the
// GEMMs take every row count past the GEMVs': 8-row decode steps of the default model on a Zen 4
// 21.4 -> 20.5 ms).
//
// A batch-1 decode step runs ten small ops per layer. Called one by one from the Python loop each
// costs 2-4 us of interpreter and dispatcher work around a kernel that often runs for less; on the
// default model's 30 layers that was about 1 ms of a 6 ms int4 step. Here the loop is C++ and the
// kernels are plain function calls. Its specification is LlamaModel._python_layers
// (chatpage/engine/model/llama.py): the same kernels in the same order, so the same bits.
//
// Weights come flat: for layer i, linear j (qkv, o, gate_up, down) has `parts` tensors from index
// (4 i + j) * parts: one fp32 or bf16 weight, an int8 weight and its scales, an int4 weight with
// its scales and zeros (the GEMVs' arguments), or those and its levels (parts 4: a model with
// int4 matrices of their own levels; an empty tensor for one without), and bias 4 i + j;
// windows[i] is layer i's sliding window (0: full attention). From gemm_rows rows on (0: never)
// the matmuls take the GEMMs instead of the GEMVs, as the Python loop's Linear does when its
// GEMM starts right after its GEMV (engine/model/weights.py's _by_rows): gemm_bf16, and for int8 and
// int4 the q8 GEMMs (q8) or gemm_int8 / gemm_int4. Then any step runs here, prefill included.
// With packed, every matrix is a q8 pack (gemm_q8.cpp) in 2 parts, the pack and int8's row
// scales or int4's levels (an empty tensor for none), and takes every row count.
#include "cpu/ops_cpu.h"

#include <c10/util/Exception.h>

namespace chatpage::cpu {
namespace {

at::Tensor linear(const at::Tensor& x, at::TensorList weights, int64_t first, int64_t parts,
                  const c10::optional<at::Tensor>& bias, bool gemm, bool q8, bool packed) {
  if (packed) {  // (pack, scales) of int8, (pack, levels or an empty tensor) of int4
    const at::Tensor &pack = weights[first], &second = weights[first + 1];
    if (second.scalar_type() == at::kBFloat16) return gemm_q8_int8_packed(x, pack, second, bias);
    c10::optional<at::Tensor> levels;
    if (second.numel() > 0) levels = second;
    return gemm_q8_int4_packed(x, pack, levels, bias);
  }
  if (parts == 1) {
    const at::Tensor& w = weights[first];
    if (w.scalar_type() != at::kBFloat16) return gemv_fp32(x, w, bias);
    return gemm ? gemm_bf16(x, w, bias) : gemv_bf16(x, w, bias);
  }
  if (parts == 2) {
    const at::Tensor &q = weights[first], &s = weights[first + 1];
    if (!gemm) return gemv_int8(x, q, s, bias);
    return q8 ? gemm_q8_int8(x, q, s, bias) : gemm_int8(x, q, s, bias);
  }
  c10::optional<at::Tensor> levels;
  if (parts == 4 && weights[first + 3].numel() > 0) levels = weights[first + 3];
  const at::Tensor &q = weights[first], &s = weights[first + 1], &z = weights[first + 2];
  if (!gemm) return gemv_int4(x, q, s, z, levels, bias);
  return q8 ? gemm_q8_int4(x, q, s, z, levels, bias) : gemm_int4(x, q, s, z, levels, bias);
}

}  // namespace

at::Tensor decode_layers(const at::Tensor& hidden, const at::Tensor& positions,
                         const at::Tensor& cos, const at::Tensor& sin, at::TensorList norms,
                         at::TensorList weights, const c10::List<c10::optional<at::Tensor>>& biases,
                         int64_t parts, at::TensorList k_caches, at::TensorList v_caches,
                         const at::Tensor& slot_mapping, const at::Tensor& block_tables,
                         const at::Tensor& seq_lens, const at::Tensor& query_start_loc, double eps,
                         double scale, at::IntArrayRef windows, const at::Tensor& x,
                         const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const at::Tensor& act, const at::Tensor& attn_out, int64_t gemm_rows,
                         bool q8, bool packed) {
  const int64_t layers = static_cast<int64_t>(k_caches.size());
  TORCH_CHECK(parts >= 1 && parts <= 4, "chatpage::decode_layers: parts must be ",
              "1 (fp32, bf16), 2 (int8), 3 (int4) or 4 (int4 with levels), got ", parts);
  TORCH_CHECK(layers > 0 && static_cast<int64_t>(v_caches.size()) == layers &&
                  static_cast<int64_t>(norms.size()) == 2 * layers &&
                  static_cast<int64_t>(weights.size()) == 4 * parts * layers &&
                  static_cast<int64_t>(biases.size()) == 4 * layers &&
                  static_cast<int64_t>(windows.size()) == layers,
              "chatpage::decode_layers: for ", layers, " layers expected ", layers,
              " value caches, ", 2 * layers, " norms, ", 4 * parts * layers, " weights and ",
              4 * layers, " biases and ", layers, " windows");
  TORCH_CHECK(gemm_rows == 0 || parts > 1 || weights[0].scalar_type() == at::kBFloat16,
              "chatpage::decode_layers: fp32 weights have no GEMM (gemm_rows must be 0)");
  TORCH_CHECK(!packed || parts == 2, "chatpage::decode_layers: q8 packs take 2 parts per ",
              "matrix (the pack, then int8's scales or int4's levels), got ", parts);
  const bool gemm = gemm_rows > 0 && hidden.size(0) >= gemm_rows;
  const at::Tensor attn_flat = attn_out.view({attn_out.size(0), -1});
  c10::optional<at::Tensor> delta;
  for (int64_t i = 0; i < layers; ++i) {
    auto lin = [&](int64_t j, const at::Tensor& in) {
      return linear(in, weights, (4 * i + j) * parts, parts, biases.get(4 * i + j), gemm, q8,
                    packed);
    };
    add_rms_norm(hidden, delta, norms[2 * i], eps, x);
    rope_qkv(lin(0, x), positions, cos, sin, q, k, v);
    write_kv(k, v, k_caches[i], v_caches[i], slot_mapping);
    paged_attention(attn_out, q, k_caches[i], v_caches[i], block_tables, seq_lens,
                    query_start_loc, scale, windows[i]);
    add_rms_norm(hidden, lin(1, attn_flat.to(x.scalar_type())), norms[2 * i + 1], eps, x);
    silu_mul(lin(2, x), act);
    delta = lin(3, act);
  }
  return *delta;
}

}  // namespace chatpage::cpu
