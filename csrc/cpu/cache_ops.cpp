// KV-cache maintenance on the CPU: write_kv, copy_blocks, swap_blocks.
//
// All three are row copies of contiguous memory (write_kv into an int8 cache quantizes each row
// on the way: attention.py's quantize_kv); they run in parallel only when there are enough bytes
// to make waking the thread pool worth it.
#include "checks.h"
#include "cpu/ops_cpu.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace chatpage::cpu {
namespace {

constexpr int64_t kParallelBytes = 1 << 18;  // below this a single thread copies everything

// Grain (in items of `item_bytes`) that keeps each task above kParallelBytes / 4.
int64_t grain_for(int64_t item_bytes) {
  return std::max<int64_t>(1, (kParallelBytes / 4) / std::max<int64_t>(item_bytes, 1));
}

// One row of d values as an int8 cache row: round(x / scale) for scale = max |x| / 127 rounded
// to fp16 (0 for a row of zeros), the scale's two bytes after the values. Divides, as the
// reference does, so that both give the same bytes.
void quantize_row(const float* x, int64_t d, int8_t* dst) {
  float amax = 0.0f;
  for (int64_t i = 0; i < d; ++i) amax = std::max(amax, std::fabs(x[i]));
  const c10::Half half(amax / 127.0f);
  const float scale = static_cast<float>(half);
  for (int64_t i = 0; i < d; ++i) {
    const float q = scale > 0.0f ? std::nearbyint(x[i] / scale) : 0.0f;
    dst[i] = static_cast<int8_t>(std::clamp(q, -127.0f, 127.0f));
  }
  std::memcpy(dst + d, &half, sizeof(half));
}

void write_kv_int8(const at::Tensor& key, const at::Tensor& value, const at::Tensor& k_cache,
                   const at::Tensor& v_cache, const int64_t* slot) {
  const int64_t tokens = key.size(0), heads = key.size(1), dim = key.size(2);
  const int64_t row = k_cache.size(3);
  auto prepare = [](const at::Tensor& t) {
    const at::Tensor r = t.scalar_type() == at::kFloat ? t : t.to(at::kFloat);
    return r.stride(2) == 1 ? r : r.contiguous();
  };
  const at::Tensor k = prepare(key), v = prepare(value);
  auto* kc = k_cache.data_ptr<int8_t>();
  auto* vc = v_cache.data_ptr<int8_t>();
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  at::parallel_for(0, tokens, grain_for(8 * heads * dim), [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      if (slot[t] < 0) continue;
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t off = (slot[t] * heads + h) * row;
        quantize_row(kp + t * k.stride(0) + h * k.stride(1), dim, kc + off);
        quantize_row(vp + t * v.stride(0) + h * v.stride(1), dim, vc + off);
      }
    }
  });
}

at::Tensor host_pairs(const at::Tensor& pairs) { return pairs.to(at::kCPU).to(at::kLong).contiguous(); }

}  // namespace

void write_kv(const at::Tensor& key, const at::Tensor& value, const at::Tensor& k_cache,
              const at::Tensor& v_cache, const at::Tensor& slot_mapping) {
  check_write_kv_args(key, value, k_cache, v_cache, slot_mapping);
  const int64_t tokens = key.size(0);
  if (tokens == 0) return;
  check_slots(slot_mapping, k_cache);
  const at::Tensor slots = slot_mapping.to(at::kLong).contiguous();
  const int64_t* slot = slots.data_ptr<int64_t>();
  if (k_cache.scalar_type() == at::kChar) return write_kv_int8(key, value, k_cache, v_cache, slot);
  const int64_t heads = key.size(1), dim = key.size(2);
  // Same dtype as the cache and unit stride along head_dim, so that one head is one memcpy.
  auto prepare = [&](const at::Tensor& t) {
    at::Tensor r = t.scalar_type() == k_cache.scalar_type() ? t : t.to(k_cache.scalar_type());
    return r.stride(2) == 1 ? r : r.contiguous();
  };
  const at::Tensor k = prepare(key), v = prepare(value);
  const int64_t elem = k_cache.element_size();
  const int64_t head_bytes = dim * elem, row = heads * dim;
  auto* kc = static_cast<char*>(k_cache.data_ptr());
  auto* vc = static_cast<char*>(v_cache.data_ptr());
  const auto* kp = static_cast<const char*>(k.data_ptr());
  const auto* vp = static_cast<const char*>(v.data_ptr());
  const int64_t ks0 = k.stride(0) * elem, ks1 = k.stride(1) * elem;
  const int64_t vs0 = v.stride(0) * elem, vs1 = v.stride(1) * elem;
  at::parallel_for(0, tokens, grain_for(2 * row * elem), [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      if (slot[t] < 0) continue;
      char* kd = kc + slot[t] * row * elem;
      char* vd = vc + slot[t] * row * elem;
      for (int64_t h = 0; h < heads; ++h) {
        std::memcpy(kd + h * head_bytes, kp + t * ks0 + h * ks1, head_bytes);
        std::memcpy(vd + h * head_bytes, vp + t * vs0 + h * vs1, head_bytes);
      }
    }
  });
}

void copy_blocks(const std::vector<at::Tensor>& caches, const at::Tensor& src_to_dst) {
  check_pairs(src_to_dst);
  const int64_t n = src_to_dst.size(0);
  if (n == 0 || caches.empty()) return;
  const at::Tensor pairs = host_pairs(src_to_dst);
  const int64_t* p = pairs.data_ptr<int64_t>();
  for (const at::Tensor& c : caches) {
    TORCH_CHECK(c.dim() >= 1 && c.is_contiguous(), "chatpage: copy_blocks caches must be contiguous");
    check_block_ids(p, n, c.size(0), c.size(0));
  }
  const int64_t num_caches = static_cast<int64_t>(caches.size());
  const int64_t block_bytes = caches[0].numel() / std::max<int64_t>(caches[0].size(0), 1) *
                              caches[0].element_size();
  at::parallel_for(0, num_caches * n, grain_for(block_bytes), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const at::Tensor& c = caches[i / n];
      const int64_t j = i % n;
      const int64_t bytes = c.stride(0) * c.element_size();
      auto* base = static_cast<char*>(c.data_ptr());
      std::memcpy(base + p[2 * j + 1] * bytes, base + p[2 * j] * bytes, bytes);
    }
  });
}

void swap_blocks(const at::Tensor& src, const at::Tensor& dst, const at::Tensor& mapping) {
  check_swap_args(src, dst, mapping);
  TORCH_CHECK(src.is_cpu() && dst.is_cpu(), "chatpage: CPU swap_blocks needs two CPU pools");
  const int64_t n = mapping.size(0);
  if (n == 0) return;
  const at::Tensor pairs = host_pairs(mapping);
  const int64_t* p = pairs.data_ptr<int64_t>();
  check_block_ids(p, n, src.size(0), dst.size(0));
  const int64_t bytes = src.stride(0) * src.element_size();
  const auto* s = static_cast<const char*>(src.data_ptr());
  auto* d = static_cast<char*>(dst.data_ptr());
  at::parallel_for(0, n, grain_for(bytes), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) std::memcpy(d + p[2 * i + 1] * bytes, s + p[2 * i] * bytes, bytes);
  });
}

}  // namespace chatpage::cpu
