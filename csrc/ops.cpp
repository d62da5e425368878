// The chatpage op library: one schema registration for every backend, plus the CPU kernels.
// The CUDA kernels register themselves in csrc/cuda/torch_binding.cpp when CUDA is built.
//
// Python calls them as torch.ops.chatpage.<op> (see chatpage/engine/model/attention.py, whose reference_*
// functions are the specification).
#include "cpu/ops_cpu.h"

#include <torch/library.h>

TORCH_LIBRARY(chatpage, m) {
  m.def(
      "write_kv(Tensor key, Tensor value, Tensor(a!) k_cache, Tensor(b!) v_cache, "
      "Tensor slot_mapping) -> ()");
  m.def(
      "paged_attention(Tensor(a!) out, Tensor query, Tensor k_cache, Tensor v_cache, "
      "Tensor block_tables, Tensor seq_lens, Tensor query_start_loc, float scale, "
      "int window=0) -> ()");
  m.def("copy_blocks(Tensor(a!)[] caches, Tensor src_to_dst) -> ()");
  m.def("swap_blocks(Tensor src, Tensor(a!) dst, Tensor mapping) -> ()");
  // The decode step's fused small ops (chatpage/engine/model/fused.py is their reference).
  m.def(
      "add_rms_norm(Tensor(a!) hidden, Tensor? delta, Tensor weight, float eps, "
      "Tensor(b!) out) -> ()");
  m.def(
      "rope_qkv(Tensor qkv, Tensor positions, Tensor cos, Tensor sin, Tensor(a!) q, "
      "Tensor(b!) k, Tensor(c!) v) -> ()");
  m.def("silu_mul(Tensor gate_up, Tensor(a!) out) -> ()");
  // Few-row matmuls x @ W.T against fp32, bf16, int8 and int4 weights (chatpage/engine/model/gemv.py is
  // their reference; int4's optional levels: the matrix's 16 levels, int8, else q - 8); CPU only.
  m.def("gemv_fp32(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
  m.def("gemv_bf16(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
  m.def("gemv_int8(Tensor x, Tensor qweight, Tensor scales, Tensor? bias) -> Tensor");
  m.def(
      "gemv_int4(Tensor x, Tensor q, Tensor scales, Tensor zeros, Tensor? levels, Tensor? bias) "
      "-> Tensor");
  // The same matmuls for many rows (bf16, int8 and int4 weights in the GEMVs' layouts, the same
  // references; on AMX tiles where the build has them and the OS grants them: gemm_amx, and then
  // int4's decoded weights are rounded to bf16); CPU only.
  m.def("gemm_amx() -> bool", &chatpage::cpu::gemm_amx);  // no tensors: one kernel for all
  m.def("gemm_bf16(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
  m.def("gemm_int8(Tensor x, Tensor qweight, Tensor scales, Tensor? bias) -> Tensor");
  m.def(
      "gemm_int4(Tensor x, Tensor q, Tensor scales, Tensor zeros, Tensor? levels, Tensor? bias) "
      "-> Tensor");
  // The same int8 and int4 matmuls with the activations quantized to int8 per block of 32 inputs
  // and summed by AVX-512 VNNI (gemv.py's reference_q8_int8 / reference_q8_int4); gemm_q8: whether
  // this build has them. CPU only.
  m.def("gemm_q8() -> bool", &chatpage::cpu::gemm_q8);
  m.def("gemm_q8_int8(Tensor x, Tensor qweight, Tensor scales, Tensor? bias) -> Tensor");
  m.def(
      "gemm_q8_int4(Tensor x, Tensor q, Tensor scales, Tensor zeros, Tensor? levels, "
      "Tensor? bias) -> Tensor");
  // Their weights laid out once (a pack, made at load for matrices of a multiple of 32 rows) and
  // the same products on packs: the kernels' order of the same bytes, so the same bits.
  m.def("q8_pack_int8(Tensor qweight) -> Tensor");
  m.def("q8_pack_int4(Tensor q, Tensor scales, Tensor zeros) -> Tensor");
  m.def("gemm_q8_int8_packed(Tensor x, Tensor pack, Tensor scales, Tensor? bias) -> Tensor");
  m.def("gemm_q8_int4_packed(Tensor x, Tensor pack, Tensor? levels, Tensor? bias) -> Tensor");
  // Per row of fp32 logits: the greedy pick (temperature 0) or a draw from the whole vocabulary
  // at its temperature with its uniform, and the row's logsumexp; a pick of -1 for a row that is
  // not finite (chatpage/engine/sample/sampler.py's torch code is the reference). CPU only.
  m.def("sample_rows(Tensor logits, Tensor temperatures, Tensor uniforms) -> (Tensor, Tensor)");
  // fp32 logits [N, V] set to -inf in place where their bit in an int32 bitmask [N, ceil(V/32)]
  // (token 32 w + b: bit b of word w) is 0 (chatpage/engine/sample/constraints.py's forbid is
  // the reference). CPU only.
  m.def("forbid_tokens(Tensor(a!) logits, Tensor bitmask) -> ()");
  // A GGUF tensor's blocks of ggml type type_id dequantized into out (fp32, blocks' values in
  // order, or row i from the file's row row_order[i]; chatpage/engine/load/dequant.py is the
  // reference). CPU only.
  m.def(
      "dequantize_gguf(Tensor blocks, int type_id, Tensor(a!) out, Tensor? row_order=None) "
      "-> ()");
  // fp32 weights packed as int4 (the GEMV's layout) and int8 (chatpage/engine/model/weights.py's
  // quantize_int4 + gemv.pack_int4 and quantize_int8 are the references). CPU only.
  m.def("quantize_int4(Tensor w, Tensor(a!) q4, Tensor(b!) scales, Tensor(c!) zeros) -> ()");
  m.def("quantize_int8(Tensor w, Tensor(a!) q, Tensor(b!) scales) -> ()");
  // A step's decoder layers in one call (LlamaModel._python_layers is its reference); returns the
  // last layer's MLP output, which the final norm adds to hidden; windows: each layer's sliding
  // window (0: full attention); from gemm_rows rows on (0: never) the GEMMs (q8: the q8 ones for
  // int8 and int4); packed: every matrix is a q8 pack, which takes every row count. CPU only.
  m.def(
      "decode_layers(Tensor(a!) hidden, Tensor positions, Tensor cos, Tensor sin, "
      "Tensor[] norms, Tensor[] weights, Tensor?[] biases, int parts, Tensor(b!)[] k_caches, "
      "Tensor(c!)[] v_caches, Tensor slot_mapping, Tensor block_tables, Tensor seq_lens, "
      "Tensor query_start_loc, float eps, float scale, int[] windows, Tensor(d!) x, "
      "Tensor(e!) q, Tensor(f!) k, Tensor(g!) v, Tensor(h!) act, Tensor(i!) attn_out, "
      "int gemm_rows=0, bool q8=False, bool packed=False) -> Tensor");
}

TORCH_LIBRARY_IMPL(chatpage, CPU, m) {
  m.impl("write_kv", &chatpage::cpu::write_kv);
  m.impl("paged_attention", &chatpage::cpu::paged_attention);
  m.impl("copy_blocks", &chatpage::cpu::copy_blocks);
  m.impl("swap_blocks", &chatpage::cpu::swap_blocks);
  m.impl("add_rms_norm", &chatpage::cpu::add_rms_norm);
  m.impl("rope_qkv", &chatpage::cpu::rope_qkv);
  m.impl("silu_mul", &chatpage::cpu::silu_mul);
  m.impl("gemv_fp32", &chatpage::cpu::gemv_fp32);
  m.impl("gemv_bf16", &chatpage::cpu::gemv_bf16);
  m.impl("gemv_int8", &chatpage::cpu::gemv_int8);
  m.impl("gemv_int4", &chatpage::cpu::gemv_int4);
  m.impl("gemm_bf16", &chatpage::cpu::gemm_bf16);
  m.impl("gemm_int8", &chatpage::cpu::gemm_int8);
  m.impl("gemm_int4", &chatpage::cpu::gemm_int4);
  m.impl("gemm_q8_int8", &chatpage::cpu::gemm_q8_int8);
  m.impl("gemm_q8_int4", &chatpage::cpu::gemm_q8_int4);
  m.impl("q8_pack_int8", &chatpage::cpu::q8_pack_int8);
  m.impl("q8_pack_int4", &chatpage::cpu::q8_pack_int4);
  m.impl("gemm_q8_int8_packed", &chatpage::cpu::gemm_q8_int8_packed);
  m.impl("gemm_q8_int4_packed", &chatpage::cpu::gemm_q8_int4_packed);
  m.impl("decode_layers", &chatpage::cpu::decode_layers);
  m.impl("sample_rows", &chatpage::cpu::sample_rows);
  m.impl("forbid_tokens", &chatpage::cpu::forbid_tokens);
  m.impl("dequantize_gguf", &chatpage::cpu::dequantize_gguf);
  m.impl("quantize_int4", &chatpage::cpu::quantize_int4);
  m.impl("quantize_int8", &chatpage::cpu::quantize_int8);
}
