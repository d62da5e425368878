// CUDA implementations of the chatpage ops: check and prepare the tensors, then call the plain
// launch functions of csrc/cuda/*.cu on the current stream. Built only when torch has CUDA.
#include "checks.h"
#include "cuda/kernels.h"

#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <initializer_list>
#include <vector>

namespace chatpage::cuda {
namespace {

DType dtype_of(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return DType::kFloat32;
    case at::kHalf: return DType::kFloat16;
    case at::kBFloat16: return DType::kBFloat16;
    case at::kChar: return DType::kInt8;
    default: break;
  }
  TORCH_CHECK(false, "chatpage: unsupported CUDA dtype ", t);
}

void check(int code) { TORCH_CHECK(code == 0, "chatpage CUDA: ", error_string(code)); }

void* current_stream() { return c10::cuda::getCurrentCUDAStream().stream(); }

// While a CUDA graph is captured (chatpage/engine/model/cuda_graphs.py) nothing may copy to the host:
// the index checks, which read block tables and slots back, are skipped (the engine's own block
// manager wrote those indices; a replay runs no host code at all).
bool capturing() {
  return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
}

at::Tensor on_device_as(const at::Tensor& t, const at::Tensor& like, at::ScalarType dtype) {
  return t.to(like.device(), dtype).contiguous();
}

void paged_attention_cuda(const at::Tensor& out, const at::Tensor& query, const at::Tensor& k_cache,
                          const at::Tensor& v_cache, const at::Tensor& block_tables,
                          const at::Tensor& seq_lens, const at::Tensor& query_start_loc,
                          double scale, int64_t window) {
  const AttentionShape shape =
      check_attention_args(out, query, k_cache, v_cache, block_tables, seq_lens, query_start_loc);
  TORCH_CHECK(query.is_cuda() && out.device() == query.device() && k_cache.device() == query.device(),
              "chatpage: query, out and caches must be on the same CUDA device");
  TORCH_CHECK(shape.head_dim <= 256, "chatpage: head_dim above 256 is not supported on CUDA");
  TORCH_CHECK(window >= 0, "chatpage: window must be 0 (none) or positive, got ", window);
  if (!capturing()) check_attention_indices(shape, block_tables, seq_lens, query_start_loc, window);
  const c10::cuda::CUDAGuard guard(query.device());
  const at::Tensor tables = on_device_as(block_tables, query, at::kInt);
  const at::Tensor lens = on_device_as(seq_lens, query, at::kInt);
  const at::Tensor starts = on_device_as(query_start_loc, query, at::kInt);

  // The kernel reads queries and writes outputs in the cache dtype or in fp32.
  const at::ScalarType io = query.scalar_type() == k_cache.scalar_type() ? k_cache.scalar_type() : at::kFloat;
  at::Tensor q = query.to(io);
  if (q.stride(2) != 1) q = q.contiguous();
  const bool direct = out.scalar_type() == io && out.stride(2) == 1;
  at::Tensor o = direct ? out : out.to(io).contiguous();

  AttentionParams p{};
  p.out = o.data_ptr();
  p.out_row_stride = o.stride(0);
  p.out_head_stride = o.stride(1);
  p.query = q.data_ptr();
  p.q_row_stride = q.stride(0);
  p.q_head_stride = q.stride(1);
  p.k_cache = k_cache.data_ptr();
  p.v_cache = v_cache.data_ptr();
  p.block_tables = tables.data_ptr<int32_t>();
  p.seq_lens = lens.data_ptr<int32_t>();
  p.query_start_loc = starts.data_ptr<int32_t>();
  p.num_tokens = static_cast<int>(shape.num_tokens);
  p.num_seqs = static_cast<int>(shape.num_seqs);
  p.num_q_heads = static_cast<int>(shape.num_q_heads);
  p.num_kv_heads = static_cast<int>(shape.num_kv_heads);
  p.head_dim = static_cast<int>(shape.head_dim);
  p.block_size = static_cast<int>(shape.block_size);
  p.max_blocks = static_cast<int>(tables.size(1));
  p.scale = static_cast<float>(scale);
  p.window = static_cast<int>(window);
  p.cache_dtype = dtype_of(k_cache.scalar_type());
  p.io_dtype = dtype_of(io);
  const AttentionPlan plan = plan_paged_attention(p, query.get_device());
  at::Tensor workspace;
  if (plan.workspace_floats > 0) {
    workspace = at::empty({plan.workspace_floats}, q.options().dtype(at::kFloat));
    p.workspace = workspace.data_ptr<float>();
  }
  check(paged_attention(p, plan, current_stream()));
  if (!direct) out.copy_(o);
}

void write_kv_cuda(const at::Tensor& key, const at::Tensor& value, const at::Tensor& k_cache,
                   const at::Tensor& v_cache, const at::Tensor& slot_mapping) {
  check_write_kv_args(key, value, k_cache, v_cache, slot_mapping);
  TORCH_CHECK(k_cache.is_cuda() && key.device() == k_cache.device() && value.device() == k_cache.device(),
              "chatpage: key, value and caches must be on the same CUDA device");
  if (!capturing()) check_slots(slot_mapping, k_cache);
  const c10::cuda::CUDAGuard guard(k_cache.device());
  // an int8 cache is written from fp32 rows (quantized by the kernel)
  const bool int8 = k_cache.scalar_type() == at::kChar;
  auto prepare = [&](const at::Tensor& t) {
    at::Tensor r = t.to(int8 ? at::kFloat : k_cache.scalar_type());
    return r.stride(2) == 1 ? r : r.contiguous();
  };
  const at::Tensor k = prepare(key), v = prepare(value);
  const at::Tensor slots = on_device_as(slot_mapping, k_cache, at::kLong);
  check(write_kv(k.data_ptr(), v.data_ptr(), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                 k_cache.data_ptr(), v_cache.data_ptr(), slots.data_ptr<int64_t>(),
                 static_cast<int>(k.size(0)), static_cast<int>(k.size(1)),
                 static_cast<int>(k.size(2)), dtype_of(k_cache.scalar_type()), current_stream()));
}

void copy_blocks_cuda(const std::vector<at::Tensor>& caches, const at::Tensor& src_to_dst) {
  check_pairs(src_to_dst);
  if (caches.empty() || src_to_dst.size(0) == 0) return;
  const at::Tensor host = src_to_dst.to(at::kCPU).to(at::kLong).contiguous();
  const int64_t n = host.size(0);
  std::vector<int64_t> ptrs, bytes;
  for (const at::Tensor& c : caches) {
    TORCH_CHECK(c.is_cuda() && c.device() == caches[0].device() && c.is_contiguous() && c.dim() >= 1,
                "chatpage: copy_blocks caches must be contiguous and on one CUDA device");
    check_block_ids(host.data_ptr<int64_t>(), n, c.size(0), c.size(0));
    ptrs.push_back(reinterpret_cast<int64_t>(c.data_ptr()));
    bytes.push_back(c.stride(0) * c.element_size());
  }
  const c10::cuda::CUDAGuard guard(caches[0].device());
  const auto opts = at::TensorOptions().dtype(at::kLong);
  const at::Tensor d_ptrs = at::tensor(ptrs, opts).to(caches[0].device());
  const at::Tensor d_bytes = at::tensor(bytes, opts).to(caches[0].device());
  const at::Tensor d_pairs = host.to(caches[0].device());
  check(copy_blocks(d_ptrs.data_ptr<int64_t>(), d_bytes.data_ptr<int64_t>(),
                    static_cast<int>(caches.size()), d_pairs.data_ptr<int64_t>(), static_cast<int>(n),
                    current_stream()));
}

void swap_blocks_cuda(const at::Tensor& src, const at::Tensor& dst, const at::Tensor& mapping) {
  check_swap_args(src, dst, mapping);
  TORCH_CHECK(src.is_cuda() || dst.is_cuda(), "chatpage: CUDA swap_blocks needs a CUDA pool");
  if (mapping.size(0) == 0) return;
  const at::Tensor host = mapping.to(at::kCPU).to(at::kLong).contiguous();
  check_block_ids(host.data_ptr<int64_t>(), host.size(0), src.size(0), dst.size(0));
  const c10::cuda::CUDAGuard guard(src.is_cuda() ? src.device() : dst.device());
  check(swap_blocks(src.data_ptr(), dst.data_ptr(), src.stride(0) * src.element_size(),
                    host.data_ptr<int64_t>(), static_cast<int>(host.size(0)), !dst.is_cuda(),
                    current_stream()));
}

void check_on_device(std::initializer_list<const at::Tensor*> tensors, const at::Tensor& like,
                     const char* op) {
  for (const at::Tensor* t : tensors)
    TORCH_CHECK(t->is_cuda() && t->device() == like.device(), "chatpage::", op,
                ": every tensor must be on the same CUDA device");
}

void add_rms_norm_cuda(const at::Tensor& hidden, const c10::optional<at::Tensor>& delta,
                       const at::Tensor& weight, double eps, const at::Tensor& out) {
  check_add_rms_norm_args(hidden, delta, weight, out);
  check_on_device({&hidden, &weight, &out}, hidden, "add_rms_norm");
  if (delta.has_value()) check_on_device({&*delta}, hidden, "add_rms_norm");
  const c10::cuda::CUDAGuard guard(hidden.device());
  check(add_rms_norm(hidden.data_ptr<float>(), delta.has_value() ? delta->data_ptr() : nullptr,
                     dtype_of(delta.has_value() ? delta->scalar_type() : at::kFloat),
                     weight.data_ptr<float>(), static_cast<float>(eps), out.data_ptr(),
                     dtype_of(out.scalar_type()), static_cast<int>(hidden.size(0)),
                     static_cast<int>(hidden.size(1)), current_stream()));
}

void rope_qkv_cuda(const at::Tensor& qkv, const at::Tensor& positions, const at::Tensor& cos,
                   const at::Tensor& sin, const at::Tensor& q, const at::Tensor& k,
                   const at::Tensor& v) {
  check_rope_qkv_args(qkv, positions, cos, sin, q, k, v);
  check_on_device({&qkv, &positions, &cos, &sin, &q, &k, &v}, qkv, "rope_qkv");
  const c10::cuda::CUDAGuard guard(qkv.device());
  check(rope_qkv(qkv.data_ptr(), dtype_of(qkv.scalar_type()), positions.data_ptr<int64_t>(),
                 cos.data_ptr<float>(), sin.data_ptr<float>(), cos.size(0), q.data_ptr<float>(),
                 k.data_ptr<float>(), v.data_ptr<float>(), static_cast<int>(qkv.size(0)),
                 static_cast<int>(q.size(1)), static_cast<int>(k.size(1)),
                 static_cast<int>(q.size(2)), current_stream()));
}

void silu_mul_cuda(const at::Tensor& gate_up, const at::Tensor& out) {
  check_silu_mul_args(gate_up, out);
  check_on_device({&gate_up, &out}, out, "silu_mul");
  const c10::cuda::CUDAGuard guard(out.device());
  check(silu_mul(gate_up.data_ptr(), dtype_of(gate_up.scalar_type()), out.data_ptr(),
                 dtype_of(out.scalar_type()), static_cast<int>(out.size(0)),
                 static_cast<int>(out.size(1)), current_stream()));
}

}  // namespace
}  // namespace chatpage::cuda

TORCH_LIBRARY_IMPL(chatpage, CUDA, m) {
  m.impl("write_kv", &chatpage::cuda::write_kv_cuda);
  m.impl("paged_attention", &chatpage::cuda::paged_attention_cuda);
  m.impl("copy_blocks", &chatpage::cuda::copy_blocks_cuda);
  m.impl("swap_blocks", &chatpage::cuda::swap_blocks_cuda);
  m.impl("add_rms_norm", &chatpage::cuda::add_rms_norm_cuda);
  m.impl("rope_qkv", &chatpage::cuda::rope_qkv_cuda);
  m.impl("silu_mul", &chatpage::cuda::silu_mul_cuda);
}
