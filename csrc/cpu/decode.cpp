// The decoder layers of a few-row step in one call: every layer's norms, matmuls, RoPE, KV write
// and attention as direct calls of this directory's kernels.
//
// A batch-1 decode step runs ten small ops per layer. Called one by one from the Python loop each
// costs 2-4 us of interpreter and dispatcher work around a kernel that often runs for less; on the
// default model's 30 layers that was about 1 ms of a 6 ms int4 step. Here the loop is C++ and the
// kernels are plain function calls. Its specification is LlamaModel._python_layers
// (chatpage/engine/models/llama.py): the same kernels in the same order, so the same bits.
//
// Weights come flat: for layer i, linear j (qkv, o, gate_up, down) has `parts` tensors from index
// (4 i + j) * parts: one fp32 or bf16 weight, an int8 weight and its scales, an int4 weight with
// its scales and zeros (the GEMVs' arguments), or those and its levels (parts 4: a model with
// int4 matrices of their own levels; an empty tensor for one without), and bias 4 i + j;
// windows[i] is layer i's sliding window (0: full attention).
#include "cpu/ops_cpu.h"

#include <c10/util/Exception.h>

namespace chatpage::cpu {
namespace {

at::Tensor linear(const at::Tensor& x, at::TensorList weights, int64_t first, int64_t parts,
                  const c10::optional<at::Tensor>& bias) {
  if (parts == 1) {
    const at::Tensor& w = weights[first];
    return w.scalar_type() == at::kBFloat16 ? gemv_bf16(x, w, bias) : gemv_fp32(x, w, bias);
  }
  if (parts == 2) return gemv_int8(x, weights[first], weights[first + 1], bias);
  c10::optional<at::Tensor> levels;
  if (parts == 4 && weights[first + 3].numel() > 0) levels = weights[first + 3];
  return gemv_int4(x, weights[first], weights[first + 1], weights[first + 2], levels, bias);
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
                         const at::Tensor& act, const at::Tensor& attn_out) {
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
  const at::Tensor attn_flat = attn_out.view({attn_out.size(0), -1});
  c10::optional<at::Tensor> delta;
  for (int64_t i = 0; i < layers; ++i) {
    auto lin = [&](int64_t j, const at::Tensor& in) {
      return linear(in, weights, (4 * i + j) * parts, parts, biases.get(4 * i + j));
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
