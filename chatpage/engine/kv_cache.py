"""The KV cache tensors: the device block pool and the CPU swap pool, per layer."""

from __future__ import annotations

import torch

from chatpage.engine import attention


def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                    dtype: torch.dtype) -> int:
    """K and V of one block across all layers."""
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * num_layers * block_size * num_kv_heads * head_dim * elem


class KVCache:
    """Per-layer K/V pools ``[num_blocks, block_size, num_kv_heads, head_dim]`` plus swap space."""

    def __init__(self, num_layers: int, num_blocks: int, num_cpu_blocks: int, block_size: int,
                 num_kv_heads: int, head_dim: int, dtype: torch.dtype, device: str) -> None:
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        cpu_shape = (num_cpu_blocks, block_size, num_kv_heads, head_dim)
        # zeros: padded reads of never-written slots must stay finite (masked out, times zero)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        pin = torch.device(device).type == "cuda"
        self.cpu_k = [torch.empty(cpu_shape, dtype=dtype, pin_memory=pin) for _ in range(num_layers)]
        self.cpu_v = [torch.empty(cpu_shape, dtype=dtype, pin_memory=pin) for _ in range(num_layers)]

    @staticmethod
    def _pairs(pairs: list[tuple[int, int]]) -> torch.Tensor:
        return torch.tensor(pairs, dtype=torch.int64).view(-1, 2)

    def copy(self, pairs: list[tuple[int, int]]) -> None:
        """Copy-on-write: block dst becomes a copy of block src in every layer."""
        if pairs:
            attention.copy_blocks(self.k + self.v, self._pairs(pairs))

    def swap_out(self, pairs: list[tuple[int, int]]) -> None:
        if pairs:
            m = self._pairs(pairs)
            for src, dst in zip(self.k + self.v, self.cpu_k + self.cpu_v, strict=True):
                attention.swap_blocks(src, dst, m)

    def swap_in(self, pairs: list[tuple[int, int]]) -> None:
        if pairs:
            m = self._pairs(pairs)
            for src, dst in zip(self.cpu_k + self.cpu_v, self.k + self.v, strict=True):
                attention.swap_blocks(src, dst, m)
