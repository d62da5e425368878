// CPU implementations of the chatpage ops (registered in csrc/ops.cpp).
#pragma once

#include <ATen/ATen.h>

#include <vector>

namespace chatpage::cpu {

void write_kv(const at::Tensor& key, const at::Tensor& value, const at::Tensor& k_cache,
              const at::Tensor& v_cache, const at::Tensor& slot_mapping);

void paged_attention(const at::Tensor& out, const at::Tensor& query, const at::Tensor& k_cache,
                     const at::Tensor& v_cache, const at::Tensor& block_tables,
                     const at::Tensor& seq_lens, const at::Tensor& query_start_loc, double scale);

void copy_blocks(const std::vector<at::Tensor>& caches, const at::Tensor& src_to_dst);

void swap_blocks(const at::Tensor& src, const at::Tensor& dst, const at::Tensor& mapping);

}  // namespace chatpage::cpu
